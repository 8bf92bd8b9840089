"""Where every searcher starts: the placements of the seeding methods.

sa, tpe, exact and rl start from the placements of the one-shot methods registered with
a ``seed_rank`` (baselines, expert, partitioners, list schedulers: :func:`seed_assignments`),
ranked by :func:`objective`, the step time with a penalty for a placement over memory.
"""

from __future__ import annotations

import numpy as np

from .errors import SearchError
from .memory import fit_memory
from .registry import get, seed_names
from .tracker import BudgetExhausted

#: under a seconds budget, a seeding share that has scored no placement that fits runs
#: on until one is scored, up to this share of the budget (Tracker.sub_budget)
UNTIL_FEASIBLE_SHARE = 0.6


def seed_limits(budget, share: float) -> tuple[float, float | None]:
    """(seconds, until_feasible) of the seeding share: ``share`` of a seconds budget
    (60 s under an evaluation budget), running on to :data:`UNTIL_FEASIBLE_SHARE` of it
    while nothing scored fits."""
    if not budget.seconds:
        return 60.0, None
    return budget.seconds * share, budget.seconds * max(share, UNTIL_FEASIBLE_SHARE)


def objective(step, feasible, peak, capacity, feasible_ref: float = np.inf) -> np.ndarray:
    """What annealing minimises: the step time, or over memory a penalised one that is
    at least 1.5x ``feasible_ref`` (the step time of a feasible placement; inf when none
    is known), so an infeasible placement never scores better than that one."""
    step = np.asarray(step, float)
    peak = np.atleast_2d(peak)
    over = np.clip((peak - capacity[None, :]) / capacity[None, :], 0, None).max(axis=1)
    floor = feasible_ref if np.isfinite(feasible_ref) else 0.0
    return np.where(feasible, step, np.maximum(step, floor) * (1.5 + over))


def seed_assignments(problem, budget, seed, tracker, names=None, share=0.4):
    """Run the seeding methods (default: every method registered with a ``seed_rank``,
    cheapest first) through ``tracker``; returns ([(objective, name,
    assignment)] best first, skipped names). Methods that are not registered, or fail,
    are skipped. They share ``share`` of a time budget (60 s under an evaluation budget):
    none starts after it is spent and iterative ones stop, and so do the list schedulers
    (one schedule can take seconds at a thousand devices: one cut short gives no seed);
    another one-shot method that finishes late still has its answer scored and kept.
    Seeds out of memory but faster than every feasible one are fitted into memory
    (:func:`fit_memory`) within the same share and join as ``NAME (fitted)``; objectives
    are scored against the best feasible seed (:func:`objective`). While none that
    fits is scored, the share runs on (:func:`seed_limits`)."""
    cap = problem.cost_model.capacity
    names = seed_names(names)
    found, skipped = [], []  # (name, assignment, step, feasible, peak)
    with tracker.sub_budget(*seed_limits(budget, share)) as rows:
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
                for i in range(len(r.assignments)):
                    if np.isfinite(r.step_time_us[i]):
                        found.append((name, np.array(r.assignments[i], np.int32), float(r.step_time_us[i]),
                                      bool(r.feasible[i]), r.peak_memory_bytes[i]))
        ref = min((x[2] for x in found if x[3]), default=np.inf)
        for name, a, step, ok, _ in sorted(found, key=lambda x: x[2]):
            if ok or not step < ref or tracker.done():
                continue
            b, r = fit_memory(problem, a, tracker)
            if r is not None and len(r.feasible) and r.feasible[0]:
                found.append((f"{name} (fitted)", b, float(r.step_time_us[0]), True, r.peak_memory_bytes[0]))
    if not found and not tracker.done():
        # nothing registered ran: fall back to every group on its first allowed GPU/device
        a = np.argmax(problem.allowed, axis=1).astype(np.int32)
        r = tracker.evaluate(a)
        found.append(("first-device", a, float(r.step_time_us[0]), bool(r.feasible[0]), r.peak_memory_bytes[0]))
    ref = min((x[2] for x in found if x[3]), default=np.inf)
    out = []
    for name, a, step, ok, peak in found:
        o = float(objective([step], [ok], peak[None, :], cap, ref)[0])
        if np.isfinite(o):
            out.append((o, name, a))
    out.sort(key=lambda x: x[0])
    return out, skipped
