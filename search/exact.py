"""``exact``: proven optimal placements of small problems, by branch and bound.

Groups are fixed one at a time (in topological order of their first op), each to every
device it may use; a partial assignment is dropped once a lower bound on every
completion of it is no better than the best placement simulated so far. Complete
assignments are scored by the simulator itself (through the tracker), so "optimal"
means optimal for the simulator's rules, memory included. Devices that can be swapped
without changing anything (same op times, memory and links) are interchangeable: only
the first unused one of a class is tried, which removes their permutations.

The bound of a partial assignment is the largest of: the problem's lower bound
(:mod:`placetool.search.bounds`); the earliest the last op can end with unlimited
devices, fixed ops on their devices, free ops on whichever device ends them first, and
every transfer between devices paying latency + bytes / bandwidth (see
:func:`partial_bound`); the busiest device's fixed work; and all fixed work plus every
free group's fastest time, over the devices. Each ignores queueing, so completions can
only be slower.

The search starts from the best placement of a short ``sa`` run (``incumbent_share`` of
a time budget; the seeding methods alone under an evaluation budget). When the budget ends first the
result is the best placement seen with a proven gap: ``metadata["status"]`` is
``optimal`` or ``feasible``, ``metadata["bound_us"]`` the proven lower bound and
``metadata["gap"]`` = best / bound - 1. Meant for a few dozen groups: the tree grows
as devices^groups where the bound does not cut it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .annealing import seed_assignments
from .base import Budget, BudgetExhausted, get, register


@njit(cache=True)
def partial_bound(gdev, group, T, topo_order, src_ptr, dst, nbytes, ctrl, lat, bw, D):
    """Lower bound on the step time of every completion of ``gdev`` (-1 = free group).

    ``F[v, d]``, the earliest v can end on device d with unlimited devices (inf where v
    may not go: no kernel, or its group is fixed elsewhere), is a dynamic programme over
    the topological order: an input from u arrives at min over d' of F[u, d'] plus the
    transfer from d' to d. The bound is the latest op's best F, or the busiest device's
    fixed work, or all work (free ops on their fastest device) over the devices.
    """
    n = T.shape[0]
    F = np.full((n, D), np.inf)
    ready = np.zeros((n, D))
    best = 0.0
    load = np.zeros(D)
    free_work = 0.0
    for k in range(n):
        v = topo_order[k]
        dv = gdev[group[v]]
        fmin = np.inf
        tmin = np.inf
        for d in range(D):
            if (dv >= 0 and d != dv) or not np.isfinite(T[v, d]):
                continue
            F[v, d] = ready[v, d] + T[v, d]
            if F[v, d] < fmin:
                fmin = F[v, d]
            if T[v, d] < tmin:
                tmin = T[v, d]
        if dv >= 0:
            load[dv] += T[v, dv]
        else:
            free_work += tmin
        if fmin > best:
            best = fmin
        for e in range(src_ptr[v], src_ptr[v + 1]):
            u = dst[e]
            for d in range(D):
                a = np.inf
                for d2 in range(D):
                    f = F[v, d2]
                    if d2 != d and not ctrl[e]:
                        f += lat[d2, d] + nbytes[e] / bw[d2, d]
                    if f < a:
                        a = f
                if a > ready[u, d]:
                    ready[u, d] = a
    total = free_work
    for d in range(D):
        total += load[d]
        if load[d] > best:
            best = load[d]
    if total / D > best:
        best = total / D
    return best


def device_classes(problem) -> np.ndarray:
    """Class id per device: devices in one class can be swapped without changing any
    placement's step time (same op times, memory, kind and links to the rest)."""
    cm, cl = problem.cost_model, problem.cluster
    D = problem.n_devices
    T = np.where(np.isfinite(cm.T), cm.T, -1.0)
    lat, bw = cl.latency_us, cl.bandwidth_bytes_per_us
    cls = np.arange(D)
    for a in range(D):
        for b in range(a):
            if cls[b] != b:
                continue
            perm = np.arange(D)
            perm[a], perm[b] = b, a
            same = (np.array_equal(T[:, a], T[:, b]) and cm.capacity[a] == cm.capacity[b]
                    and cl.kinds[a] == cl.kinds[b]
                    and np.array_equal(problem.allowed[:, a], problem.allowed[:, b])
                    and np.array_equal(lat[np.ix_(perm, perm)], lat) and np.array_equal(bw[np.ix_(perm, perm)], bw))
            if same:
                cls[a] = b
                break
    return cls


