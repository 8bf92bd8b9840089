"""``placetool rl``: train placement policies outside a single search.

``placetool rl pretrain -g nmt,inception_v3 -c k80x4 -o policy/`` trains
one policy (GDP by default) on every graph x cluster pair at once and saves it;
``placetool search --method rl --init-from policy/`` then fine-tunes it on another graph,
or with ``--budget-evals 1`` places it zero-shot (the greedy placement).
"""

from __future__ import annotations

import math
import time

import click

from placetool.costmodel.errors import UserError

from .common import (budget_options, check_writable, cluster_option, emit_json, fmt_us, graph_option,
                     json_option, notes_compiles, option, out_option, quiet_option)


def _names(values) -> list[str]:
    out = []
    for v in values:
        out += [s.strip() for s in v.split(",") if s.strip()]
    return out


@click.group()
def rl():
    """Reinforcement-learning placers (seq2seq, hierarchical, GDP)."""


@rl.command()
@graph_option(multiple=True, required=True, name="graphs", old=("--graphs",),
              help="Graphs to train on (names or paths; repeatable, or comma-separated).")
@cluster_option(multiple=True, name="clusters", old=("--clusters",),
                help="Clusters (gdp: any sizes up to 16 devices; other policies: one device count); "
                     "repeatable, or comma-separated.")
@out_option("Folder to save the policy in.", required=True, folder=True)
@click.option("--policy", default="gdp", show_default=True,
              help="seq2seq, hierarchical or gdp; or rule: the dispatching rule of `search --method dispatch` "
                   "(no TensorFlow; --samples rules per generation).")
@budget_options(seconds_help="Stop after this many seconds (default 120 when no budget is given).",
                evals_help="Stop after this many simulated placements (samples x graphs per step).",
                seconds_old=("--seconds",))
@option("--steps", "steps", type=click.IntRange(min=1), default=None, hidden=True,
        help="Training steps (each samples every graph); prefer --budget-evals.")
@click.option("--samples", type=click.IntRange(min=2), default=32, show_default=True,
              help="Placements per graph and step.")
@click.option("--per-step", "per_step", type=click.IntRange(min=1), default=None,
              help="Problems (graph x cluster) sampled per step, in rotation (default: all).")
@click.option("--rules", type=click.IntRange(min=1), default=3, show_default=True,
              help="--policy rule: how many rules the portfolio may hold besides HEFT.")
