"""``sa``: simulated annealing over group assignments.

A neighbour moves one group to another device it may use (or, with probability
``swap``, exchanges the devices of two groups). Moves are scored by the incremental
simulator (:mod:`placetool.costmodel.incremental`: re-simulates only from the first event a move
changes, exact) or, with ``mode="batch"``, ``batch`` neighbours at a time by the
parallel batch simulator, the best of which faces the Metropolis rule. The
temperature is relative (an uphill step of ``x`` times the current step time is taken
with probability ``exp(-x / T)``) and adapts to keep the uphill acceptance rate near a target
that falls from ``accept_start`` to ``accept_end`` over the budget. Runs start from the
best of the cheap baselines and list schedulers that are registered (``seeds``) and
restart, re-heated, from the best placement seen or the next seed when a run stops
improving. Out-of-memory placements score ``step * (1.5 + overflow fraction)``, so they
can be crossed but are never preferred; the tracker reports the best feasible one.
"""

from __future__ import annotations

import math
import time

import numpy as np

from .base import BudgetExhausted, SearchError, get, register, seed_methods

def objective(step, feasible, peak, capacity) -> np.ndarray:
    """What annealing minimises: the step time, or a penalised one over memory."""
    step = np.asarray(step, float)
    peak = np.atleast_2d(peak)
    over = np.clip((peak - capacity[None, :]) / capacity[None, :], 0, None).max(axis=1)
    return np.where(feasible, step, step * (1.5 + over))


def seed_assignments(problem, budget, seed, tracker, names=None, share=0.4):
    """Run the seeding methods (default: every method registered with a ``seed``
    position, cheapest first) through ``tracker``; returns ([(objective, name,
    assignment)] best first, skipped names). Methods that are not registered, or fail,
    are skipped. They share ``share`` of a time budget (60 s under an evaluation budget):
    none starts after it is spent and iterative ones stop, but a one-shot method that
    finishes late still has its answer scored and kept."""
    cap = problem.cost_model.capacity
    names = seed_methods() if names is None else tuple(names)
    limit = budget.seconds * share if budget.seconds else 60.0
    out, skipped = [], []
    with tracker.sub_budget(limit) as rows:
        for name in names:
            if tracker.done():
                break
            try:
                fn = get(name)
            except (SearchError, ImportError):
                skipped.append(name)
                continue
            n0 = len(rows)
            try:
                fn(problem, budget, seed, tracker)
            except BudgetExhausted:
                pass
            except Exception as e:  # a broken seeding method must not sink the search
                skipped.append(f"{name} ({type(e).__name__})")
            for r in rows[n0:]:
                obj = objective(r.step_time_us, r.feasible, r.peak_memory_bytes, cap)
                for i in range(len(r.assignments)):
                    if np.isfinite(obj[i]):
                        out.append((float(obj[i]), name, np.array(r.assignments[i], np.int32)))
    if not out and not tracker.done():
        # nothing registered ran: fall back to every group on its first allowed GPU/device
        a = np.argmax(problem.allowed, axis=1).astype(np.int32)
        r = tracker.evaluate(a)
        out.append((float(objective(r.step_time_us, r.feasible, r.peak_memory_bytes, cap)[0]), "first-device", a))
    out.sort(key=lambda x: x[0])
    return out, skipped


