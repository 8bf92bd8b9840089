"""Baselines: every op on one device, groups dealt round-robin, groups at random."""

from __future__ import annotations

import numpy as np

from .base import Count, register


@register("single", seed=0)
def single(problem, budget, seed, tracker):
    """Best single device that fits; groups that cannot run there go to the host CPU.

    Tries each device as the home of every group it may run (pinned groups go to the
    first device that may run them), and keeps the fastest feasible one.
    """
    cands = []
    for d in range(problem.n_devices):
        a = np.where(problem.allowed[:, d], d, np.argmax(problem.allowed, axis=1)).astype(np.int32)
        cands.append(a)
    tracker.evaluate(np.stack(cands))
    return {"candidates": problem.n_devices}


@register("round-robin", seed=1)
def round_robin(problem, budget, seed, tracker):
    """Group k on the k-th device (in turn among the devices that may run it)."""
    a = np.empty(problem.n_groups, np.int32)
    for k in range(problem.n_groups):
        ok = np.flatnonzero(problem.allowed[k])
        a[k] = ok[k % len(ok)]
    tracker.evaluate(a)


@register("random")
def random_search(problem, budget, seed, tracker, batch: Count = 64):
    """Uniformly random valid assignments, scored in batches until the budget ends."""
    rng = np.random.default_rng(seed)
    while not tracker.done():
        n = min(batch, tracker.remaining_evals())
        tracker.evaluate(np.stack([problem.random_assignment(rng) for _ in range(n)]))
