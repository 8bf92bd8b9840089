"""``exact``: proven optimal placements of small problems, by branch and bound.

Groups are fixed one at a time, each to every device it may still use; a partial
assignment is dropped once a lower bound on every completion of it is no better than the
best placement simulated so far. Each node first tries every free group on every device
(probing, :func:`expand`): devices that cannot win leave the group's domain for the
whole subtree, and the group with the fewest devices left is fixed next (fail first).
Below ``probe_depth`` levels, and on problems of more than :data:`PROBE_GROUPS` groups,
groups are fixed in the order of :func:`branching_order` (heavy groups and their
neighbours first). Complete assignments are scored by the simulator itself (through the
tracker), so "optimal" means optimal for the simulator's rules, memory included. Devices
that can be swapped without changing anything (same op times, memory and links) are
interchangeable: only the first unused one of a class is tried, which removes their
permutations.

The bound of a partial assignment (:func:`partial_bound`, in
:mod:`placetool.search.exact_bound`) is the largest of: the
problem's lower bound (:mod:`placetool.search.bounds`); the earliest the last op can end
with unlimited devices, fixed ops on their devices, free ops on whichever device ends
them first, every transfer between devices paying latency + bytes / bandwidth, and an
op's inputs from one device reaching it one after another over their link; each
device's fixed ops as one machine with those earliest starts and the least time after
each op to the end of the step (pre-emptive, so a bound); each directed link the same
way, its jobs the tensors fixed ops send to fixed consumers across it; and the level all
work reaches when the free work is poured over the devices' fixed work. Each relaxes the
simulator's rules, so completions can only be slower. Complete assignments are bounded
too, and only those below the incumbent are simulated.

Before the tree, under a seconds budget, CP-SAT solves placement and schedule together
(:mod:`placetool.search.schedule_bound`, at most ``schedule_share`` of the budget): the
least step time of any schedule of any placement under the simulator's resource rules.
It bounds every placement at once, so the reported bound is at least it; where it
reaches the incumbent, that is proven optimal without a tree node. Its placement is
scored as one more candidate. The simulator runs one greedy schedule, which on these
problems is a few percent slower than the best one, so this bound rarely proves an
optimum by itself, but it leaves gaps of a few percent where the tree's open nodes
leave tens of percent. The tree is walked by compiled
code (:func:`branch`) that hands back batches of leaves for the simulator.

The search starts from the best placement of a short ``sa`` run (0.1 s per group, at
least 1 s and at most ``incumbent_share`` of a time budget; the seeding methods alone
under an evaluation budget), and every leaf
that beats the incumbent is taken down to its local optimum over single-group moves
(:func:`descend`) before the walk goes on: the tree finds new basins, the descent their
floors, and each µs off the incumbent prunes more of the tree. When the budget ends first the
result is the best placement seen with a proven gap: ``metadata["status"]`` is
``optimal`` or ``feasible``, ``metadata["bound_us"]`` the proven lower bound and
``metadata["gap"]`` = best / bound - 1. Meant for small problems (random 28-group DAGs
on 3 devices are proven within 10 s, 32-group ones within 20 s, see ``benchmarks/exact.py``):
the tree grows as devices^groups where the bound does not cut it.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import numpy as np
from numba import njit

# the bound's kernels (also importable from here, as before they moved)
from .exact_bound import (Ops, Work, bound_into, fill_level, make_ops, make_work, one_machine_bound,  # noqa: F401
                          partial_bound)
from .registry import Count, Seeds, Share, Size, get, register
from .seeding import seed_assignments
from .tracker import Budget, BudgetExhausted


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


class Tree(NamedTuple):
    """The branch-and-bound tree's state, kept between calls of :func:`branch`."""

    gdev: np.ndarray  # int64 [G]: device of each group, -1 while free
    gorder: np.ndarray  # int64 [G]: group fixed at each depth
    static: np.ndarray  # int64 [G]: the order groups are fixed in below the probed depths
    dom: np.ndarray  # bool [P + 1, G, D]: devices each group may still take, per probed depth
    probe: np.ndarray  # float64 [G, D]: scratch of expand, bounds of one-group extensions
    probe_depth: int  # P: levels probed (no domain shrinks below them)
    allowed: np.ndarray  # bool [G, D]
    cls: np.ndarray  # int64 [D]: device class (see :func:`device_classes`)
    kid_dev: np.ndarray  # int64 [G, D]: children of each depth on the path, best bound first
    kid_bound: np.ndarray  # float64 [G, D]
    n_kids: np.ndarray  # int64 [G]
    next_kid: np.ndarray  # int64 [G]
    leaves: np.ndarray  # int32 [batch, G]: complete assignments waiting for the simulator
    leaf_bound: np.ndarray  # float64 [batch]
    count: np.ndarray  # int64 [4]: depth of the path, nodes visited, pruned, leaves waiting
    work: Work  # the bound's scratch arrays
    used: np.ndarray  # bool [D]: scratch of expand
    tried: np.ndarray  # bool [D]


