"""Coarse versions of a placement problem, for the multilevel search.

:func:`cluster_levels` contracts the group graph level by level, as METIS coarsens:
heavy-edge matching (the heaviest traffic between two groups first) that pairs only
groups allowed on the same devices and never makes a cluster that could not fit the
memory of the devices it may use. Each level maps every group to a cluster.

:func:`coarse_problem` turns one level into a genuinely smaller problem for the
simulator. A cluster may not simply become one op: the group graph has cycles (a
variable's group holds its read in the forward pass and its update in the backward
one), and a cluster that waits for all its inputs before it starts would lose the
pipelining between layers that placements are made for. Instead the ops are laid out in
a topological order that stays inside a cluster while it has ready ops, and each run of
one cluster in that order (cut where its work passes ``run_us``) becomes one coarse op:
its compute time on each device is the sum of its ops', its parameters their sum, and it
sends what its ops send outside the run, one tensor per set of consuming clusters. Runs follow
the order, so the coarse graph is a DAG whatever the clusters are. The runs of a cluster
form one coarse group, so a coarse assignment is one device per cluster and
:meth:`Coarse.project` gives every fine group its cluster's device.

>>> from placetool.costmodel import CostModel, presets
>>> from placetool.search import Problem
>>> p = Problem(CostModel(presets.load_graph("synthetic-1k"), presets.load_cluster("k80x4")))
>>> levels = cluster_levels(p, [200])
>>> c = coarse_problem(p, levels[0])
>>> c.problem.n_groups == levels[0].max() + 1 and c.problem.graph.n_ops < p.graph.n_ops
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from placetool.costmodel import CostModel
from placetool.costmodel.graph import ALL_KINDS, OpGraph

from .multilevel_kernels import heavy_edge_matching, sticky_segments
from .partition import undirected_group_graph
from .problem import Problem, gpu_group_time, group_memory_bytes

#: a cluster holds at most this share of the smallest memory among the devices it may use
#: (its parameters plus all its ops' outputs, an over-estimate: outputs are freed)
MEMORY_SHARE = 0.25
#: a cluster's work is at most this many times the average a level's target asks for
WORK_SLACK = 3.0


def _patterns(problem) -> np.ndarray:
    """One id per distinct row of ``problem.allowed``: groups that may merge."""
    _, inv = np.unique(problem.allowed, axis=0, return_inverse=True)
    return np.ascontiguousarray(inv.reshape(-1), np.int64)


def _contract(xadj, adjncy, w, cid, n):
    """CSR of the graph with vertices merged by ``cid`` (``n`` clusters): parallel edges
    summed, self loops dropped."""
    src = cid[np.repeat(np.arange(len(xadj) - 1), np.diff(xadj))]
    dst = cid[adjncy]
    keep = src != dst
    key = src[keep] * n + dst[keep]
    uk, inv = np.unique(key, return_inverse=True)
    ww = np.bincount(inv, weights=w[keep], minlength=len(uk))
    s = uk // n
    return np.searchsorted(s, np.arange(n + 1)).astype(np.int64), (uk % n).astype(np.int64), ww


def group_spans(problem):
    """(lo, hi) per group: the earliest start of its first op and the earliest end of
    its last, with every op on its fastest device and communication free (µs)."""
    from .bounds import _heads_tails

    g = problem.graph
    T = problem.cost_model.T
    w = np.where(np.isfinite(T), T, np.inf).min(axis=1)
    w = np.ascontiguousarray(np.where(np.isfinite(w), w, 0.0))
    ptr, succ = g.successors
    head, _ = _heads_tails(np.ascontiguousarray(g.topo_order, np.int64), w, ptr, succ)
    lo = np.full(problem.n_groups, np.inf)
    hi = np.zeros(problem.n_groups)
    np.minimum.at(lo, g.group, head)
    np.maximum.at(hi, g.group, head + w)
    return lo, hi


def cluster_levels(problem, targets, spans=None, seed: int = 0, max_rounds: int = 40,
                   assignment=None) -> list[np.ndarray]:
    """Cluster ids of every group, one array per size in ``targets`` (descending
    cluster counts): heavy-edge matching rounds on the group graph (edge weight: bytes
    between the groups) until each target is reached or matching stalls (a round that
    merges under 3% of the clusters). Levels nest: a cluster of a level is a union of
    clusters of the level before. Pairs must share allowed devices, keep their
    estimated memory within :data:`MEMORY_SHARE` of the smallest such device, their
    work within :data:`WORK_SLACK` times the target's average and, where ``spans``
    gives a level a number, the stretch of the step they cover together within that
    many µs (see :func:`group_spans`; doubled whenever matching stalls short of the
    target): such clusters are short in time, and their ops run close together. With
    ``assignment`` only groups on the same device merge, so every level holds that
    placement exactly (a V-cycle's refinement starts from it)."""
    G = problem.n_groups
    spans = [np.inf] * len(targets) if spans is None else list(spans)
    rng = np.random.default_rng(seed)
    xadj, adjncy, w = undirected_group_graph(problem)
    pattern = _patterns(problem)
    if assignment is not None:
        pattern = pattern * problem.n_devices + np.asarray(assignment, np.int64)
    vw = gpu_group_time(problem).astype(np.float64)
    vmem = group_memory_bytes(problem).astype(np.float64)
    lo, hi = group_spans(problem)
    cap = problem.cost_model.capacity.astype(np.float64)
    smallest = np.where(problem.allowed, cap[None, :], np.inf).min(axis=1)
    max_mem = float(MEMORY_SHARE * smallest.min()) if G else 0.0
    total = float(vw.sum())
    of_group = np.arange(G, dtype=np.int64)
    n = G
    out = []
    for target, span in zip(targets, spans):
        max_vw = max(WORK_SLACK * total / max(int(target), 1), float(vw.max(initial=0.0)))
        span = np.inf if span is None else float(span)
        for _ in range(max_rounds):
            if n <= target:
                break
            # light vertices first, in random order among equals: they find partners
            # before heavy ones take them, which keeps the clusters' work even
            order = np.lexsort((rng.random(n), np.floor(np.log2(vw + 1e-9)))).astype(np.int64)
            cid, m = heavy_edge_matching(xadj, adjncy, w, order, pattern, vw, vmem, lo, hi, max_vw, max_mem, span)
            if m > 0.97 * n:
                if not np.isfinite(span):
                    break
                span *= 2.0  # stalled by the span: let clusters stretch further
                continue
            xadj, adjncy, w = _contract(xadj, adjncy, w, cid, m)
            vw = np.bincount(cid, weights=vw, minlength=m)
            vmem = np.bincount(cid, weights=vmem, minlength=m)
            first = np.full(m, n, np.int64)
            np.minimum.at(first, cid, np.arange(n))
            pattern = pattern[first]
            lo2, hi2 = np.full(m, np.inf), np.zeros(m)
            np.minimum.at(lo2, cid, lo)
            np.maximum.at(hi2, cid, hi)
            lo, hi = lo2, hi2
            of_group = cid[of_group]
            n = m
        out.append(of_group.copy())
    return out


@dataclass
class Coarse:
    """A coarse problem and how it maps to the fine one."""

    problem: Problem
    #: fine group -> coarse group
    of_group: np.ndarray
    #: fine op -> coarse op (the run it is in)
    of_op: np.ndarray

    @property
    def n_clusters(self) -> int:
        return self.problem.n_groups

    def project(self, coarse_assignment) -> np.ndarray:
        """The fine group assignment that puts every group on its cluster's device."""
        return np.ascontiguousarray(np.asarray(coarse_assignment)[self.of_group], np.int32)

    def restrict(self, fine_assignment, problem) -> np.ndarray:
        """A coarse assignment from a fine one: each cluster on the device that holds
        most of its groups' work (where the cluster may run)."""
        a = np.asarray(fine_assignment, np.int64)
        C, D = self.n_clusters, problem.n_devices
        w = gpu_group_time(problem) + 1e-9
        votes = np.bincount(self.of_group * D + a, weights=w, minlength=C * D).reshape(C, D)
        votes[~self.problem.allowed] = -1.0
        return np.argmax(votes, axis=1).astype(np.int32)


def _runs(problem, cluster, run_us):
    """Run (coarse op) of every op and the number of runs; see :func:`sticky_segments`."""
    g, cm = problem.graph, problem.cost_model
    T = cm.T
    fastest = np.where(np.isfinite(T), T, np.inf).min(axis=1)
    fastest = np.where(np.isfinite(fastest), fastest, 0.0)
    op_cl = np.ascontiguousarray(cluster[g.group], np.int64)
    ptr, succ = g.successors
    n_pred = np.bincount(g.edge_dst, minlength=g.n_ops).astype(np.int64)
    seg, nseg = sticky_segments(np.ascontiguousarray(g.topo_rank, np.int64), ptr, succ, n_pred, op_cl,
                                int(cluster.max()) + 1, fastest, float(run_us))
    if np.any(seg < 0):
        raise ValueError(f"graph {g.name!r} has a cycle")
    return seg, int(nseg), op_cl


def _tensors(g, seg, op_cl, nseg, ncl):
    """The coarse tensors: the fine tensors a run sends outside itself, summed per set of
    clusters that consume them, so a coarse tensor goes to each device once, as its
    fine tensors would; returns (tensor_op, tensor_bytes, edge_src, edge_dst,
    edge_tensor, out_bytes per run)."""
    data = np.flatnonzero(g.edge_tensor >= 0)
    t = g.edge_tensor[data].astype(np.int64)
    dst = g.edge_dst[data]
    ext = seg[g.tensor_op[t]] != seg[dst]
    t, dst = t[ext], dst[ext]
    # a consumer set's signature: the sum of a random 64-bit word per cluster in it
    # (wrapping; two sets collide with odds of about 2**-64)
    word = np.random.default_rng(0).integers(1, 1 << 62, ncl, dtype=np.int64).astype(np.uint64)
    pair = np.unique(t * ncl + op_cl[dst])
    pt = pair // ncl
    sig = np.zeros(g.n_tensors, np.uint64)
    np.add.at(sig, pt, word[pair % ncl])
    ext_t = np.unique(pt)
    run = seg[g.tensor_op[ext_t]]
    keys = np.stack([run.astype(np.uint64), sig[ext_t]])
    _, first, inv = np.unique(keys, axis=1, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    # np.unique sorts by run first: coarse tensors come out sorted by producer
    tbytes = np.bincount(inv, weights=g.tensor_bytes[ext_t], minlength=len(first)).astype(np.int64)
    tensor_op = run[first]
    ct = np.full(g.n_tensors, -1, np.int64)
    ct[ext_t] = inv
    ekey = np.unique(ct[t] * nseg + seg[dst])
    e_t, e_dst = ekey // nseg, ekey % nseg
    out_bytes = np.bincount(tensor_op, weights=tbytes, minlength=nseg)
    return tensor_op, tbytes, tensor_op[e_t], e_dst, e_t, out_bytes.astype(np.int64)


def coarse_graph(problem, cluster, run_us: float | None = None, runs_per_cluster: float = 4.0):
    """The coarse OpGraph of a clustering (see the module docstring) and its op times:
    (graph, T, run per fine op). ``run_us`` caps a run's work on its fastest device
    (default: the clusters' total work over ``runs_per_cluster`` times their number, so
    a few runs per cluster keep the pipelining between them)."""
    g, cm = problem.graph, problem.cost_model
    cluster = np.asarray(cluster, np.int64)
    ncl = int(cluster.max()) + 1
    if run_us is None:
        total = float(gpu_group_time(problem).sum())
        run_us = max(total / (runs_per_cluster * ncl), 1e-9)
    seg, nseg, op_cl = _runs(problem, cluster, run_us)
    run_cl = np.empty(nseg, np.int64)
    run_cl[seg] = op_cl
    tensor_op, tbytes, e_src, e_dst, e_t, out_bytes = _tensors(g, seg, op_cl, nseg, ncl)
    ctrl = np.flatnonzero(g.edge_tensor < 0)
    ck = np.unique(seg[g.edge_src[ctrl]] * nseg + seg[g.edge_dst[ctrl]])
    cs, cd = ck // nseg, ck % nseg
    cs, cd = cs[cs != cd], cd[cs != cd]
    T = np.zeros((nseg, problem.n_devices))
    np.add.at(T, seg, cm.T)  # inf stays inf: the run's cluster may not use that device
    allowed = np.full(nseg, ALL_KINDS, np.uint8)
    np.bitwise_and.at(allowed, seg, g.allowed)
    layer = np.full(nseg, -1, np.int32)
    layer[seg[::-1]] = g.layer[::-1]  # a run's first op's tag
    cg = OpGraph.from_arrays(
        f"{g.name}/coarse{ncl}", [f"c{c}/r{r}" for r, c in enumerate(run_cl)], ["Cluster"] * nseg, out_bytes,
        np.concatenate([e_src, cs]), np.concatenate([e_dst, cd]),
        edge_tensor=np.concatenate([e_t, np.full(len(cs), -1)]), tensor_op=tensor_op, tensor_bytes=tbytes,
        param_bytes=np.bincount(seg, weights=g.param_bytes, minlength=nseg).astype(np.int64),
        flops=np.bincount(seg, weights=g.flops, minlength=nseg), group=run_cl, allowed=allowed, layer=layer,
        meta={"coarse_of": g.name, "clusters": ncl, "run_us": float(run_us)})
    return cg, T, seg


def coarse_problem(problem, cluster, run_us: float | None = None, runs_per_cluster: float = 4.0) -> Coarse:
    """The coarse :class:`Problem` of a clustering (``cluster``: cluster id per fine
    group, as :func:`cluster_levels` gives), on the same cluster of devices."""
    cg, T, seg = coarse_graph(problem, cluster, run_us, runs_per_cluster)
    cm = CostModel(cg, problem.cluster, op_times=T)
    cm.capacity = problem.cost_model.capacity.copy()
    # OpGraph numbers groups by first appearance: map the clusters to its numbering
    run_group = cg.group
    of_cluster = np.empty(int(np.max(cluster)) + 1, np.int64)
    of_cluster[np.asarray(cluster)[problem.graph.group]] = run_group[seg]
    return Coarse(Problem(cm), of_cluster[np.asarray(cluster)], seg)
