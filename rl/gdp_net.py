"""The gdp policy's network, written once over a handful of array operations.

TensorFlow runs it to train (:class:`placetool.rl.policies.GDP` passes :func:`tf_ops`), and
numpy runs it where nothing is trained: a zero-shot placement with a saved network
(``--init-from gdp --budget-evals 1``) then needs no TensorFlow, whose import alone
takes 2-7 s.

Example: the shipped network's logits for synthetic-160's groups on k80x4::

    >>> from placetool.costmodel import CostModel, presets
    >>> from placetool.search import Problem
    >>> from placetool.rl import gdp_net, policies
    >>> from placetool.rl.method import bundled_policy
    >>> p = Problem(CostModel(presets.load_graph("synthetic-160"), presets.load_cluster("k80x4")))
    >>> folder = bundled_policy("gdp")
    >>> _, cfg, _, ws = policies.read(folder, n_devices=p.n_devices)
    >>> w = gdp_net.checked_weights(folder, cfg, ws)
    >>> atoms = gdp_net.atoms(p, cfg["max_devices"])
    >>> gdp_net.logits(gdp_net.NUMPY, w, gdp_net.inputs(atoms), cfg["tanh_c"]).shape
    (142, 5)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .errors import PolicyError
from .features import N_BASE, OP_NUMERIC, TYPE_BUCKETS, AtomGraph, graph_inputs, group_features, op_features

#: the norm every GraphSAGE layer's states are scaled to
SAGE_NORM = 4.0


class Weights(NamedTuple):
    """The network's weights; a dense layer is a (W, b) pair. The field order is the
    order a policy creates its variables in, and so the order they are saved in."""

    type_emb: Any
    op_in: tuple
    op_sage: list
    grp_in: tuple
    grp_sage: list
    ctx: tuple
    head: tuple
    prior_w: Any


def unflatten(ws, layers: int, group_layers: int) -> Weights:
    """:class:`Weights` from the flat list a saved policy holds; ValueError if it does not fit."""
    ws = list(ws)
    if len(ws) != 1 + 2 + 2 * layers + 2 + 2 * group_layers + 2 + 2 + 1:
        raise ValueError(f"{len(ws)} weight arrays do not fit a gdp network with {layers} op and "
                         f"{group_layers} group layers")
    it = iter(ws)

    def dense():
        return next(it), next(it)

    return Weights(next(it), dense(), [dense() for _ in range(layers)], dense(),
                   [dense() for _ in range(group_layers)], dense(), dense(), next(it))


def shapes(hidden: int, layers: int, group_layers: int, max_devices: int) -> list[tuple]:
    """The shape of each weight array, in saved order."""
    H, sage = hidden, [(3 * hidden, hidden), (hidden,)]
    return [(TYPE_BUCKETS, H), (OP_NUMERIC, H), (H,), *sage * layers, (H + N_BASE, H), (H,),
            *sage * group_layers, (H, H), (H,), (H, max_devices), (max_devices,), ()]


def checked_weights(folder, cfg: dict, ws) -> Weights:
    """The :class:`Weights` of a saved gdp policy (``cfg`` and ``ws`` as
    :func:`placetool.rl.policies.read` gives them); PolicyError names a size or shape that
    does not fit (:func:`placetool.rl.policies.gdp_weights` also refuses unknown keys)."""
    try:
        dims = [int(cfg[k]) for k in ("hidden", "layers", "group_layers", "max_devices")]
        float(cfg["tanh_c"])
    except (KeyError, TypeError, ValueError) as e:
        raise PolicyError(f"{folder}/policy.json: configuration does not fit a 'gdp' policy ({e!r})") from None
    want = shapes(*dims)
    if [np.shape(x) for x in ws] != want:
        raise PolicyError(f"{folder}/weights.npz: saved weights do not fit a 'gdp' policy with this configuration")
    return unflatten([np.asarray(x, np.float32) for x in ws], dims[1], dims[2])


def check_devices(problem, max_devices: int) -> None:
    """PolicyError when ``problem``'s cluster has more devices than the network's slots."""
    if problem.n_devices > max_devices:
        raise PolicyError(f"policy 'gdp' places on at most {max_devices} devices; cluster "
                          f"{problem.cluster.name!r} has {problem.n_devices}")


def atoms(problem, max_devices: int) -> AtomGraph:
    """The atoms gdp places: one per colocation group, with op-level features."""
    check_devices(problem, max_devices)
    a = group_features(problem)
    a.ops = op_features(problem)
    return a


def op_inputs(atoms: AtomGraph) -> dict[str, np.ndarray]:
    """What gdp reads besides :func:`~placetool.rl.features.graph_inputs`: the op graph,
    each op's group, and the compute-time prior (log time on a device over the group's
    fastest allowed one)."""
    if atoms.ops is None:
        raise PolicyError("policy 'gdp' needs op-level features (use policy.atoms_for(problem))")
    ops = atoms.ops
    n_op = len(ops.type_id)
    ones = np.ones_like(ops.w)
    deg_in = np.bincount(ops.dst, weights=ones, minlength=n_op)
    deg_out = np.bincount(ops.src, weights=ones, minlength=n_op)
    cnt = np.bincount(ops.group, minlength=atoms.n)
    t = atoms.group_time
    fast = np.min(t, axis=1, keepdims=True)
    prior = np.where(atoms.allowed, -np.log(np.maximum(t, 1e-9) / np.maximum(fast, 1e-9)), 0.0)
    return {
        "op_type": np.asarray(ops.type_id, np.int32), "op_x": ops.x,
        "op_src": np.asarray(ops.src, np.int32), "op_dst": np.asarray(ops.dst, np.int32),
        "op_w": ops.w[:, None] + 1.0,
        "op_inv_in": (1.0 / np.maximum(deg_in, 1.0)).astype(np.float32)[:, None],
        "op_inv_out": (1.0 / np.maximum(deg_out, 1.0)).astype(np.float32)[:, None],
        "op_group": np.asarray(ops.group, np.int32),
        "inv_group": (1.0 / np.maximum(cnt, 1)).astype(np.float32)[:, None],
        "prior": np.maximum(prior, -10.0).astype(np.float32),
    }


def inputs(atoms: AtomGraph) -> dict[str, np.ndarray]:
    """Every array :func:`logits` reads for ``atoms``."""
    return {**graph_inputs(atoms), **op_inputs(atoms)}


class NumpyOps:
    """The array operations :func:`logits` uses, in numpy (float32 throughout)."""

    gather = staticmethod(lambda a, idx: a[idx])
    matmul = staticmethod(np.matmul)
    relu = staticmethod(lambda a: np.maximum(a, np.float32(0.0)))
    tanh = staticmethod(np.tanh)
    concat = staticmethod(lambda parts: np.concatenate(parts, axis=-1))
    mean_rows = staticmethod(lambda a: a.mean(axis=0, keepdims=True))
    n_rows = staticmethod(lambda a: a.shape[0])
    n_cols = staticmethod(lambda a: a.shape[1])

    @staticmethod
    def segment_sum(data, ids, n):
        # as a sparse (n x rows) product: np.add.at took 5x as long at gnmt8's size
        from scipy import sparse

        k = len(ids)
        m = sparse.csr_matrix((np.ones(k, data.dtype), (ids, np.arange(k))), shape=(n, k))
        return np.asarray(m @ data)

    @staticmethod
    def l2_normalize(a):  # as tf.math.l2_normalize: the squared norm floored at 1e-12
        return a / np.sqrt(np.maximum(np.sum(a * a, axis=-1, keepdims=True), np.float32(1e-12)))


NUMPY = NumpyOps()


def tf_ops(tf):
    """The same operations in TensorFlow."""

    class TFOps:
        gather = staticmethod(tf.gather)
        matmul = staticmethod(tf.matmul)
        relu = staticmethod(tf.nn.relu)
        tanh = staticmethod(tf.tanh)
        concat = staticmethod(lambda parts: tf.concat(parts, -1))
        mean_rows = staticmethod(lambda a: tf.reduce_mean(a, 0, keepdims=True))
        n_rows = staticmethod(lambda a: tf.shape(a)[0])
        n_cols = staticmethod(lambda a: tf.shape(a)[1])
        segment_sum = staticmethod(tf.math.unsorted_segment_sum)
        l2_normalize = staticmethod(lambda a: tf.math.l2_normalize(a, axis=-1))

    return TFOps()


def _sage(ops, layers, h, src, dst, w, inv_in, inv_out):
    """GraphSAGE layers: each state joined with the weighted means of its predecessors'
    and successors' states, then ReLU and scaled to norm :data:`SAGE_NORM`."""
    n = ops.n_rows(h)
    for Ws, bs in layers:
        m_in = ops.segment_sum(ops.gather(h, src) * w, dst, n) * inv_in
        m_out = ops.segment_sum(ops.gather(h, dst) * w, src, n) * inv_out
        h = ops.relu(ops.matmul(ops.concat([h, m_in, m_out]), Ws) + bs)
        h = ops.l2_normalize(h) * SAGE_NORM
    return h


