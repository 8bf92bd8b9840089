"""Lower bounds on the step time of any placement of a problem.

:func:`lower_bound` is the best of:

- ``critical_path``: the longest path with every op on its fastest device and free
  communication (:meth:`CostModel.lower_bound_us`'s first term);
- ``load``: an LP relaxation of group placement — each group's work split fractionally
  over the devices it may use, at that device's speed, the busiest device's load
  minimised — bounded from its dual (see :func:`load_bound`). It is at least total work
  / devices on the fastest devices, and more where a slow host must take pinned work
  or can take little else;
- ``group``: the longest single group on its fastest allowed device (a group's ops share
  one device, so they never overlap);
- ``energy``: the interval (energy) bound of Fernandez & Bussell: for a candidate step
  time C every op must run within [head, C - tail] (heads and tails from critical
  paths on the fastest devices); if some window [t1, t2] holds more mandatory work than
  the devices can do in t2 - t1, no schedule of length C exists. Devices are counted
  at their speed: an op lasts its time on the fastest class (devices with identical op
  times) there, and its best time among the other devices elsewhere; the least time it
  spends in the window is taken at that duration, and the fastest class takes the ops
  that save the most elsewhere per unit of its own time first (a fractional knapsack
  per window), so a slow host adds little. The largest infeasible C found by bisection
  over a grid of windows is a bound.

- ``communication``: heads and tails per (op, device) that charge every transfer a
  placement cannot avoid (:mod:`placetool.search.comm_bound`): a consumer on another
  device than its producer waits at least the producer's send cost, the link's latency +
  bytes / bandwidth and its own receive cost, stages the simulator runs one after the
  other; a predecessor on the consumer's device instead queues there with the consumer's
  other local predecessors (and successors likewise after an op); ops of one group share
  a device. By induction over the topological order every op of every placement starts
  no earlier than its head on its device and is followed by at least its tail, so the
  largest over ops (and over groups, as one machine) of the least over devices of head +
  time + tail is a bound.

The first four ignore communication (a placement may avoid it) and memory; the last
charges only what every placement pays; so each is a valid bound for the simulator's
step time of every placement.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from placetool.costmodel import engine

from .comm_bound import communication_bound


@njit(cache=True)
def _heads_tails(topo_order, w, succ_ptr, succ):
    n = topo_order.shape[0]
    head = np.zeros(n)
    tail = np.zeros(n)
    for k in range(n):
        v = topo_order[k]
        f = head[v] + w[v]
        for e in range(succ_ptr[v], succ_ptr[v + 1]):
            u = succ[e]
            if f > head[u]:
                head[u] = f
    for k in range(n - 1, -1, -1):
        v = topo_order[k]
        m = 0.0
        for e in range(succ_ptr[v], succ_ptr[v + 1]):
            u = succ[e]
            t = w[u] + tail[u]
            if t > m:
                m = t
        tail[v] = m
    return head, tail


@njit(cache=True, inline="always")
def _overlap(t, L, t1, t2, head, tail, C):
    """The least time an op lasting ``t`` spends inside [t1, t2] if it starts no earlier
    than ``head`` and ends no later than ``C - tail``."""
    return max(0.0, min(t, L, head + t - t1, t2 - (C - tail - t)))


@njit(cache=True)
def _energy_infeasible(C, head, tail, p, ra, rb, nA, nB, grid, full):
    """True if some window [grid[a], grid[b]] holds more work than the devices can do in
    it under step time C.

    An op lasts ``ra * p`` on each of the ``nA`` devices of the fastest class and ``rb * p``
    on the best of the other ``nB`` devices (``p``: its fastest time); the least time it
    spends inside the window is taken at the duration of the class that runs it. Ops are
    split between the classes fractionally: class A takes the ops that save the most
    class-B time per unit of its own first (a fractional knapsack per window), which
    minimises what class B must do, so "infeasible" is never claimed wrongly.
    """
    K = grid.shape[0]
    n = p.shape[0]
    a = np.empty(n)
    b = np.empty(n)
    key = np.empty(n)
    for ia in range(K):
        t1 = grid[ia]
        for ib in range(ia + 1, K):
            if not full and ia > 0 and ib < K - 1:  # large graphs: prefixes and suffixes only
                continue
            t2 = grid[ib]
            L = t2 - t1
            cap_a = nA * L * (1.0 + 1e-12)
            cap_b = nB * L * (1.0 + 1e-12)
            load_a = 0.0
            load_b = 0.0
            nc = 0
            for i in range(n):
                if p[i] <= 0.0:
                    continue
                ai = _overlap(ra[i] * p[i], L, t1, t2, head[i], tail[i], C) if ra[i] < np.inf else np.inf
                bi = _overlap(rb[i] * p[i], L, t1, t2, head[i], tail[i], C) if rb[i] < np.inf else np.inf
                if ai == 0.0 or bi == 0.0:
                    continue  # free on one side
                if ai == np.inf:
                    load_b += bi
                elif bi == np.inf:
                    load_a += ai
                else:
                    a[nc], b[nc], key[nc] = ai, bi, -bi / ai
                    nc += 1
            if load_a > cap_a or load_b > cap_b:
                return True
            order = np.argsort(key[:nc])
            for k in order:
                room = cap_a - load_a
                if a[k] <= room:
                    load_a += a[k]
                    continue
                share = room / a[k] if room > 0.0 else 0.0
                load_a = max(load_a, cap_a)
                load_b += (1.0 - share) * b[k]
            if load_b > cap_b:
                return True
    return False


def _speed_classes(T):
    """(fastest class's devices, per-op time ratios on it and elsewhere): devices with
    identical op times form a class; the class with the least total time is A, every
    other device is counted at the best of them for each op."""
    D = T.shape[1]
    Tf = np.where(np.isfinite(T), T, np.inf)
    cols = {}
    for d in range(D):
        cols.setdefault(Tf[:, d].tobytes(), []).append(d)
    classes = list(cols.values())
    total = [np.where(np.isfinite(Tf[:, c[0]]), Tf[:, c[0]], 1e300).sum() for c in classes]
    A = classes[int(np.argmin(total))]
    others = [d for d in range(D) if d not in A]
    p = Tf.min(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ra = np.where(p > 0, Tf[:, A[0]] / p, 1.0)
        rb = np.where(p > 0, Tf[:, others].min(axis=1) / p, 1.0) if others else np.full(len(p), np.inf)
    ra = np.where(np.isnan(ra), np.inf, ra)
    rb = np.where(np.isnan(rb), np.inf, rb)
    return len(A), len(others), ra, rb


def load_bound(problem, iters: int = 300) -> float:
    """The fractional load bound, from the dual side.

    The LP  min C  s.t. each group's shares over its devices sum to one and every
    device's load (share x the group's time there) is at most C  has the dual
    max over device weights y >= 0 with sum(y) = 1 of  sum_g min_d y_d t_gd:  every y
    gives a valid bound (uniform y is total fastest work / devices). Exponentiated
    subgradient ascent on y; the best value seen is returned.
    """
    t = np.where(problem.allowed, problem.group_time, np.inf)
    G, D = t.shape
    if G == 0:
        return 0.0
    t = np.where(np.isfinite(t), t, np.inf)
    y = np.full(D, 1.0 / D)
    best = 0.0
    rows = np.arange(G)
    for k in range(iters):
        v = y[None, :] * t
        j = np.argmin(v, axis=1)
        f = float(v[rows, j].sum())
        best = max(best, f)
        grad = np.bincount(j, weights=t[rows, j], minlength=D)  # d f / d y_d
        grad = grad / max(float(grad.max()), 1e-300)
        y = y * np.exp(0.5 / np.sqrt(k + 1) * (grad - grad @ y))
        y /= y.sum()
    return best * (1 - 1e-12)


def energy_bound(cost_model, start: float, grid_points: int = 24, iters: int = 12) -> float:
    """The interval bound (see the module docstring), at least ``start``."""
    g = cost_model.graph
    if g.n_ops == 0:
        return start
    p = cost_model.T.min(axis=1)
    p = np.where(np.isfinite(p), p, 0.0)
    head, tail = _heads_tails(np.ascontiguousarray(g.topo_order, np.int64), p, *g.successors)
    nA, nB, ra, rb = _speed_classes(cost_model.T)
    lo, hi = start, max(start, float(p.sum()))  # C = hi is always feasible for this test
    full = g.n_ops * grid_points ** 2 <= 1_000_000
    if hi <= lo:
        return lo
    for _ in range(iters):
        C = 0.5 * (lo + hi)
        grid = np.linspace(0.0, C, grid_points)
        if _energy_infeasible(C, head, tail, p, ra, rb, float(nA), float(nB), grid, full):
            lo = C
        else:
            hi = C
    return lo


def lower_bound(problem, energy: bool = True) -> dict:
    """Every bound of the module docstring (µs) and ``best``, their maximum."""
    cm = problem.cost_model
    g = cm.graph
    out = {}
    if g.n_ops:
        fastest = cm.T.min(axis=1)
        out["critical_path"] = float(engine.critical_path(g.topo_order, fastest, *g.successors))
    else:
        out["critical_path"] = 0.0
    out["load"] = load_bound(problem) if problem.n_groups else 0.0
    gt = np.where(problem.allowed, problem.group_time, np.inf).min(axis=1)
    out["group"] = float(gt.max()) if len(gt) else 0.0
    best = max(out.values())
    if energy:
        out["energy"] = energy_bound(cm, best)
        best = max(best, out["energy"])
    # after the energy term, whose bisection starts from the best so far: its value stays
    # what it was without this term, rather than move with where the bisection starts
    out["communication"] = communication_bound(problem)
    best = max(best, out["communication"])
    out["best"] = best
    return out
