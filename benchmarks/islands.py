"""Annealing islands on a local Dask cluster against one sa process, same wall budget.

For each seed, interleaved: ``sa`` in this process (numba on every core), then
``islands`` on a local cluster of ``--workers`` processes (one numba thread each; the
cluster is started once, outside the budgets). Prints each run's step time, its gap to
the lower bound and its evaluations, then the paired ratios islands / sa.

Run: python benchmarks/islands.py [--graph nmt] [--cluster k80x4] [--seconds 60] [--seeds 3]
"""

from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graph", default="nmt")
    ap.add_argument("--cluster", default="k80x4")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()

    from placetool.costmodel import CostModel, presets
    from placetool.search import Budget, Problem, run
    from placetool.search.sweeps.sweep import connect_dask

    problem = Problem(CostModel(presets.load_graph(a.graph), presets.load_cluster(a.cluster)))
    lb = problem.lower_bound_us()
    client, cluster = connect_dask(dask=True, workers=a.workers)
    rows = []
    try:
        run("islands", problem, Budget(evals=64), client=client, epochs=1)  # workers compile and cache
        for seed in range(a.seeds):
            for method, opts in (("sa", {}), ("islands", {"client": client})):
                t0 = time.perf_counter()
                r = run(method, problem, Budget(seconds=a.seconds), seed=seed, **opts)
                rows.append((seed, method, r.step_time_us, r.evaluations, time.perf_counter() - t0,
                             r.metadata.get("workers", 1)))
    finally:
        client.close()
        cluster.close()
    print(f"{a.graph}/{a.cluster}, {a.seconds:g} s each, lower bound {lb / 1e3:.1f} ms, "
          f"islands on {a.workers} local workers")
    print(f"{'seed':>4} {'method':<8} {'step ms':>9} {'x bound':>8} {'evals':>8} {'wall s':>7} {'workers':>7}")
    for seed, m, step, ev, wall, w in rows:
        print(f"{seed:>4} {m:<8} {step / 1e3:>9.1f} {step / lb:>8.3f} {ev:>8,} {wall:>7.1f} {w:>7}")
    ratios = [b[2] / s[2] for s, b in zip(rows[::2], rows[1::2])]
    print(f"islands / sa, paired by seed: median {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
