"""Numpy featurisation of a placement problem for the policies (no TensorFlow here).

The policies never see single ops: the atoms they place are the graph's colocation
groups (a placement never splits one). Each atom gets a fixed-length feature vector:

- a histogram of its op types, hashed (crc32) into ``TYPE_BUCKETS`` buckets, so that
  graphs never seen in training still map onto the same inputs;
- log sizes: ops, output bytes, parameter bytes, FLOPs, bytes in and out across the
  atom's boundary, in/out degree in the atom graph;
- log compute time on the fastest allowed CPU and GPU (relative to the mean), and the
  atom's topological position (0..1);
- which devices it may use (problem.allowed), one column per device.

The GDP encoder also reads :func:`op_features` (per op: hashed type, sizes, times, the
data edges), which it pools per group itself.

Adjacency is the atom graph: an edge a -> b when some op of a feeds an op of b, weighted
by the bytes that cross. :func:`coarsen` merges atoms into at most ``max_groups``
super-groups (consecutive runs in topological order among atoms with the same allowed
devices) so that sequence policies stay tractable on graphs with thousands of groups.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

TYPE_BUCKETS = 32
#: log1p(bytes) and log1p(FLOPs) are divided by these so that features sit near [0, 1]
BYTES_SCALE = 20.0
FLOPS_SCALE = 25.0
# the columns after the type histogram, in order
COL_OPS = TYPE_BUCKETS          # log1p(ops in the atom)
COL_OUT_BYTES = TYPE_BUCKETS + 1
COL_PARAM_BYTES = TYPE_BUCKETS + 2
COL_FLOPS = TYPE_BUCKETS + 3
COL_BYTES_IN = TYPE_BUCKETS + 4
COL_BYTES_OUT = TYPE_BUCKETS + 5
COL_DEG_IN = TYPE_BUCKETS + 6
COL_DEG_OUT = TYPE_BUCKETS + 7
COL_TOPO = TYPE_BUCKETS + 8     # mean topological position of the atom's ops, 0..1
COL_T_CPU = TYPE_BUCKETS + 9
COL_T_GPU = TYPE_BUCKETS + 10
#: columns before the per-device ``allowed`` block
N_BASE = TYPE_BUCKETS + 11
#: log-scaled sums (coarsening adds them in linear space) and their scales
LOG_SUM_SCALES = {COL_OUT_BYTES: BYTES_SCALE, COL_PARAM_BYTES: BYTES_SCALE, COL_FLOPS: FLOPS_SCALE}


def type_bucket(op_type: str) -> int:
    """A stable bucket for an op type (crc32; Python's hash() is salted per process)."""
    return zlib.crc32(op_type.encode("utf-8")) % TYPE_BUCKETS


@dataclass
class AtomGraph:
    """Featurised atoms of one problem: what a policy reads.

    ``x`` (n x F float32) features; ``src``/``dst``/``w`` the atom graph's edges
    (w: log bytes, >= 0); ``allowed`` (n x D bool); ``members`` maps each problem group
    to its atom (identity unless coarsened); ``group_time`` (n x D µs, inf where not
    allowed) for repairing placements.
    """

    x: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    w: np.ndarray
    allowed: np.ndarray
    members: np.ndarray
    group_time: np.ndarray
    name: str = ""
    #: op-level features (only the GDP encoder reads them; None after coarsening)
    ops: "OpFeatures | None" = None

    @property
    def n(self) -> int:
        return len(self.x)

    @property
    def n_devices(self) -> int:
        return self.allowed.shape[1]

    def expand(self, atom_assignment: np.ndarray) -> np.ndarray:
        """Group assignment(s) of the problem from atom assignment(s) (... x n)."""
        return np.ascontiguousarray(np.asarray(atom_assignment)[..., self.members], dtype=np.int32)


def _kind_time_features(t, kinds) -> np.ndarray:
    """(n x 2) log compute time on the fastest CPU and GPU relative to the mean; -1 where none."""
    t_kind = []
    for k in ("cpu", "gpu"):
        cols = np.flatnonzero(kinds == k)
        t_kind.append(t[:, cols].min(axis=1) if cols.size else np.full(len(t), np.inf))
    t_kind = np.stack(t_kind, axis=1)
    finite = np.isfinite(t_kind)
    ref = np.mean(t_kind[finite]) if finite.any() else 1.0
    return np.where(finite, np.log1p(np.where(finite, t_kind, 0.0) / max(ref, 1e-9)), -1.0)


def group_features(problem) -> AtomGraph:
    """One atom per colocation group of ``problem`` (a :class:`placetool.search.Problem`)."""
    g = problem.graph
    G, D = problem.n_groups, problem.n_devices
    grp = g.group
    n_ops = np.bincount(grp, minlength=G).astype(np.float64)
    hist = np.zeros((G, TYPE_BUCKETS))
    buckets = {t: type_bucket(t) for t in set(g.op_types)}
    tb = np.fromiter((buckets[t] for t in g.op_types), np.int64, g.n_ops)
    np.add.at(hist, (grp, tb), 1.0)
    hist /= n_ops[:, None]
    out_b = np.bincount(grp, weights=g.out_bytes, minlength=G)
    par_b = np.bincount(grp, weights=g.param_bytes, minlength=G)
    flops = np.bincount(grp, weights=g.flops, minlength=G)
    # group-level edges with the bytes that cross between groups
    gs, gd = grp[g.edge_src], grp[g.edge_dst]
    cross = gs != gd
    eb = g.edge_bytes.astype(np.float64)
    pairs, inv = np.unique(np.stack([gs[cross], gd[cross]]), axis=1, return_inverse=True)
    w = np.bincount(inv.reshape(-1), weights=eb[cross], minlength=pairs.shape[1])
    src, dst = pairs[0].astype(np.int32), pairs[1].astype(np.int32)
    b_in = np.bincount(dst, weights=w, minlength=G)
    b_out = np.bincount(src, weights=w, minlength=G)
    deg_in = np.bincount(dst, minlength=G).astype(np.float64)
    deg_out = np.bincount(src, minlength=G).astype(np.float64)
    topo = np.bincount(grp, weights=g.topo_rank, minlength=G) / n_ops / max(g.n_ops - 1, 1)
    gt = problem.group_time
    kinds = np.array(problem.cluster.kinds)
    t_feat = _kind_time_features(gt, kinds)
    x = np.concatenate([
        hist,
        np.stack([np.log1p(n_ops), np.log1p(out_b) / BYTES_SCALE, np.log1p(par_b) / BYTES_SCALE,
                  np.log1p(flops) / FLOPS_SCALE, np.log1p(b_in) / BYTES_SCALE, np.log1p(b_out) / BYTES_SCALE,
                  np.log1p(deg_in), np.log1p(deg_out), topo], axis=1),
        t_feat,
        problem.allowed.astype(np.float64),
    ], axis=1).astype(np.float32)
    assert x.shape[1] == N_BASE + D
    return AtomGraph(x=np.ascontiguousarray(x), src=src, dst=dst, w=np.log1p(w).astype(np.float32),
                     allowed=np.ascontiguousarray(problem.allowed), members=np.arange(G, dtype=np.int32),
                     group_time=gt.copy(), name=g.name)


def coarsen(atoms: AtomGraph, max_groups: int) -> AtomGraph:
    """Merge atoms into at most about ``max_groups`` super-groups.

    Atoms are sorted by topological position; atoms with the same allowed devices are cut
    into consecutive runs (one run per ~n/max_groups atoms), so a super-group never
    joins atoms that may not share a device. The count may exceed ``max_groups`` by the
    number of distinct allowed-device patterns (each pattern gets at least one run).
    Features of a super-group are the sums (sizes, histogram weighted by ops) or means of
    its members; edges inside a super-group vanish.
    """
    n = atoms.n
    if n <= max_groups:
        return atoms
    order = np.argsort(atoms.x[:, COL_TOPO], kind="stable")
    patterns, pat = np.unique(atoms.allowed, axis=0, return_inverse=True)
    pat = pat.reshape(-1)
    label = np.empty(n, np.int64)
    next_id = 0
    per = n / max_groups
    for p in range(len(patterns)):
        idx = order[pat[order] == p]
        k = max(1, int(round(len(idx) / per)))
        chunk = (np.arange(len(idx)) * k) // len(idx)
        label[idx] = next_id + chunk
        next_id += k
    # renumber super-groups by their first member's topological position
    first = np.full(next_id, n, np.int64)
    np.minimum.at(first, label, np.argsort(order))
    rank = np.empty(next_id, np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(next_id)
    label = rank[label]
    S = next_id
    x = atoms.x.astype(np.float64)
    cnt = np.bincount(label, minlength=S).astype(np.float64)
    n_ops = np.expm1(x[:, COL_OPS])
    sn_ops = np.bincount(label, weights=n_ops, minlength=S)
    xs = np.zeros((S, x.shape[1]))
    for c in range(TYPE_BUCKETS):  # histogram weighted by op counts
        xs[:, c] = np.bincount(label, weights=x[:, c] * n_ops, minlength=S) / sn_ops
    xs[:, COL_OPS] = np.log1p(sn_ops)
    for c, sc in LOG_SUM_SCALES.items():
        xs[:, c] = np.log1p(np.bincount(label, weights=np.expm1(x[:, c] * sc), minlength=S)) / sc
    for c in range(COL_FLOPS + 1, x.shape[1]):  # means (the rest of the base columns and allowed)
        xs[:, c] = np.bincount(label, weights=x[:, c], minlength=S) / cnt
    ls, ld = label[atoms.src], label[atoms.dst]
    keep = ls != ld
    pairs, inv = np.unique(np.stack([ls[keep], ld[keep]]), axis=1, return_inverse=True)
    w = np.bincount(inv.reshape(-1), weights=np.expm1(atoms.w[keep].astype(np.float64)), minlength=pairs.shape[1])
    allowed = np.zeros((S, atoms.n_devices), bool)
    allowed[label] = atoms.allowed  # same pattern within a super-group
    gt = np.zeros((S, atoms.n_devices))
    np.add.at(gt, label, np.where(atoms.allowed, atoms.group_time, 0.0))
    gt[~allowed] = np.inf
    return AtomGraph(x=np.ascontiguousarray(xs.astype(np.float32)), src=pairs[0].astype(np.int32),
                     dst=pairs[1].astype(np.int32), w=np.log1p(w).astype(np.float32), allowed=allowed,
                     members=label[atoms.members].astype(np.int32), group_time=gt, name=atoms.name)


def featurize(problem, max_groups: int | None = None) -> AtomGraph:
    """Group features of ``problem``, coarsened to ``max_groups`` super-groups if given."""
    a = group_features(problem)
    return coarsen(a, max_groups) if max_groups else a


#: numeric columns of :func:`op_features` (besides the op-type bucket)
OP_NUMERIC = 7


@dataclass
class OpFeatures:
    """Per-op inputs of the GDP encoder: what GraphSAGE reads before pooling per group.

    ``type_id`` (ops,) hashed op-type bucket; ``x`` (ops x OP_NUMERIC) log FLOPs, output,
    parameter and input bytes, topological position, log time on the fastest CPU / GPU;
    ``src``/``dst`` the data edges with ``w`` log bytes / BYTES_SCALE; ``group`` each op's
    colocation group. Nothing here depends on the number of devices, so one encoder
    reads graphs for any cluster.
    """

    type_id: np.ndarray
    x: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    w: np.ndarray
    group: np.ndarray


def op_features(problem) -> OpFeatures:
    """Op-level features of ``problem`` (linear in ops + edges)."""
    g = problem.graph
    buckets = {t: type_bucket(t) for t in set(g.op_types)}
    tb = np.fromiter((buckets[t] for t in g.op_types), np.int32, g.n_ops)
    T = problem.cost_model.T
    kinds = np.array(problem.cluster.kinds)
    x = np.concatenate([
        np.stack([np.log1p(g.flops) / FLOPS_SCALE, np.log1p(g.out_bytes) / BYTES_SCALE,
                  np.log1p(g.param_bytes) / BYTES_SCALE, np.log1p(g.in_bytes) / BYTES_SCALE,
                  g.topo_rank / max(g.n_ops - 1, 1)], axis=1),
        _kind_time_features(np.where(np.isfinite(T), T, np.inf), kinds),
    ], axis=1).astype(np.float32)
    assert x.shape[1] == OP_NUMERIC
    w = (np.log1p(g.edge_bytes.astype(np.float64)) / BYTES_SCALE).astype(np.float32)
    return OpFeatures(type_id=tb, x=np.ascontiguousarray(x), src=np.ascontiguousarray(g.edge_src, dtype=np.int32),
                      dst=np.ascontiguousarray(g.edge_dst, dtype=np.int32), w=w,
                      group=np.ascontiguousarray(g.group, dtype=np.int32))


def graph_inputs(atoms: AtomGraph) -> dict[str, np.ndarray]:
    """What every policy reads of the atom graph: features, mask, edges and the inverse
    weighted degrees that make GraphSAGE's sums means."""
    deg_in = np.bincount(atoms.dst, weights=atoms.w + 1.0, minlength=atoms.n)
    deg_out = np.bincount(atoms.src, weights=atoms.w + 1.0, minlength=atoms.n)
    return {
        "x": atoms.x,
        "mask": atoms.allowed,
        "src": np.asarray(atoms.src, np.int32),
        "dst": np.asarray(atoms.dst, np.int32),
        "w": atoms.w + 1.0,
        "inv_in": (1.0 / np.maximum(deg_in, 1.0)).astype(np.float32)[:, None],
        "inv_out": (1.0 / np.maximum(deg_out, 1.0)).astype(np.float32)[:, None],
    }
