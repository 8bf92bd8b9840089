"""Incremental (delta) simulation vs a full re-simulation, for single-group moves.

    python benchmarks/incremental.py                    # table
    python benchmarks/incremental.py --moves 200 --json

For each graph (synthetic-10k and synthetic-50k on k80x4 by default) and each base
placement — ``chunks`` (groups cut in topological order into one contiguous run per
GPU, pinned ones on the CPU: a sensible placement that annealing would start from) and
``random`` (every group on a random allowed device: transfer-heavy) — the same random
moves (one group to another device it may use) are scored by each method in turn:

- ``full``: ``CostModel.simulate`` of the moved placement (what annealing would do
  without the delta simulator);
- ``incr``: ``IncrementalSimulator.evaluate_move`` (restore the last checkpoint before
  the first affected event, simulate on, stop once the run re-joins the base run);
- ``incr-nostop``: the same without the early stop (restore + simulate to the end).

Every incremental answer is checked against the full one (step time, peak memory,
feasibility). Each method is then timed over all the moves back to back, as annealing
calls it, in ``--rounds`` rounds of rotating order (medians; the speedup's range over
rounds beside it). Timing move by move instead, interleaved, charged whichever method
ran right after a full simulation for the caches that run had evicted. Times are CPU
seconds of this process (``process_time``; everything here is single-threaded), so
other load on the machine inflates them less. Also printed:
how far into the step the restarts were on average (``restart@``: checkpoint time /
step time), how many moves stopped early, and the one-off cost of simulating a base
with checkpoints (``base ms``, paid again after each accepted move in annealing).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def chunks_assignment(problem) -> np.ndarray:
    """Groups in topological order, cut into one run of equal compute per GPU."""
    g, cl = problem.graph, problem.cluster
    gpus = np.flatnonzero(np.array([d.kind == "gpu" for d in cl.devices]))
    a = np.argmax(problem.allowed, axis=1).astype(np.int32)
    if gpus.size == 0:
        return a
    first = np.full(problem.n_groups, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, g.group, g.topo_rank.astype(np.int64))
    order = np.argsort(first, kind="stable")
    t = np.where(problem.allowed, problem.group_time, np.inf).min(axis=1)[order]
    cut = np.minimum((np.cumsum(t) / t.sum() * gpus.size).astype(int), gpus.size - 1)
    want = gpus[cut]
    ok = problem.allowed[order, want]
    a[order[ok]] = want[ok]
    return a


def bench(graph: str, cluster: str, base: str, moves: int, seed: int, rounds: int = 3) -> dict:
    from placetool.costmodel import CostModel, presets
    from placetool.costmodel.incremental import IncrementalSimulator
    from placetool.search import Problem

    cm = CostModel(presets.load_graph(graph), presets.load_cluster(cluster))
    pr = Problem(cm)
    rng = np.random.default_rng(seed)
    a = chunks_assignment(pr) if base == "chunks" else pr.random_assignment(rng)
    t = time.process_time()
    inc = IncrementalSimulator(cm, a)
    first_base = time.process_time() - t
    t = time.process_time()
    inc.set_base(a)
    base_s = time.process_time() - t
    nostop = IncrementalSimulator(cm, a, converge=False)
    movable = np.flatnonzero(pr.allowed.sum(axis=1) >= 2)
    # warm up every code path once (numba compiles on first call)
    g0 = movable[0]
    inc.evaluate_move(g0, np.flatnonzero(pr.allowed[g0] & (np.arange(pr.n_devices) != a[g0]))[0])
    cm.simulate(a)

    mv = []
    for _ in range(moves):
        g = int(movable[rng.integers(movable.size)])
        others = np.flatnonzero(pr.allowed[g] & (np.arange(pr.n_devices) != a[g]))
        mv.append((g, int(others[rng.integers(others.size)])))

    def full(g, d):
        b = a.copy()
        b[g] = d
        return cm.simulate(b)

    # every answer checked equal to the full simulation (untimed)
    restart, stopped = [], 0
    for g, d in mv:
        ref = full(g, d)
        r = inc.evaluate_move(g, d)
        for x in (r, nostop.evaluate_move(g, d)):
            if not (x.step_time_us == ref.step_time_us and np.array_equal(x.peak_memory_bytes, ref.peak_memory_bytes)
                    and x.feasible == ref.feasible):
                raise AssertionError(f"{graph}/{base}: incremental != full for group {g} -> device {d}")
        restart.append(r.restored_at_us / max(inc.base_step_us, 1e-9))
        stopped += r.converged
    # timed in blocks, each method over all the moves back to back as annealing calls it
    # (timing them move by move, interleaved, charged whichever ran right after a full
    # simulation with its cold caches), rounds in rotating order; per round the mean
    fns = {"full": full, "incr": inc.evaluate_move, "nostop": nostop.evaluate_move}
    per = {k: [] for k in fns}
    names = list(fns)
    for rnd in range(rounds):
        for k in names[rnd % 3:] + names[: rnd % 3]:
            t = time.process_time()
            for g, d in mv:
                fns[k](g, d)
            per[k].append((time.process_time() - t) / len(mv))
    tf, ti, tn = (np.array(per[k]) for k in names)
    full_ms, inc_ms, nostop_ms = (1e3 * float(np.median(x)) for x in (tf, ti, tn))
    return {
        "graph": graph, "cluster": cluster, "base": base, "ops": cm.graph.n_ops, "groups": pr.n_groups,
        "moves": moves, "checkpoints": inc.n_ck,
        "full_ms": full_ms, "incr_ms": inc_ms, "incr_nostop_ms": nostop_ms,
        "speedup": full_ms / inc_ms, "speedup_nostop": full_ms / nostop_ms,
        "speedup_range": [float((tf / ti).min()), float((tf / ti).max())], "rounds": rounds,
        "restart_at": float(np.mean(restart)), "stopped_early": stopped / moves,
        "base_ms": 1e3 * base_s, "first_base_ms": 1e3 * first_base, "all_equal": True,
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", nargs="+", default=["synthetic-10k", "synthetic-50k"])
    ap.add_argument("--cluster", default="k80x4")
    ap.add_argument("--bases", nargs="+", default=["chunks", "random"], choices=["chunks", "random"])
    ap.add_argument("--moves", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per method (medians reported)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = [bench(g, args.cluster, b, args.moves, args.seed, args.rounds) for g in args.graphs for b in args.bases]
    if args.json:
        print(json.dumps({"rows": rows}))
        return
    hdr = (f"{'graph':<14} {'base':<7} {'moves':>5} {'full ms':>8} {'incr ms':>8} {'speedup':>7} {'range':>11} "
           f"{'nostop ms':>9} {'speedup':>7} {'restart@':>8} {'stopped':>7} {'base ms':>8}")
    print(f"cluster {args.cluster}; ms = CPU ms per move, median of {args.rounds} rounds (range: speedup's min-max "
          "over rounds); every answer checked equal to the full simulation")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(f"{r['graph']:<14} {r['base']:<7} {r['moves']:>5} {r['full_ms']:>8.2f} {r['incr_ms']:>8.2f} "
              f"{r['speedup']:>6.2f}x {r['speedup_range'][0]:>5.2f}-{r['speedup_range'][1]:.2f}x {r['incr_nostop_ms']:>9.2f} "
              f"{r['speedup_nostop']:>6.2f}x {r['restart_at']:>8.2f} {r['stopped_early']:>7.0%} {r['base_ms']:>8.1f}")


if __name__ == "__main__":
    main()