#: problems with more groups are not probed by default: a probe costs groups x devices
#: bounds per node, each over the whole graph
PROBE_GROUPS = 64

#: work of one compiled call of :func:`branch`, in (ops + edges) x devices per node times
#: nodes: a node bounds each device's child over the whole graph, ~30 ns per unit, so a
#: call takes ~50 ms and the budget is checked that often on graphs of any size
CALL_WORK = 1_600_000


def make_tree(problem, gorder, cls, batch: int, probe_depth: int | None = None) -> Tree:
    G, D = problem.n_groups, problem.n_devices
    P = min(G, (G if G <= PROBE_GROUPS else 0) if probe_depth is None else probe_depth)
    return Tree(
        gdev=np.full(G, -1, np.int64), gorder=np.ascontiguousarray(gorder, np.int64).copy(),
        static=np.ascontiguousarray(gorder, np.int64),
        dom=np.repeat(np.asarray(problem.allowed, np.bool_)[None], P + 1, 0),
        probe=np.zeros((G, D)), probe_depth=P,
        allowed=np.ascontiguousarray(problem.allowed, np.bool_), cls=np.ascontiguousarray(cls, np.int64),
        kid_dev=np.zeros((G, D), np.int64), kid_bound=np.zeros((G, D)), n_kids=np.zeros(G, np.int64),
        next_kid=np.zeros(G, np.int64), leaves=np.zeros((batch, G), np.int32), leaf_bound=np.zeros(batch),
        count=np.zeros(4, np.int64), work=make_work(problem.graph.n_ops, D), used=np.zeros(D, np.bool_),
        tried=np.zeros(D, np.bool_),
    )


@njit(cache=True)
def _stands_for_class(d, used, tried, cls):
    """Whether device ``d`` is tried: a used device always, of a class's unused devices
    only the first (``tried`` marks the classes already seen)."""
    if used[d]:
        return True
    if tried[cls[d]]:
        return False
    tried[cls[d]] = True
    return True


