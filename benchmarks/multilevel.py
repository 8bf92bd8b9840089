"""Multilevel search against sa and heft on a large graph, at a short budget, over seeds.

    python benchmarks/multilevel.py                          # gnmt8 / k40x8, 10 s, seeds 0,1,2
    python benchmarks/multilevel.py --seconds 5 --seeds 0    # quicker
    python benchmarks/multilevel.py --graph synthetic-10k --cluster k80x4
    python benchmarks/multilevel.py --json                   # {"rows": [...], "summary": {...}}

Every method runs on one Problem with ``--seconds`` of search budget once per seed
(``heft`` is deterministic and runs once, with no deadline, as ``placetool search``
runs it). Per run: the step time, its ratio to the lower bound
(:mod:`placetool.search.bounds`), fine evaluations and seconds; per method the median
over seeds and the spread (max - min), and for multilevel which stage found its best.
Seconds are search seconds as the tracker counts them (numba's compiling left out);
run it on a quiet machine, since the budget is wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

DETERMINISTIC = {"heft", "critical-path", "m-topo", "m-etf", "m-sct", "single", "expert"}


def run_one(problem, method, seconds, seed):
    from placetool.search import Budget, run

    t0 = time.perf_counter()
    r = run(method, problem, Budget(seconds=seconds), seed=seed)
    return {"method": method, "seed": seed, "step_ms": r.step_time_us / 1e3, "feasible": bool(r.feasible),
            "lower_bound_ms": r.lower_bound_us / 1e3, "ratio": r.step_time_us / r.lower_bound_us,
            "evaluations": int(r.evaluations), "seconds": float(r.seconds), "wall": time.perf_counter() - t0,
            "best_from": r.metadata.get("best_from")}


def summarise(rows):
    out = {}
    for m in dict.fromkeys(r["method"] for r in rows):
        steps = [r["step_ms"] for r in rows if r["method"] == m]
        out[m] = {"median_ms": statistics.median(steps), "spread_ms": max(steps) - min(steps),
                  "median_ratio": statistics.median(r["ratio"] for r in rows if r["method"] == m), "runs": len(steps)}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", default="gnmt8")
    ap.add_argument("--cluster", default="k40x8")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--methods", default="multilevel,sa,heft")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from placetool.costmodel import CostModel, presets
    from placetool.search import Problem

    problem = Problem(CostModel(presets.load_graph(args.graph), presets.load_cluster(args.cluster)))
    problem.lower_bounds()  # computed once, outside every run's clock
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    rows = []
    for m in [x.strip() for x in args.methods.split(",") if x.strip()]:
        for s in seeds[:1] if m in DETERMINISTIC else seeds:
            rows.append(run_one(problem, m, args.seconds, s))
            if not args.json:
                r = rows[-1]
                print(f"{r['method']:<12} seed {r['seed']}  {r['step_ms']:9.1f} ms  x{r['ratio']:.3f} LB  "
                      f"{'fits' if r['feasible'] else 'OOM '}  {r['evaluations']:6d} evals  {r['seconds']:6.1f} s"
                      + (f"  best from {r['best_from']}" if r["best_from"] else ""), flush=True)
    summary = summarise(rows)
    if args.json:
        print(json.dumps({"graph": args.graph, "cluster": args.cluster, "seconds": args.seconds, "rows": rows,
                          "summary": summary}, indent=1))
        return
    print(f"\n{args.graph} / {args.cluster}, {args.seconds:g} s, lower bound {rows[0]['lower_bound_ms']:.1f} ms")
    print(f"{'method':<12} {'median ms':>10} {'spread ms':>10} {'x LB':>7} {'runs':>5}")
    for m, s in summary.items():
        print(f"{m:<12} {s['median_ms']:10.1f} {s['spread_ms']:10.1f} {s['median_ratio']:7.3f} {s['runs']:5d}")


if __name__ == "__main__":
    main()
