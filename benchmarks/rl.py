"""RL placers against simulated annealing at the same wall time, and the shipped policy zero-shot.

    python benchmarks/rl.py                                     # the full table: 4 instances x 300 s
    python benchmarks/rl.py --instances synthetic-1k/k80x4,nmt/k80x4 --seconds 60
    python benchmarks/rl.py --instances '' --transfer inception_v3/k80x4,transformer/k40x8
    python benchmarks/rl.py --json

Search table, one row per instance (graph/cluster), both methods run one after the other
in the same process with the same ``--seconds`` budget and seed:

- warm start: the best cheap placement rl (and sa) start from, and its name;
- rl at T s: ``placetool search --method rl`` (gdp on every group) — its best, its ratio to
  the warm start, *where the best came from* (``warm start NAME``, ``policy at step N``,
  ``compound move off the policy's mode at step N`` or, fine-tuning, ``the policy's
  winning samples of step N, merged``), new bests by origin (JSON:
  ``rl_improvements``), its steps and samples/s;
- sa at T s: simulated annealing (incremental simulator), its best and evaluations/s;
- rl / sa: below 1.0 rl won.

Transfer table (``--transfer``, held-out graphs of the bundled policy by default): the
pre-trained policy placed zero-shot (one evaluation: its greedy placement, and the wall
time of the whole call, TensorFlow start-up excluded; where that placement runs out of
memory, also ``zero_shot=True`` with up to 10 evaluations, which fits it), fine-tuned for ``--finetune``
seconds (with ``--rl-options``), and sa for the same seconds.

Timings on a shared machine vary with its load; compare rows of one run, not across runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from placetool.search import Budget, Problem, run

INSTANCES = ("nmt/k80x4", "inception_v3/k80x4", "gnmt4/k40x8", "transformer/k40x8")
HELD_OUT = ("inception_v3/k80x4", "gnmt8/k40x8", "transformer/k40x8")


def search_row(instance: str, seconds: float, seed: int, rl_opts: dict) -> dict:
    p = Problem.preset(instance)
    t = time.perf_counter()
    r = run("rl", p, Budget(seconds=seconds), seed=seed, **rl_opts)
    rl_wall = time.perf_counter() - t
    m = r.metadata
    t = time.perf_counter()
    s = run("sa", p, Budget(seconds=seconds), seed=seed)
    sa_wall = time.perf_counter() - t
    return {"instance": instance, "ops": p.graph.n_ops, "groups": p.n_groups, "seconds": seconds,
            "warm_start": m.get("warm_start"), "warm_start_us": m.get("warm_start_us"),
            "rl_us": r.step_time_us, "rl_vs_warm": m.get("vs_warm_start"), "rl_source": m.get("source"),
            "rl_improvements": m.get("improvements"), "rl_steps": m.get("steps"), "rl_evals": r.evaluations,
            "rl_samples_per_s": r.evaluations / rl_wall,
            "sa_us": s.step_time_us, "sa_evals": s.evaluations, "sa_evals_per_s": s.evaluations / sa_wall,
            "rl_vs_sa": r.step_time_us / s.step_time_us}


def transfer_row(instance: str, policy: str, finetune: float, seed: int, rl_opts: dict) -> dict:
    p = Problem.preset(instance)
    t = time.perf_counter()
    z = run("rl", p, Budget(evals=1), seed=seed, init_from=policy)
    zero_wall = time.perf_counter() - t
    row = {"instance": instance, "ops": p.graph.n_ops, "zero_shot_us": z.step_time_us, "zero_shot_s": zero_wall,
           "zero_shot_feasible": z.feasible}
    if not z.feasible:
        t = time.perf_counter()
        zf = run("rl", p, Budget(evals=10), seed=seed, init_from=policy, zero_shot=True)
        row.update({"fitted_us": zf.step_time_us, "fitted_feasible": zf.feasible, "fitted_evals": zf.evaluations,
                    "fitted_s": time.perf_counter() - t})
    if finetune > 0:
        f = run("rl", p, Budget(seconds=finetune), seed=seed, init_from=policy, **rl_opts)
        s = run("sa", p, Budget(seconds=finetune), seed=seed)
        row.update({"finetuned_us": f.step_time_us, "finetuned_source": f.metadata.get("source"),
                    "sa_us": s.step_time_us, "zero_shot_vs_sa": z.step_time_us / s.step_time_us,
                    "finetuned_vs_sa": f.step_time_us / s.step_time_us})
        if "fitted_us" in row:
            row["fitted_vs_sa"] = row["fitted_us"] / s.step_time_us
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--instances", default=",".join(INSTANCES), help="graph/cluster,... ('' skips the search table)")
    ap.add_argument("--seconds", type=float, default=300.0, help="budget of rl and sa per instance")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rl-options", default="{}", help="JSON of extra rl options (e.g. '{\"ppo_epochs\": 3}')")
    ap.add_argument("--transfer", default="", help=f"held-out graph/cluster,... for the pre-trained policy "
                                                   f"(e.g. {','.join(HELD_OUT)})")
    ap.add_argument("--policy", default="gdp", help="pre-trained policy: a folder or a bundled name")
    ap.add_argument("--finetune", type=float, default=60.0, help="fine-tune / sa seconds in the transfer table")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from placetool.rl.tfutil import tf

    tf()  # TensorFlow's start-up is not charged to the first instance
    # nor the compilation of the simulators and schedulers (numba) to the first method run
    warm = Problem.preset("synthetic-200/k80x4")
    for m in ("sa", "rl"):
        run(m, warm, Budget(evals=300), seed=0)
    rows, trows = [], []
    rl_opts = json.loads(a.rl_options)
    for inst in [s for s in a.instances.split(",") if s]:
        print(f"{inst}: rl and sa, {a.seconds:g} s each ...", file=sys.stderr)
        rows.append(search_row(inst, a.seconds, a.seed, rl_opts))
    for inst in [s for s in a.transfer.split(",") if s]:
        print(f"{inst}: zero-shot, fine-tune and sa {a.finetune:g} s ...", file=sys.stderr)
        trows.append(transfer_row(inst, a.policy, a.finetune, a.seed, rl_opts))
    if a.json:
        print(json.dumps({"seconds": a.seconds, "search": rows, "transfer": trows}, default=float, indent=1))
        return 0
    if rows:
        print(f"{'instance':<20} {'warm start':>22} {'rl (µs)':>10} {'vs warm':>8} {'sa (µs)':>10} {'rl/sa':>6} "
              f"{'rl samples/s':>12} {'sa evals/s':>10}  source of rl's best")
        for r in rows:
            ws = f"{r['warm_start']} {r['warm_start_us']:.0f}" if r["warm_start_us"] else "-"
            vs = f"{r['rl_vs_warm']:.3f}" if r["rl_vs_warm"] else "-"
            print(f"{r['instance']:<20} {ws:>22} {r['rl_us']:>10.1f} {vs:>8} {r['sa_us']:>10.1f} {r['rl_vs_sa']:>6.3f} "
                  f"{r['rl_samples_per_s']:>12.1f} {r['sa_evals_per_s']:>10.1f}  {r['rl_source']}")
    if trows:
        # "fits": whether the zero-shot placement fits in memory (an infeasible one still has
        # a simulated step time, which alone would read as a result)
        print(f"\n{'held-out instance':<20} {'zero-shot (µs)':>14} {'fits':>4} {'time (s)':>8} {'fine-tuned':>11} "
              f"{'sa':>10} {'zero/sa':>8} {'tuned/sa':>8}")
        for r in trows:
            ft = f"{r['finetuned_us']:>11.1f} {r['sa_us']:>10.1f} {r['zero_shot_vs_sa']:>8.3f} {r['finetuned_vs_sa']:>8.3f}" \
                if "sa_us" in r else ""
            fits = "yes" if r["zero_shot_feasible"] else "no"
            print(f"{r['instance']:<20} {r['zero_shot_us']:>14.1f} {fits:>4} {r['zero_shot_s']:>8.2f} {ft}")
            if "fitted_us" in r:
                vs = f", {r['fitted_vs_sa']:.3f}x sa" if "fitted_vs_sa" in r else ""
                fits = "fits" if r["fitted_feasible"] else "still out of memory"
                print(f"{'':<20} fitted into memory (zero_shot=true): {r['fitted_us']:.1f} µs, {fits}, "
                      f"{r['fitted_evals']} evaluations, {r['fitted_s']:.2f} s{vs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