@njit(cache=True)
def expand(tree, ops, depth, parent, incumbent):
    """Choose the group the node at ``depth`` fixes and bound its children (the group on
    each device it may still take; no child below ``parent``, the path's own bound),
    sorted by (bound, device). Of a device class's unused devices only the first is
    tried: the others give the same step times.

    Above ``tree.probe_depth`` every free group is tried on every device it may take:
    a device whose bound reaches ``incumbent`` leaves that group's domain for the whole
    subtree, a group left without devices kills the node, the least bound of each group
    bounds every child, and the group with the fewest devices left is fixed (ties: the
    highest least bound). Below, groups are fixed in ``tree.static`` order. The last
    free group's children are not bounded: each is a leaf, with the node's bound."""
    G, D = tree.allowed.shape
    P = tree.probe_depth
    used, tried, kb, gdev, cls = tree.used, tree.tried, tree.probe, tree.gdev, tree.cls
    dom = tree.dom[min(depth, P)]  # below the probed levels the domains stay as they were there
    used[:] = False
    for x in range(G):
        if gdev[x] >= 0:
            used[gdev[x]] = True
    cut = incumbent * (1 - 1e-12)
    floor = parent
    k = -1
    last = depth == G - 1  # the last free group: its children are leaves
    if depth < P and not last:
        fewest = D + 1
        high = -np.inf
        for g in range(G):
            if gdev[g] >= 0:
                continue
            tried[:] = False
            left = 0
            low = np.inf
            for d in range(D):
                if not dom[g, d] or not _stands_for_class(d, used, tried, cls):
                    continue
                gdev[g] = d
                b = max(parent, bound_into(gdev, ops, tree.work))
                gdev[g] = -1
                kb[g, d] = b
                if b >= cut:  # no completion with g on d (or on an unused twin of d) can win
                    for d2 in range(D):
                        if d2 == d or (not used[d] and not used[d2] and cls[d2] == cls[d]):
                            dom[g, d2] = False
                else:
                    left += 1
                    low = min(low, b)
            if left == 0:
                tree.n_kids[depth] = 0
                tree.next_kid[depth] = 0
                return
            floor = max(floor, low)
            if left < fewest or (left == fewest and low > high):
                k, fewest, high = g, left, low
    else:
        for i in range(G):
            if gdev[tree.static[i]] < 0:
                k = tree.static[i]
                break
    tree.gorder[depth] = k
    tried[:] = False
    m = 0
    for d in range(D):
        if not dom[k, d] or not _stands_for_class(d, used, tried, cls):
            continue
        if last:
            b = parent  # the simulator scores a leaf exactly for less than a bound costs
        elif depth < P:
            b = max(floor, kb[k, d])
        else:
            gdev[k] = d
            b = max(parent, bound_into(gdev, ops, tree.work))
            gdev[k] = -1
        j = m
        while j > 0 and tree.kid_bound[depth, j - 1] > b:
            tree.kid_bound[depth, j] = tree.kid_bound[depth, j - 1]
            tree.kid_dev[depth, j] = tree.kid_dev[depth, j - 1]
            j -= 1
        tree.kid_bound[depth, j] = b
        tree.kid_dev[depth, j] = d
        m += 1
    tree.n_kids[depth] = m
    tree.next_kid[depth] = 0


@njit(cache=True)
def branch(tree, ops, incumbent, max_nodes):
    """Depth-first search from where the tree stands until ``max_nodes`` nodes are
    visited, the leaf batch is full or the tree is done (depth 0). Children bounded no
    better than ``incumbent`` are pruned with their later siblings."""
    G = tree.gdev.shape[0]
    c = tree.count
    steps = 0
    while c[0] > 0 and steps < max_nodes and c[3] < tree.leaves.shape[0]:
        depth = c[0] - 1
        i = tree.next_kid[depth]
        if i >= tree.n_kids[depth]:
            c[0] -= 1
            if c[0] > 0:
                tree.gdev[tree.gorder[c[0] - 1]] = -1
            continue
        tree.next_kid[depth] = i + 1
        b = tree.kid_bound[depth, i]
        steps += 1
        c[1] += 1
        if b >= incumbent * (1 - 1e-12):
            c[2] += tree.n_kids[depth] - i
            tree.next_kid[depth] = tree.n_kids[depth]
            continue
        k = tree.gorder[depth]
        tree.gdev[k] = tree.kid_dev[depth, i]
        if depth + 1 == G:
            for x in range(G):
                tree.leaves[c[3], x] = tree.gdev[x]
            tree.leaf_bound[c[3]] = b
            c[3] += 1
            tree.gdev[k] = -1
            continue
        if depth < tree.probe_depth:
            tree.dom[depth + 1] = tree.dom[depth]
        expand(tree, ops, depth + 1, b, incumbent)
        c[0] += 1


