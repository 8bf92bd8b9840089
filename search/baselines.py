"""Baselines: every op on one device, groups dealt round-robin, groups at random."""

from __future__ import annotations

import numpy as np

from .registry import Count, register
from .tracker import BudgetExhausted


#: rows of ``single`` simulated at a time, so that a budget of seconds is heard between them
SINGLE_CHUNK = 64


@register("single", seed_rank=0)
def single(problem, budget, seed, tracker):
    """Best single device that fits; groups that cannot run there go to the host CPU.

    Tries each device as the home of every group it may run (pinned groups go to the
    first device that may run them), and keeps the fastest feasible one. A device that
    is the twin of an earlier one (:func:`twins`) is scored from its twin's simulation,
    relabelled, not simulated again: a cluster of a thousand identical GPUs costs two
    simulations, not a thousand, and leaves a search's seeding share to the others.
    """
    D = problem.n_devices
    fallback = np.argmax(problem.allowed, axis=1)
    twin = twins(problem, np.unique(fallback))
    done = {}  # device simulated -> (step, feasible, peak)
    for k in range(0, D, SINGLE_CHUNK):
        if tracker.done():
            raise BudgetExhausted
        rows = np.arange(k, min(D, k + SINGLE_CHUNK, k + tracker.remaining_evals()))
        A = np.stack([np.where(problem.allowed[:, d], d, fallback) for d in rows]).astype(np.int32)
        own = rows[twin[rows] == rows]
        if own.size:
            r = problem.cost_model.simulate_batch(A[own - k])
            done.update((d, (r.step_time_us[i], r.feasible[i], r.peak_memory_bytes[i])) for i, d in enumerate(own))
        out = []
        for d in rows:
            step, ok, peak = done[twin[d]]
            if twin[d] != d:  # d runs what its twin ran: the twin's peak is d's, and the twin is idle
                peak = peak.copy()
                peak[[twin[d], d]] = peak[[d, twin[d]]]
            out.append((step, ok, peak))
        tracker.record(A, np.array([x[0] for x in out]), np.array([x[1] for x in out]), np.stack([x[2] for x in out]))
    return {"candidates": D, "simulated": len(done)}


def twins(problem, fallback) -> np.ndarray:
    """For each device, the first device whose single-device placement simulates the same
    up to relabelling the two: same groups allowed, op times, memory, send and receive
    costs, and links to and from every ``fallback`` device (where pinned groups go); a
    fallback device is its own."""
    cm, cl = problem.cost_model, problem.cluster
    xc, lat, bw = cl.transfer_costs(), cl.latency_us, cl.bandwidth_bytes_per_us
    first: dict = {}
    out = np.arange(problem.n_devices)
    for d in range(problem.n_devices):
        if d in fallback:
            continue
        key = (problem.allowed[:, d].tobytes(), cm.T[:, d].tobytes(), int(cm.capacity[d]), xc[:, d].tobytes(),
               lat[d, fallback].tobytes(), lat[fallback, d].tobytes(), bw[d, fallback].tobytes(),
               bw[fallback, d].tobytes())
        out[d] = first.setdefault(key, d)
    return out


@register("round-robin", seed_rank=1)
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