@click.option("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--logdir", type=click.Path(file_okay=False), default=None, help="TensorBoard scalars and checkpoints.")
@click.option("--force", is_flag=True, help="Replace a policy already saved in OUT.")
@json_option
@quiet_option
@notes_compiles
def pretrain(graphs, clusters, out, policy, budget_seconds, budget_evals, steps, samples, per_step, rules, seed,
             logdir, force, as_json, quiet):
    """Train one policy on several graphs at once and save it to OUT.

    The per-problem residual logits are off here, so everything the policy learns is in
    weights that transfer to graphs it has not seen. A policy already in OUT is kept
    (an error before any work) unless ``--force`` is given.
    """
    from pathlib import Path

    from placetool.costmodel import CostModel, presets
    from placetool.rl.policies import POLICIES  # no TensorFlow yet
    from placetool.search import Problem

    if policy not in POLICIES and policy != "rule":  # before the graphs load and TensorFlow starts (7-9 s)
        raise UserError(f"rl pretrain: --policy {policy!r}: unknown policy (known: {', '.join(POLICIES)}, rule)")
    check_writable(out, "--out", folder=True)
    if not force and any((Path(out) / f).exists() for f in ("policy.json", "weights.npz")):
        # a pre-trained policy may have taken hours: replacing it is asked for, not assumed
        raise UserError(f"rl pretrain: {out} already holds a saved policy; give --force to replace it, "
                        f"or another --out")
    check_writable(logdir, "--logdir", folder=True)
    graphs, clusters = _names(graphs), _names(clusters)
    if not graphs:
        raise UserError("rl pretrain: --graph names no graph")
    if not clusters:
        raise UserError("rl pretrain: --cluster names no cluster")
    if budget_seconds is None and budget_evals is None and steps is None:
        budget_seconds = 120.0
    problems = []
    for c in clusters:
        cl = presets.load_cluster(c)
        for g in graphs:
            problems.append(Problem(CostModel(presets.load_graph(g), cl)))
    recipe = {"graphs": graphs, "clusters": clusters, "policy": policy, "steps": steps, "seconds": budget_seconds,
              "evals": budget_evals, "samples": samples, "per_step": per_step, "seed": seed}
    if policy == "rule":
        return _pretrain_rule(problems, out, {**recipe, "rules": rules}, as_json, quiet)
    nd = {p.n_devices for p in problems}
    if len(nd) > 1 and policy != "gdp":
        raise UserError(f"rl pretrain: clusters {', '.join(clusters)} have different device counts {sorted(nd)}; "
                        f"a policy places on one number of devices")
    from placetool.rl import policies
    from placetool.rl.tfutil import set_seed, tf
    from placetool.rl.trainer import TrainConfig, Trainer

    tf()
    set_seed(seed)
    pol = policies.make(policy, max(nd), seed=seed, residual=False)
    # without residual tables only the network learns: give it a larger step size
    cfg = TrainConfig.from_options({"samples": samples, "lr": 1e-3, "baseline": "loo", "tasks_per_step": per_step})
    t0 = time.perf_counter()

    def progress(step, out_):
        if not (as_json or quiet) and step % 10 == 0:
            click.echo(f"step {step:5d}  {time.perf_counter() - t0:7.1f} s  mean step {fmt_us(out_.get('mean_step_us', float('nan')))}"
                       f"  entropy {out_.get('entropy', float('nan')):.3f}", err=True)

    if logdir:  # each run in its own subfolder, as search --method rl does
        from placetool.rl.method import run_folder

        logdir = str(run_folder(logdir, f"pretrain-{policy}-s{seed}"))
    trainer = Trainer(pol, problems, cfg, seed=seed, logdir=logdir, progress=progress)
    done = None if budget_evals is None else (lambda: trainer.samples_seen >= budget_evals)
    try:
        summary = trainer.train(steps=steps, seconds=budget_seconds, done=done)
    except (KeyboardInterrupt, SystemExit):
        # Ctrl-C or SIGTERM: keep what was learnt (the exit status still says interrupted)
        if trainer.step_no > 0:
            trainer.policy.save(out, extra={**trainer.summary(), "interrupted": True})
            click.echo(f"placetool: saved the {policy} policy trained so far ({trainer.step_no} steps) to {out}",
                       err=True)
        raise
    if summary["steps"] == 0:
        raise UserError("rl pretrain: the budget ended before the first training step; nothing saved")
    greedy = {}
    for t in trainer.tasks:
        a = pol.assignment(t.atoms, pol.greedy(t.obs))[0]
        greedy[f"{t.problem.graph.name}@{t.problem.cluster.name}"] = float(t.problem.cost_model.simulate(a).step_time_us)
    summary["greedy_step_us"] = greedy
    summary["recipe"] = recipe
    trainer.policy.save(out, extra=summary)
    result = {"out": out, "policy": policy, **summary}
    if as_json:
        emit_json(result)
        return
    click.echo(f"saved {policy} policy to {out} after {summary['steps']} steps, {summary['samples']} samples, "
               f"{summary['seconds']:.1f} s")
    for k, v in greedy.items():
        click.echo(f"  {k:<30} greedy {fmt_us(v)}")


def _pretrain_rule(problems, out, recipe, as_json, quiet):
    """``rl pretrain --policy rule``: the portfolio of :mod:`placetool.rl.rule`."""
    from placetool.rl.rule import pretrain as pretrain_rules
    from placetool.search.dispatch import TERMS, write_rules

    t0 = time.perf_counter()

    def progress(rule, gen, s):
        if not (as_json or quiet):
            click.echo(f"rule {rule} generation {gen:4d}  {time.perf_counter() - t0:7.1f} s  portfolio "
                       f"{math.exp(s['score']):.4f}x HEFT's step time (geometric mean over {s['problems']} problems)",
                       err=True)

    w, summary = pretrain_rules(problems, rules=recipe["rules"], seconds=recipe["seconds"], evals=recipe["evals"],
                                generations=recipe["steps"], population=recipe["samples"], seed=recipe["seed"],
                                progress=progress)
    path = write_rules(out, w, {"training": summary, "recipe": recipe})
    result = {"out": str(out), "policy": "rule", **summary, "rules_kept": summary["rules"],
              "rules": [dict(zip(TERMS, row)) for row in w.tolist()]}
    if as_json:
        emit_json(result)
        return
    click.echo(f"saved {len(w)} dispatching rules to {path} after {summary['evaluations']} placements, "
               f"{summary['seconds']:.1f} s: with HEFT, {summary['vs_heft']:.4f}x HEFT's step time "
               f"(geometric mean over {summary['problems']} problems)")
    for i, row in enumerate(w.tolist(), 1):
        click.echo(f"  rule {i}: " + ", ".join(f"{k} {v:.4f}" for k, v in zip(TERMS, row)))