def branching_order(problem, ops, affinity: float = 0.5) -> np.ndarray:
    """Groups in the order the tree fixes them: first the one with the most work (each
    op on its fastest device), then each time the one with the most work plus
    ``affinity`` times the transfer time (the slowest link's) of its edges to groups
    already ordered; ties in topological order. Heavy groups fixed early make the
    devices' loads tell; neighbours fixed together make their transfers tell.

    >>> from placetool.costmodel import CostModel, presets
    >>> from placetool.search import Problem
    >>> p = Problem(CostModel(presets.load_graph("synthetic-40"), presets.load_cluster("k80x2")))
    >>> order = branching_order(p, make_ops(p))
    >>> sorted(order.tolist()) == list(range(p.n_groups))
    True
    """
    g = problem.graph
    G = problem.n_groups
    first = np.full(G, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, g.group, g.topo_rank.astype(np.int64))
    work = np.zeros(G)
    np.add.at(work, g.group, ops.T.min(axis=1))
    # group adjacency (both directions), weighted by transfer time
    a, b = g.group[ops.out_src], g.group[ops.out_dst]
    c = ops.out_comm.max(axis=(1, 2)) if len(ops.out_dst) else np.zeros(0)
    keep = a != b
    src, dst, w = np.concatenate([a[keep], b[keep]]), np.concatenate([b[keep], a[keep]]), np.tile(c[keep], 2)
    o = np.argsort(src, kind="stable")
    dst, w = dst[o], w[o]
    ptr = np.searchsorted(src[o], np.arange(G + 1))
    pull = np.zeros(G)
    left = np.ones(G, bool)
    order = np.empty(G, np.int64)
    # a max-heap of (score, first) with stale entries skipped: scores only grow, so a
    # group's newest entry is its current one (a scan per pick was O(groups^2): 4 s on
    # gnmt8's 47k groups)
    heap = [(-float(work[k]), int(first[k]), k) for k in range(G)]
    heapq.heapify(heap)
    for i in range(G):
        while True:
            neg, _, k = heapq.heappop(heap)
            if left[k] and -neg == work[k] + affinity * pull[k]:
                break
        order[i], left[k] = k, False
        nb = dst[ptr[k]:ptr[k + 1]]
        np.add.at(pull, nb, w[ptr[k]:ptr[k + 1]])
        for j in np.unique(nb[left[nb]]).tolist():
            heapq.heappush(heap, (-float(work[j] + affinity * pull[j]), int(first[j]), j))
    return order


def descend(problem, tracker, assignment, step_us: float, batch: int = 256) -> float:
    """Steepest descent over single-group moves from ``assignment`` (simulated at
    ``step_us``): every group on every other device it may use, scored through
    ``tracker`` in batches of ``batch``, the best taken while it is faster. Returns the step time
    reached (``step_us`` if no move is faster); the tracker holds every placement scored.

    >>> import networkx as nx
    >>> from placetool.costmodel import CostModel, OpGraph, presets
    >>> from placetool.search import Budget, Problem, Tracker
    >>> g = nx.DiGraph([("a", "b")])
    >>> for v in g: g.nodes[v].update(op_type="MatMul", out_bytes=10**7, flops=10**9)
    >>> p = Problem(CostModel(OpGraph.from_networkx(g, "pair"), presets.load_cluster("k80x2")))
    >>> split = np.array([1, 2])  # a on gpu:0, b on gpu:1: 10 MB cross a link
    >>> step = float(p.cost_model.simulate_batch(split[None].astype(np.int32)).step_time_us[0])
    >>> descend(p, Tracker(p, Budget(evals=100)), split, step) < step  # one GPU for both
    True
    """
    a = np.array(assignment, np.int32)
    others = np.arange(problem.n_devices)[None, :]
    while True:
        g_idx, d_idx = np.nonzero(problem.allowed & (others != a[:, None]))
        best, best_step = None, step_us
        # in batches, so a large problem neither holds every move in memory nor
        # overruns a time budget by one huge batch
        for lo in range(0, len(g_idx), batch):
            hi = min(lo + batch, len(g_idx))
            moves = np.repeat(a[None, :], hi - lo, axis=0)
            moves[np.arange(hi - lo), g_idx[lo:hi]] = d_idx[lo:hi]
            r = tracker.evaluate(moves)  # BudgetExhausted when the budget ends
            step = np.where(r.feasible, r.step_time_us, np.inf)
            j = int(np.argmin(step))
            if step[j] < best_step:
                best, best_step = r.assignments[j].copy(), float(step[j])
        if best is None:
            return step_us
        a, step_us = best, best_step


