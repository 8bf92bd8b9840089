"""Sweep throughput: runs per minute for a grid of short searches, side by side on
one process (a loop, no pool), the local process pool and a local Dask cluster.

Each runner starts cold (its pool or LocalCluster is started inside the timing, as a
user of `placetool sweep` sees it) and writes every run to a fresh SQLite store.

    .venv/bin/python benchmarks/sweep_throughput.py [--seeds 8] [--workers 2] [--evals 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from placetool.search.sweeps.store import ResultStore
from placetool.search.sweeps.sweep import cpu_count, parse_sweep, run_one, run_sweep


def grid(seeds: int, evals: int):
    return parse_sweep({"sweep": {
        "graphs": ["synthetic-200", "synthetic-1k"], "clusters": ["k80x4"],
        "methods": ["single", "round-robin", "random"], "seeds": list(range(seeds)), "budget_evals": evals,
    }}, Path("throughput.toml"))


def in_process(sw, db) -> dict:
    """The baseline: every run in this process, one after another."""
    t0 = time.perf_counter()
    ok = 0
    with ResultStore(db) as st:
        for r in sw.runs():
            rec = run_one(r)
            st.put(rec)
            ok += rec["status"] == "ok"
    return {"ran": len(sw), "ok": ok, "seconds": time.perf_counter() - t0}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--evals", type=int, default=64, help="evaluation budget of each run")
    ap.add_argument("--workers", type=int, default=cpu_count())
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    sw = grid(a.seeds, a.evals)
    run_one(sw.runs()[0])  # load numba's cache and the graphs' imports once in this process
    rows = []
    with tempfile.TemporaryDirectory() as d:
        base = in_process(sw, Path(d) / "loop.db")
        rows.append({"runner": "one process (loop)", "workers": 1, **base})
        for name, kw in (("process pool", {}), ("Dask LocalCluster", {"dask": True})):
            with ResultStore(Path(d) / f"{name.split()[0]}.db") as st:
                s = run_sweep(sw, st, workers=a.workers, **kw)
            rows.append({"runner": name, "workers": a.workers, "ran": s["ran"], "ok": s["ok"],
                         "seconds": s["seconds"]})
    for r in rows:
        r["runs_per_minute"] = 60 * r["ran"] / r["seconds"]
        r["vs_loop"] = r["runs_per_minute"] / rows[0]["runs_per_minute"]
    out = {"grid": f"2 graphs x 1 cluster x 3 methods x {a.seeds} seeds = {len(sw)} runs, budget {a.evals} evals",
           "cores": cpu_count(), "rows": rows}
    if a.json:
        print(json.dumps(out, indent=2))
        return
    print(out["grid"], f"({out['cores']} cores)")
    print(f"{'runner':<20} {'workers':>7} {'runs':>5} {'ok':>4} {'seconds':>8} {'runs/min':>9} {'vs loop':>8}")
    for r in rows:
        print(f"{r['runner']:<20} {r['workers']:>7} {r['ran']:>5} {r['ok']:>4} {r['seconds']:>8.2f} "
              f"{r['runs_per_minute']:>9.0f} {r['vs_loop']:>7.2f}x")


if __name__ == "__main__":
    main()
