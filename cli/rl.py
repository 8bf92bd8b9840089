"""``placetool rl``: train placement policies outside a single search.

``placetool rl pretrain --graphs nmt,inception_v3 --clusters k80x4 --out policy/`` trains
one policy (GDP by default) on every graph x cluster pair at once and saves it;
``placetool search --method rl --init-from policy/`` then fine-tunes it on another graph,
or with ``--budget-evals 1`` places it zero-shot (the greedy placement).
"""

from __future__ import annotations

import time

import click

from placetool.costmodel.errors import UserError

from .common import check_writable, emit_json, fmt_us, json_option


def _names(values) -> list[str]:
    out = []
    for v in values:
        out += [s.strip() for s in v.split(",") if s.strip()]
    return out


@click.group()
def rl():
    """Reinforcement-learning placers (seq2seq, hierarchical, GDP)."""


@rl.command()
@click.option("--graphs", "-g", multiple=True, required=True,
              help="Graphs to train on (names or paths; comma-separated or repeated).")
@click.option("--clusters", "-c", multiple=True, default=("k80x4",), show_default=True,
              help="Clusters (gdp: any sizes up to 16 devices; other policies: one device count).")
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False), help="Folder to save the policy in.")
@click.option("--policy", default="gdp", show_default=True, help="seq2seq, hierarchical or gdp.")
@click.option("--steps", type=int, default=None, help="Training steps (each samples every graph).")
@click.option("--seconds", type=float, default=120.0, show_default=True, help="Time budget.")
@click.option("--samples", type=int, default=32, show_default=True, help="Placements per graph and step.")
@click.option("--per-step", "per_step", type=click.IntRange(min=1), default=None,
              help="Problems (graph x cluster) sampled per step, in rotation (default: all).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--logdir", type=click.Path(file_okay=False), default=None, help="TensorBoard scalars and checkpoints.")
@json_option
def pretrain(graphs, clusters, out, policy, steps, seconds, samples, per_step, seed, logdir, as_json):
    """Train one policy on several graphs at once and save it to OUT.

    The per-problem residual logits are off here, so everything the policy learns is in
    weights that transfer to graphs it has not seen.
    """
    from placetool.costmodel import CostModel, presets
    from placetool.search.base import Problem

    check_writable(out.rstrip("/"))  # its parent must exist; OUT itself is created
    graphs, clusters = _names(graphs), _names(clusters)
    problems = []
    for c in clusters:
        cl = presets.load_cluster(c)
        for g in graphs:
            problems.append(Problem(CostModel(presets.load_graph(g), cl)))
    nd = {p.n_devices for p in problems}
    if len(nd) > 1 and policy != "gdp":
        raise UserError(f"rl pretrain: clusters {', '.join(clusters)} have different device counts {sorted(nd)}; "
                        f"a policy places on one number of devices")
    if steps is not None and steps < 1:
        raise UserError(f"rl pretrain: --steps must be >= 1, got {steps}")
    from placetool.rl import policies
    from placetool.rl.tfutil import set_seed, tf
    from placetool.rl.trainer import TrainConfig, Trainer

    tf()
    set_seed(seed)
    pol = policies.make(policy, max(nd), seed=seed, residual=False)
    # without residual tables only the network learns: give it a larger step size
    cfg = TrainConfig(samples=samples, lr=1e-3, baseline="loo", tasks_per_step=per_step)
    t0 = time.perf_counter()

    def progress(step, out_):
        if not as_json and step % 10 == 0:
            click.echo(f"step {step:5d}  {time.perf_counter() - t0:7.1f} s  mean step {fmt_us(out_.get('mean_step_us', float('nan')))}"
                       f"  entropy {out_.get('entropy', float('nan')):.3f}", err=True)

    if logdir:  # each run in its own subfolder, as search --method rl does
        from placetool.rl.method import run_folder

        logdir = str(run_folder(logdir, f"pretrain-{policy}-s{seed}"))
    trainer = Trainer(pol, problems, cfg, seed=seed, logdir=logdir, progress=progress)
    summary = trainer.train(steps=steps, seconds=None if steps else seconds)
    greedy = {}
    for t in trainer.tasks:
        a = pol.assignment(t.atoms, pol.greedy(t.obs))[0]
        greedy[f"{t.problem.graph.name}@{t.problem.cluster.name}"] = float(t.problem.cost_model.simulate(a).step_time_us)
    summary["greedy_step_us"] = greedy
    summary["recipe"] = {"graphs": graphs, "clusters": clusters, "policy": policy, "steps": steps,
                         "seconds": seconds if not steps else None, "samples": samples, "per_step": per_step,
                         "seed": seed}
    trainer.policy.save(out, extra=summary)
    result = {"out": out, "policy": policy, **summary}
    if as_json:
        emit_json(result)
        return
    click.echo(f"saved {policy} policy to {out} after {summary['steps']} steps, {summary['samples']} samples, "
               f"{summary['seconds']:.1f} s")
    for k, v in greedy.items():
        click.echo(f"  {k:<30} greedy {fmt_us(v)}")