#: seconds of ``sa`` incumbent per group (at least 1 s, at most ``incumbent_share`` of the budget)
INCUMBENT_SECONDS_PER_GROUP = 0.1
#: the least time worth giving the schedule bound: its solver's process takes ~0.6 s to start
MIN_SCHEDULE_SECONDS = 1.0


def _schedule_bound(problem, budget, seed, tracker, share: float, leaf_batch: int, meta: dict) -> float:
    """The schedule bound (:mod:`placetool.search.schedule_bound`) within ``share`` of a
    seconds budget, its best schedule's placement scored (and descended from when it
    beats the incumbent); returns the bound, 0 where it was not computed (the reason in
    ``meta["schedule"]``)."""
    from . import schedule_bound as sb

    meta["schedule_bound_us"] = None
    if not share > 0:
        meta["schedule"] = "off (schedule_share=0)"
    elif budget.seconds is None:
        meta["schedule"] = "skipped: needs a seconds budget"
    elif not sb.available():
        meta["schedule"] = "skipped: OR-Tools is not installed (pip install 'placetool[exact]')"
    elif sb.model_size(problem) > sb.MAX_INTERVALS:
        meta["schedule"] = f"skipped: {sb.model_size(problem):,} intervals > {sb.MAX_INTERVALS:,}"
    if "schedule" in meta:
        return 0.0
    seconds = min(budget.seconds * share, budget.seconds - tracker.seconds)
    if seconds < MIN_SCHEDULE_SECONDS:
        meta["schedule"] = f"skipped: {max(seconds, 0):.2f} s of the budget left"
        return 0.0
    b = sb.schedule_bound(problem, seconds, seed=seed)
    meta.update(schedule=b.status, schedule_seconds=b.seconds)
    if b.status.startswith("failed"):
        return 0.0
    meta["schedule_bound_us"] = float(b.bound_us)
    if b.assignment is not None and not tracker.done():
        r = tracker.evaluate(b.assignment[None])
        if r.feasible[0] and r.step_time_us[0] < meta["incumbent_us"]:
            descend(problem, tracker, r.assignments[0], float(r.step_time_us[0]), leaf_batch)
            meta["descents"] += 1
    return float(b.bound_us)