def logits(ops, w: Weights, a: dict, tanh_c: float):
    """The network's clipped logits (atoms x devices), before any residual table: op
    states from GraphSAGE over the op graph, mean-pooled per group, joined with the
    group's own features, GraphSAGE over the group graph plus the mean group state, and
    a head whose device slots are cut to the cluster's, plus a learnt multiple of the
    compute-time prior."""
    W, b = w.op_in
    h = ops.relu(ops.gather(w.type_emb, a["op_type"]) + ops.matmul(a["op_x"], W) + b)
    h = _sage(ops, w.op_sage, h, a["op_src"], a["op_dst"], a["op_w"], a["op_inv_in"], a["op_inv_out"])
    n = ops.n_rows(a["x"])
    pooled = ops.segment_sum(h, a["op_group"], n) * a["inv_group"]
    W, b = w.grp_in
    g = ops.relu(ops.matmul(ops.concat([pooled, a["x"][:, :N_BASE]]), W) + b)
    g = _sage(ops, w.grp_sage, g, a["src"], a["dst"], a["w"][:, None], a["inv_in"], a["inv_out"])
    W, b = w.ctx
    g = g + ops.relu(ops.matmul(ops.mean_rows(g), W) + b)
    D = ops.n_cols(a["mask"])
    W, b = w.head
    raw = ops.matmul(g, W[:, :D]) + b[:D] + w.prior_w * a["prior"]
    return tanh_c * ops.tanh(raw / tanh_c)
