"""Proven optima: how large a problem ``exact`` proves, and how far the searchers stop from it.

    python benchmarks/exact.py                                  # 16-32 groups, 3 devices, seeds 0-2, 60 s
    python benchmarks/exact.py --sizes 24,28,32 --seeds 0 --seconds 30
    python benchmarks/exact.py --searchers sa:5000,rl:5000      # NAME:EVALUATIONS, "" for none
    python benchmarks/exact.py --probe-depth 0                  # groups in fixed order, no probing
    python benchmarks/exact.py --incumbent-share 0              # no sa incumbent: nodes independent of speed
    python benchmarks/exact.py --schedule-share 0               # the tree's bounds alone, no CP-SAT
    python benchmarks/exact.py --json

Instances are the tests' random DAGs (``tests/test_search_exact.py::random_problem``):
one op per group, 1-3 inputs from earlier ops, op times 5-40 µs scaled per device by
0.5-2x, tensors of 100-2000 bytes on links of 5 µs + 20 bytes/µs, so a transfer (10-105
µs) costs more than most ops. Per instance: whether ``exact`` proved the optimum within
``--seconds`` (its first 5% goes to an ``sa`` incumbent, ``--incumbent-share``), its wall time, tree nodes,
simulated leaves and remaining gap (with the schedule bound of CP-SAT, its status and
seconds); then each searcher's step time relative to the best
``exact`` found (1.000 = the optimum where proven) at a fixed number of evaluations.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from testhelpers import helpers

from placetool.search import Budget, run

random_problem = helpers.random_problem


def parse_searchers(text: str) -> list[tuple[str, int]]:
    out = []
    for item in filter(None, text.split(",")):
        name, _, evals = item.partition(":")
        out.append((name, int(evals or 1000)))
    return out


def row(n: int, devices: int, seed: int, seconds: float, searchers, probe_depth=None,
        incumbent_share: float = 0.05, schedule_share: float = 0.3) -> dict:
    p = random_problem(n, devices, seed, latency=5.0, bandwidth=20.0, hetero=True)
    t = time.perf_counter()
    ex = run("exact", p, Budget(seconds=seconds), seed=0, incumbent_share=incumbent_share, probe_depth=probe_depth,
             schedule_share=schedule_share)
    m = ex.metadata
    out = {"groups": n, "devices": devices, "seed": seed, "status": m["status"], "seconds": time.perf_counter() - t,
           "nodes": m["nodes"], "leaves": m["leaves"], "gap": m["gap"], "best_us": ex.step_time_us,
           "bound_us": m["bound_us"], "lower_bound_us": ex.lower_bound_us,
           "schedule_bound_us": m.get("schedule_bound_us"), "schedule": m.get("schedule"),
           "schedule_seconds": m.get("schedule_seconds"), "searchers": {}}
    for name, evals in searchers:
        r = run(name, p, Budget(evals=evals), seed=0)
        out["searchers"][f"{name}:{evals}"] = r.step_time_us / ex.step_time_us
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="16,20,24,28,32", help="groups per instance, comma-separated")
    ap.add_argument("--devices", type=int, default=3)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--seconds", type=float, default=60.0, help="exact's time limit per instance")
    ap.add_argument("--searchers", default="sa:5000,tpe:300,rl:5000")
    ap.add_argument("--probe-depth", type=int, default=None,
                    help="tree levels that try every free group first (default: all, up to 64 groups; 0: fixed order)")
    ap.add_argument("--incumbent-share", type=float, default=0.05,
                    help="share of the time limit for the sa incumbent (0: the seeding methods' best only, "
                         "so tree nodes do not depend on the machine's speed)")
    ap.add_argument("--schedule-share", type=float, default=0.3,
                    help="share of the time limit for the schedule bound (CP-SAT; 0: off)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    searchers = parse_searchers(a.searchers)
    rows = []
    for n in map(int, a.sizes.split(",")):
        for s in map(int, a.seeds.split(",")):
            rows.append(row(n, a.devices, s, a.seconds, searchers, a.probe_depth, a.incumbent_share,
                            a.schedule_share))
            if not a.json:
                r = rows[-1]
                ratios = "  ".join(f"{k} {v:.3f}" for k, v in r["searchers"].items())
                gap = "" if r["status"] == "optimal" else f" gap {r['gap']:.1%}"
                sb = "" if r["schedule_bound_us"] is None else \
                    f", schedule bound {r['schedule_bound_us']:.1f} {r['schedule']} in {r['schedule_seconds']:.1f} s"
                print(f"{n:3d} groups seed {s}: {r['status']:8s}{gap} {r['seconds']:6.1f} s  "
                      f"{r['nodes']:>10,} nodes {r['leaves']:>8,} leaves  best {r['best_us']:.1f} µs  "
                      f"(lower bound {r['lower_bound_us']:.1f}{sb})  {ratios}", flush=True)
    if a.json:
        print(json.dumps({"rows": rows}, indent=1))
    else:
        for n in map(int, a.sizes.split(",")):
            rs = [r for r in rows if r["groups"] == n]
            proven = [r for r in rs if r["status"] == "optimal"]
            print(f"{n} groups: {len(proven)} of {len(rs)} proven"
                  + (f", median {sorted(r['seconds'] for r in proven)[len(proven) // 2]:.1f} s" if proven else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