@register("exact", budget=Budget(seconds=60.0))
def exact(problem, budget, seed, tracker, leaf_batch: Count = 256, seeds: Seeds | None = None,
          incumbent_share: Share = 0.2, schedule_share: Share = 0.3, chunk: Count = 4096,
          probe_depth: Size | None = None):
    """Branch and bound over group assignments: optimal, or the best with a proven gap.
    ``schedule_share``: at most this share of a seconds budget goes to the schedule
    bound (CP-SAT, see :mod:`placetool.search.schedule_bound`; 0: off). ``probe_depth``:
    how many levels of the tree try every free group before choosing one (see
    :func:`expand`); None = all of them on problems of up to :data:`PROBE_GROUPS`
    groups, none on larger ones; 0 = fixed order only. ``chunk``: at most this many
    nodes per compiled call between budget checks (fewer on large graphs, see
    :data:`CALL_WORK`)."""
    G = problem.n_groups
    meta = {"status": "feasible", "nodes": 0, "pruned": 0, "leaves": 0, "descents": 0}
    # a good first incumbent prunes most of the tree: the seeding methods, then (under a
    # time budget) a short annealing run from the best of them
    if budget.seconds and incumbent_share > 0:
        # on small problems a few seconds of annealing find what a minute does, and the
        # tree proves them in less: the sa share grows with the groups
        share = min(budget.seconds * incumbent_share, max(1.0, INCUMBENT_SECONDS_PER_GROUP * G))
        with tracker.sub_budget(share):
            try:
                get("sa")(problem, budget, seed, tracker, seeds=seeds)
            except BudgetExhausted:
                pass
    else:
        seed_assignments(problem, budget, seed, tracker, names=seeds, share=0.1)
    meta["incumbent_us"] = float(tracker.best_feasible_us)
    try:
        sched = _schedule_bound(problem, budget, seed, tracker, schedule_share, leaf_batch, meta)
    except BudgetExhausted:
        sched = meta["schedule_bound_us"] or 0.0
    inc = tracker.best_feasible_us

    ops = make_ops(problem)
    root = problem.lower_bound_us()
    cls = device_classes(problem)
    tree = make_tree(problem, branching_order(problem, ops), cls, leaf_batch, probe_depth)
    c = tree.count
    # nodes per call: all of ``chunk`` on small problems; on a large graph a node costs
    # milliseconds, and 4,096 of them would overrun a budget by a minute
    per_node = (problem.graph.n_ops + len(ops.out_dst)) * problem.n_devices
    nodes = int(max(1, min(chunk, CALL_WORK // max(per_node, 1))))
    meta["nodes_per_call"] = nodes
    unscored = np.zeros(0)  # bounds of leaves the budget left unsimulated
    try:
        if G and sched < inc:  # (the best schedule no shorter than the incumbent proves it)
            expand(tree, ops, 0, root, inc)  # every bound below is at least the root's
            c[0] = 1
        while True:
            branch(tree, ops, inc, nodes)
            n = int(c[3])
            if n:
                unscored = tree.leaf_bound[:n].copy()
                r = tracker.evaluate(tree.leaves[:n])  # BudgetExhausted when the budget ends
                scored = len(r.step_time_us)
                unscored = unscored[scored:]
                meta["leaves"] += scored
                c[3] = 0
                step = np.where(r.feasible, r.step_time_us, np.inf)
                i = int(np.argmin(step))
                if step[i] < inc:
                    # a leaf in a new basin: its local optimum is often better still, and
                    # every µs off the incumbent prunes the rest of the tree
                    inc = descend(problem, tracker, r.assignments[i], float(step[i]), leaf_batch)
                    meta["descents"] += 1
                if len(unscored):
                    raise BudgetExhausted
            if c[0] == 0:
                break
            if tracker.done():
                raise BudgetExhausted
    except BudgetExhausted:
        pass  # what is left open bounds the gap below
    meta["nodes"], meta["pruned"] = int(c[1]), int(c[2])
    best = tracker.best_feasible_us
    # what is left unexplored: untried children on the path and unscored leaves
    rest = [tree.kid_bound[d, j] for d in range(int(c[0])) for j in range(tree.next_kid[d], tree.n_kids[d])]
    rest += unscored.tolist()
    proven = best if not rest else max(root, sched, min(min(rest), best))
    proven = min(proven, best)
    meta["status"] = "optimal" if np.isfinite(best) and best <= proven * (1 + 1e-12) else "feasible"
    meta["bound_us"] = float(proven)
    meta["gap"] = float(best / meta["bound_us"] - 1) if meta["bound_us"] > 0 and np.isfinite(best) else None
    meta["device_classes"] = int(len(np.unique(cls)))
    return meta