@register("exact", budget=Budget(seconds=60.0))
def exact(problem, budget, seed, tracker, leaf_batch: int = 256, seeds=None, incumbent_share: float = 0.2):
    """Branch and bound over group assignments: optimal, or the best with a proven gap."""
    cm, g = problem.cost_model, problem.graph
    G, D = problem.n_groups, problem.n_devices
    meta = {"status": "feasible", "nodes": 0, "pruned": 0, "leaves": 0}
    # a good first incumbent prunes most of the tree: the seeding methods, then (under a
    # time budget) a short annealing run from the best of them
    if budget.seconds and incumbent_share > 0:
        with tracker.sub_budget(budget.seconds * incumbent_share):
            try:
                get("sa")(problem, budget, seed, tracker, seeds=seeds)
            except BudgetExhausted:
                pass
    else:
        seed_assignments(problem, budget, seed, tracker, names=seeds, share=0.1)
    inc = tracker.best_step_us if tracker.best_feasible else np.inf
    meta["incumbent_us"] = float(inc)

    # op arrays for the bound
    T = np.ascontiguousarray(np.where(problem.allowed[g.group], cm.T, np.inf))
    order = np.ascontiguousarray(g.topo_order, np.int64)
    data = g.edge_tensor >= 0
    o = np.argsort(g.edge_src, kind="stable")
    src_ptr = np.searchsorted(g.edge_src[o], np.arange(g.n_ops + 1)).astype(np.int64)
    dst = np.ascontiguousarray(g.edge_dst[o], np.int64)
    nbytes = np.ascontiguousarray(g.edge_bytes[o], np.float64)
    ctrl = np.ascontiguousarray(~data[o])
    lat = np.ascontiguousarray(problem.cluster.latency_us, np.float64)
    bw = np.ascontiguousarray(problem.cluster.bandwidth_bytes_per_us, np.float64)
    group = np.ascontiguousarray(g.group, np.int64)
    root = problem.lower_bound_us()

    def bound(gdev):
        return max(root, partial_bound(gdev, group, T, order, src_ptr, dst, nbytes, ctrl, lat, bw, D))

    first = np.full(G, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, g.group, g.topo_rank.astype(np.int64))
    gorder = np.argsort(first, kind="stable")
    cls = device_classes(problem)
    leaves: list[np.ndarray] = []

    def flush():
        nonlocal inc
        if not leaves:
            return
        A = np.stack(leaves)
        leaves.clear()
        r = tracker.evaluate(A)  # BudgetExhausted when the budget ends
        meta["leaves"] += len(r.step_time_us)
        ok = r.feasible
        if ok.any():
            inc = min(inc, float(r.step_time_us[ok].min()))

    def children(gdev, depth, parent):
        """(bound, device) of each child at ``depth``, best first; leaves inherit the
        parent's bound (the simulator scores them)."""
        k = gorder[depth]
        used = set(gdev[gdev >= 0].tolist())
        tried = set()
        out = []
        for d in np.flatnonzero(problem.allowed[k]).tolist():
            if d not in used:  # of a class's unused devices only the first is tried
                if cls[d] in tried:
                    continue
                tried.add(cls[d])
            if depth + 1 < G:
                gdev[k] = d
                out.append((max(parent, bound(gdev)), d))
                gdev[k] = -1
            else:
                out.append((parent, d))
        out.sort()
        return out

    gdev = np.full(G, -1, np.int64)
    stack = []  # per depth: [children, index of the next one to try]
    pending = []  # bounds of leaves waiting in ``leaves``
    try:
        if G:
            stack.append([children(gdev, 0, root), 0])
        while stack:
            depth = len(stack) - 1
            kids, i = stack[-1]
            if i >= len(kids):
                stack.pop()
                if stack:
                    gdev[gorder[len(stack) - 1]] = -1
                continue
            stack[-1][1] = i + 1
            b, d = kids[i]
            k = gorder[depth]
            meta["nodes"] += 1
            if b >= inc * (1 - 1e-12):
                meta["pruned"] += len(kids) - i  # children are sorted: the rest are no better
                stack[-1][1] = len(kids)
                continue
            gdev[k] = d
            if depth + 1 == G:
                leaves.append(gdev.astype(np.int32))
                pending.append(b)
                gdev[k] = -1
                if len(leaves) >= leaf_batch:
                    flush()
                    pending.clear()
                continue
            stack.append([children(gdev, depth + 1, b), 0])
            if tracker.done():
                raise BudgetExhausted
        flush()
        pending.clear()
    except BudgetExhausted:
        pass  # what is left open bounds the gap below
    best = tracker.best_step_us if tracker.best_feasible else np.inf
    # what is left unexplored: untried children on the stack and unscored leaves
    rest = [kids[j][0] for kids, i in stack for j in range(i, len(kids))] + pending
    proven = best if not rest else max(root, min(min(rest), best))
    meta["status"] = "optimal" if np.isfinite(best) and best <= proven * (1 + 1e-12) else "feasible"
    meta["bound_us"] = float(proven)
    meta["gap"] = float(best / meta["bound_us"] - 1) if meta["bound_us"] > 0 and np.isfinite(best) else None
    meta["device_classes"] = int(len(np.unique(cls)))
    return meta