@register("sa")
def anneal(problem, budget, seed, tracker, mode: str = "incremental", batch: int = 8, swap: float = 0.1,
           accept_start: float = 0.05, accept_end: float = 0.001, window: int = 50, patience: int | None = None,
           seeds=None, checkpoints: int | None = None):
    """Simulated annealing (see the module docstring); returns metadata."""
    if mode not in ("incremental", "batch"):
        raise SearchError(f"sa: mode must be 'incremental' or 'batch', got {mode!r}")
    rng = np.random.default_rng(seed)
    cm = problem.cost_model
    cap = cm.capacity
    allowed = problem.allowed
    movable = np.flatnonzero(allowed.sum(axis=1) >= 2)
    seeds_, skipped = seed_assignments(problem, budget, seed, tracker, names=seeds)
    meta = {"mode": mode, "seeds": list(dict.fromkeys(n for _, n, _ in seeds_)), "skipped_seeds": skipped,
            "proposals": 0, "accepted": 0, "restarts": 0}
    if movable.size == 0 or not seeds_:
        return meta
    patience = patience or max(64, 8 * movable.size)
    ok_lists = [np.flatnonzero(allowed[k]) for k in range(problem.n_groups)]

    def progress():
        if budget.evals is not None:
            return tracker.evaluations / budget.evals
        return tracker.seconds / budget.seconds

    def neighbour(cur):
        """(new assignment, moved group or -1 for a swap)."""
        a = cur.copy()
        if rng.random() < swap and movable.size >= 2:
            for _ in range(8):
                g1, g2 = rng.choice(movable, 2, replace=False)
                d1, d2 = cur[g1], cur[g2]
                if d1 != d2 and allowed[g1, d2] and allowed[g2, d1]:
                    a[g1], a[g2] = d2, d1
                    return a, -1
        g = movable[rng.integers(movable.size)]
        others = ok_lists[g][ok_lists[g] != cur[g]]
        a[g] = others[rng.integers(others.size)]
        return a, g

    inc = None
    cur_obj, _, cur = seeds_[0]
    cur = cur.copy()
    if mode == "incremental":
        from placetool.costmodel.incremental import IncrementalSimulator

        inc = IncrementalSimulator(cm, cur, checkpoints=checkpoints)
    T = 0.02
    hist = []  # uphill proposals: 1 accepted, 0 rejected (the last ``window``)
    run_best, since_best, next_seed = cur_obj, 0, 1

    while not tracker.done():
        # ---- propose and score
        if inc is not None:
            a, g = neighbour(cur)
            cand = [a]
            r = inc.evaluate_move(g, a[g]) if g >= 0 else inc.evaluate(a)
            tracker.record(cand[0][None, :], np.array([r.step_time_us]), np.array([r.feasible]))
            objs = objective([r.step_time_us], [r.feasible], r.peak_memory_bytes[None, :], cap)
        else:
            n = min(batch, tracker.remaining_evals())
            cand = [neighbour(cur)[0] for _ in range(n)]
            r = tracker.evaluate(np.stack(cand))
            objs = objective(r.step_time_us, r.feasible, r.peak_memory_bytes, cap)
        # ---- Metropolis on the best neighbour of the batch (the only one, incrementally)
        meta["proposals"] += len(objs)
        i = int(np.argmin(objs))
        o = objs[i]
        d = (o - cur_obj) / max(cur_obj, 1e-9)
        acc = bool(np.isfinite(o) and (d <= 0 or rng.random() < math.exp(-d / max(T, 1e-12))))
        if not d <= 0:  # only uphill steps tell how hot it is
            hist.append(1 if acc else 0)
        took = i if acc else -1
        if took >= 0:
            meta["accepted"] += 1
            cur, cur_obj = cand[took], float(objs[took])
            if inc is not None:
                inc.commit(cur)
        if cur_obj < run_best * (1 - 1e-12):
            run_best, since_best = cur_obj, 0
        else:
            since_best += len(cand)
        # ---- temperature: steer the uphill acceptance rate towards a falling target
        if len(hist) >= window:
            rate = sum(hist[-window:]) / window
            target = accept_start + (accept_end - accept_start) * min(1.0, progress())
            T *= 0.85 if rate > target else 1.15
            T = min(max(T, 1e-7), 10.0)
            del hist[:-window]
        # ---- restart when stuck: from the best seen, kicked by a few random moves;
        #      every third time from the next seed
        if since_best >= patience and not tracker.done():
            meta["restarts"] += 1
            if next_seed < len(seeds_) and meta["restarts"] % 3 == 0:
                cur = seeds_[next_seed][2].copy()
                next_seed += 1
            else:
                cur = tracker.best_assignment.copy()
                for _ in range(max(2, movable.size // 50)):
                    cur = neighbour(cur)[0]
            if inc is not None:
                inc.set_base(cur)
                tracker.record(cur[None, :], np.array([inc.base.step_time_us]), np.array([inc.base.feasible]))
                cur_obj = float(objective([inc.base.step_time_us], [inc.base.feasible],
                                          inc.base.peak_memory_bytes[None, :], cap)[0])
            else:
                r = tracker.evaluate(cur)
                cur_obj = float(objective(r.step_time_us, r.feasible, r.peak_memory_bytes, cap)[0])
            run_best, since_best, T = cur_obj, 0, max(T, 0.02)
    meta["temperature"] = T
    return meta
