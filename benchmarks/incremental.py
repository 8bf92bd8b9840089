"""Incremental (delta) simulation vs a full re-simulation, for single-group moves.

    python benchmarks/incremental.py                    # table
    python benchmarks/incremental.py --moves 200 --json
    python benchmarks/incremental.py --annealer 10      # on the calls of a real sa run
    python benchmarks/incremental.py --annealer 10 --bound   # how much of those moves' runs change

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

``--annealer SECONDS`` measures on annealing's own calls instead: an ``sa`` run of that
long (from its usual starting point, seed ``--seed``) is recorded (each batch of moves
and compound moves it scores, each accepted move it commits, each restart) and replayed
four ways, timed in blocks (wall time): full simulations one by one and the incremental
simulator on one thread (per core), the batch simulator and the incremental simulator
on every core (what ``mode="batch"`` and ``mode="incremental"`` do).

``--annealer SECONDS --bound`` times nothing: it traces the recorded moves and the
placement each moves from, and counts the events (ops and transfers) whose device or
times differ. An exact incremental engine must handle at least those, so events / changed
events bounds its speed-up over full runs (``bound``); ``no early stop`` bounds one that
restarts at the first changed event and runs to the end.
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


class _Recorder:
    """An ``IncrementalSimulator`` that logs what annealing asks of it, to replay later."""

    log: list = []
    real = None  # the class it stands in for

    def __init__(self, cost_model, assignment, **kw):
        self._inc = self.real(cost_model, assignment, **kw)
        self.log.append(("base", np.array(assignment, np.int32)))

    def __getattr__(self, name):
        return getattr(self._inc, name)

    def set_base(self, a):
        self.log.append(("base", np.array(a, np.int32)))
        self._inc.set_base(a)

    def commit(self, a):
        self.log.append(("commit", np.array(a, np.int32)))
        self._inc.commit(a)

    def evaluate_many(self, moves):
        self.log.append(("batch", [m.copy() if isinstance(m, np.ndarray) else (int(m[0]), int(m[1])) for m in moves]))
        return self._inc.evaluate_many(moves)


def candidates(cur, batch) -> list:
    """The assignments a recorded batch scores: each move ``(group, device)`` applied to
    ``cur``, or a whole assignment as recorded."""
    out = []
    for m in batch:
        if isinstance(m, np.ndarray):
            out.append(m)
        else:
            b = cur.copy()
            b[m[0]] = m[1]
            out.append(b)
    return out


def record_annealing(problem, seconds: float, seed: int) -> list:
    """Run ``sa`` for ``seconds`` and return the calls it made to its incremental
    simulator: ("base", a), ("commit", a), ("batch", [(group, device) or a, ...])."""
    from placetool.costmodel import incremental
    from placetool.search import Budget, run

    _Recorder.real = incremental.IncrementalSimulator
    _Recorder.log = []
    incremental.IncrementalSimulator = _Recorder
    try:
        # every batch through the incremental engine (mode=auto would hand some to the other)
        run("sa", problem, Budget(seconds=seconds), seed=seed, mode="incremental")
    finally:
        incremental.IncrementalSimulator = _Recorder.real
    return _Recorder.log


def bench_annealer(graph: str, cluster: str, seconds: float, seed: int, rounds: int = 3) -> dict:
    """Incremental vs full simulation on the calls a real ``sa`` run makes: the batches
    of moves and compound moves it scores and the accepted moves it commits (which a
    full simulation does not need), replayed in the same order. Four ways: ``full``
    (``CostModel.simulate`` per candidate), ``batch`` (``simulate_batch`` per batch, on
    every core), ``incr`` (``evaluate_many`` on one thread) and ``incr-all``
    (``evaluate_many`` on every core, what ``sa`` does)."""
    import numba

    from placetool.costmodel import CostModel, presets
    from placetool.costmodel.incremental import IncrementalSimulator
    from placetool.search import Problem

    cm = CostModel(presets.load_graph(graph), presets.load_cluster(cluster))
    pr = Problem(cm)
    log = record_annealing(pr, seconds, seed)
    a0 = log[0][1]
    n_eval = sum(len(x[1]) for x in log if x[0] == "batch")

    def replay_full(batched):
        cur, out = a0, []
        for x in log[1:]:
            if x[0] != "batch":
                cur = x[1]
            elif batched:
                r = cm.simulate_batch(np.stack(candidates(cur, x[1])))
                out.extend(zip(r.step_time_us, r.peak_memory_bytes, r.feasible))
            else:
                out.extend((r.step_time_us, r.peak_memory_bytes, r.feasible)
                           for r in map(cm.simulate, candidates(cur, x[1])))
        return out

    def replay_incremental(threads):
        inc = IncrementalSimulator(cm, a0, threads=threads)
        out = []
        for x in log[1:]:
            if x[0] == "base":
                inc.set_base(x[1])
            elif x[0] == "commit":
                inc.commit(x[1])
            else:
                out.extend((r.step_time_us, r.peak_memory_bytes, r.feasible) for r in inc.evaluate_many(x[1]))
        return out, inc

    # every answer checked equal to the full simulation (untimed)
    ri, inc = replay_incremental(numba.get_num_threads())
    for i, (x, ref) in enumerate(zip(ri, replay_full(False))):
        if not (x[0] == ref[0] and np.array_equal(x[1], ref[1]) and x[2] == ref[2]):
            raise AssertionError(f"{graph}: incremental != full at evaluation {i} of the annealing replay")
    fns = {"full": lambda: replay_full(False), "batch": lambda: replay_full(True),
           "incr": lambda: replay_incremental(1), "incr-all": lambda: replay_incremental(numba.get_num_threads())}
    per = {k: [] for k in fns}
    names = list(fns)
    for rnd in range(rounds):
        for k in names[rnd % 4:] + names[: rnd % 4]:
            t = time.perf_counter()  # wall time: two of the four use every core
            fns[k]()
            per[k].append((time.perf_counter() - t) / max(n_eval, 1))
    ms = {k: 1e3 * float(np.median(v)) for k, v in per.items()}
    ratio = np.array(per["full"]) / np.array(per["incr"])
    ratio_all = np.array(per["batch"]) / np.array(per["incr-all"])
    return {
        "graph": graph, "cluster": cluster, "base": f"sa {seconds:g} s", "ops": cm.graph.n_ops,
        "groups": pr.n_groups, "evaluations": n_eval, "batches": sum(1 for x in log if x[0] == "batch"),
        "commits": sum(1 for x in log if x[0] == "commit"), "restarts": sum(1 for x in log if x[0] == "base") - 1,
        "threads": numba.get_num_threads(),
        "full_ms": ms["full"], "incr_ms": ms["incr"], "batch_ms": ms["batch"], "incr_all_ms": ms["incr-all"],
        "speedup": float(np.median(ratio)), "speedup_range": [float(ratio.min()), float(ratio.max())],
        "speedup_all": float(np.median(ratio_all)), "speedup_all_range": [float(ratio_all.min()), float(ratio_all.max())],
        "rounds": rounds, "all_equal": True,
    }


def changed_events(base, cand) -> tuple[int, int, float]:
    """Events of ``cand``'s traced run that differ from ``base``'s (ops whose device or
    start moved, transfers that are new or whose start or end moved, and base transfers
    that no longer happen), the base run's events in all (ops + transfers), and the time
    of the first differing event (inf if none). An exact incremental engine must handle
    at least the changed events, and restart no later than the first."""
    moved = (base.op_start != cand.op_start) | (base.placement != cand.placement)
    first = float(np.min(np.minimum(base.op_start[moved], cand.op_start[moved]), initial=np.inf))

    def keyed(tr):
        return {(int(t), int(s), int(d)): (float(a), float(b))
                for t, s, d, a, b in zip(tr.x_tensor, tr.x_src, tr.x_dst, tr.x_start, tr.x_end)}

    xb, xc = keyed(base), keyed(cand)
    xs = 0
    for k in xb.keys() | xc.keys():
        a, b = xb.get(k), xc.get(k)
        if a != b:
            xs += 1
            first = min(first, *(v[0] for v in (a, b) if v is not None))
    return int(np.count_nonzero(moved)) + xs, len(base.op_start) + len(xb), first


def bench_bound(graph: str, cluster: str, seconds: float, seed: int, every: int = 5) -> dict:
    """How much of each move's run an exact incremental engine must redo, on the moves a
    real ``sa`` run scores: every ``every``-th batch's candidates are traced and compared
    event by event with the current placement's traced run. A move costs at least its
    changed events, so sum(events) / sum(changed events) bounds any exact incremental
    engine's speed-up over full runs from above (commits not even counted); and
    sum(events) / sum(events from the first changed event on) bounds an engine that restarts
    at the first change and never stops early."""
    from placetool.costmodel import CostModel, presets
    from placetool.search import Problem

    cm = CostModel(presets.load_graph(graph), presets.load_cluster(cluster))
    pr = Problem(cm)
    log = record_annealing(pr, seconds, seed)
    cur, n_batch, changed, total, after, first = log[0][1], 0, [], [], [], []
    for x in log[1:]:
        if x[0] != "batch":
            cur = x[1]
            continue
        n_batch += 1
        if n_batch % every:
            continue
        tb = cm.simulate(cur, trace=True).trace
        span = float(np.max(tb.op_end))
        for b in candidates(cur, x[1]):
            tc = cm.simulate(b, trace=True).trace
            ch, tot, t0 = changed_events(tb, tc)
            changed.append(ch)
            total.append(tot)
            first.append(min(t0 / span, 1.0))
            # what a run restarted exactly at the first changed event and run to the end handles
            after.append(int(np.count_nonzero(tb.op_start >= t0) + np.count_nonzero(tb.x_start >= t0)))
    changed, total, after = np.array(changed, float), np.array(total, float), np.array(after, float)
    share = changed / total
    spread = changed / np.maximum(after, 1.0)  # of the events from the first change on, how many changed
    return {
        "graph": graph, "cluster": cluster, "base": f"sa {seconds:g} s", "moves": len(changed),
        "first_change_at": float(np.mean(first)), "changed_share": float(share.mean()),
        "changed_q10": float(np.quantile(share, 0.1)), "changed_q50": float(np.quantile(share, 0.5)),
        "changed_q90": float(np.quantile(share, 0.9)), "bound": float(total.sum() / max(changed.sum(), 1.0)),
        "bound_restart": float(total.sum() / max(after.sum(), 1.0)),
        "changed_after_q50": float(np.quantile(spread, 0.5)),
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", nargs="+", default=["synthetic-10k", "synthetic-50k"])
    ap.add_argument("--cluster", default="k80x4")
    ap.add_argument("--bases", nargs="+", default=["chunks", "random"], choices=["chunks", "random"])
    ap.add_argument("--moves", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per method (medians reported)")
    ap.add_argument("--annealer", type=float, default=0.0, metavar="SECONDS",
                    help="instead, replay the calls an sa run of SECONDS makes (its own moves, and its commits)")
    ap.add_argument("--bound", action="store_true",
                    help="with --annealer: how much of each move's run changes (an upper bound on any exact "
                         "incremental engine's speed-up), instead of timing")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.bound and args.annealer <= 0:
        ap.error("--bound measures sa's own moves: give --annealer SECONDS")
    if args.bound:
        rows = [bench_bound(g, args.cluster, args.annealer, args.seed) for g in args.graphs]
    elif args.annealer > 0:
        rows = [bench_annealer(g, args.cluster, args.annealer, args.seed, args.rounds) for g in args.graphs]
    else:
        rows = [bench(g, args.cluster, b, args.moves, args.seed, args.rounds) for g in args.graphs for b in args.bases]
    if args.json:
        print(json.dumps({"rows": rows}))
        return
    if args.bound:
        title = ("share of a move's events (ops and transfers) whose device or times differ from the current "
                 "placement's run; bound = events / changed events, summed over the moves")
        cols = [("graph", "graph", "<14"), ("sa run", "base", "<8"), ("moves", "moves", ">6"),
                ("1st change@", "first_change_at", ">11.2f"), ("changed", "changed_share", ">8.1%"),
                ("p10", "changed_q10", ">6.1%"), ("p50", "changed_q50", ">6.1%"), ("p90", "changed_q90", ">6.1%"),
                ("bound", "bound", ">6.2f"), ("no early stop", "bound_restart", ">13.2f"),
                ("changed after 1st, p50", "changed_after_q50", ">22.1%")]
    elif args.annealer > 0:
        title = ("ms = wall ms per evaluation, incremental paying for sa's commits too; full and incr on one "
                 "core, batch and incr-all on every core")
        cols = [("graph", "graph", "<14"), ("sa run", "base", "<8"), ("evals", "evaluations", ">6"),
                ("commits", "commits", ">7"), ("full ms", "full_ms", ">8.2f"), ("incr ms", "incr_ms", ">8.2f"),
                ("speedup", "speedup", ">6.2f"), ("range", "range", ">11"), ("batch ms", "batch_ms", ">8.2f"),
                ("incr-all ms", "incr_all_ms", ">11.2f"), ("speedup", "speedup_all", ">6.2f"),
                ("range", "range_all", ">11")]
    else:
        title = "ms = CPU ms per move"
        cols = [("graph", "graph", "<14"), ("base", "base", "<7"), ("moves", "moves", ">5"),
                ("full ms", "full_ms", ">8.2f"), ("incr ms", "incr_ms", ">8.2f"), ("speedup", "speedup", ">6.2f"),
                ("range", "range", ">11"), ("nostop ms", "incr_nostop_ms", ">9.2f"),
                ("speedup", "speedup_nostop", ">6.2f"), ("restart@", "restart_at", ">8.2f"),
                ("stopped", "stopped_early", ">7.0%"), ("base ms", "base_ms", ">8.1f")]
    if args.bound:
        print(f"cluster {args.cluster}; {title}")
    else:
        print(f"cluster {args.cluster}; {title}, median of {args.rounds} rounds (range: speedup's min-max over "
              "rounds); every answer checked equal to the full simulation")
    # the header takes each column's alignment and width (">8.2f" -> ">8")
    hdr = " ".join(format(name, spec[0] + spec[1:].split(".")[0].rstrip("f%")) for name, _, spec in cols)
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        r = dict(r, range="{:.2f}-{:.2f}x".format(*r.get("speedup_range", (0, 0))),
                 range_all="{:.2f}-{:.2f}x".format(*r.get("speedup_all_range", (0, 0))))
        print(" ".join(format(r[key], spec) for _, key, spec in cols))


if __name__ == "__main__":
    main()
