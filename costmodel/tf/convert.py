"""Convert a traced TensorFlow graph (its ``GraphDef`` and ``tf.Graph``) into an
:class:`~placetool.costmodel.graph.OpGraph`: one op per GraphDef node, in the same order,
with tensor sizes, FLOPs, parameter bytes, colocation groups, device kinds allowed and
(for tagged Keras layers) a layer index per op. TensorFlow is imported lazily.
"""

from __future__ import annotations

import numpy as np

from placetool.costmodel.graph import ALL_KINDS, KIND_BITS, OpGraph

from .flops import own_flops, tf_registered_flops
from .session import import_tf

#: Ops that run on the host whatever kernels exist (tf.data, Python, summaries, I/O).
CPU_ONLY_PREFIXES = ("Iterator", "MakeIterator", "AnonymousIterator", "OptionalGetValue",
                     "PyFunc", "EagerPyFunc", "Write", "Summary", "ScalarSummary",
                     "HistogramSummary", "ImageSummary", "AudioSummary", "MergeSummary",
                     "Save", "Restore", "ReadFile", "WriteFile", "Print", "DecodeJpeg",
                     "DecodePng", "Decode", "Encode", "String", "Regex", "Substr")
#: Ops that are function calls or control flow: their bodies are opaque to the importer.
OPAQUE = frozenset("PartitionedCall StatefulPartitionedCall If StatelessIf While "
                   "StatelessWhile Case StatelessCase".split())


def opgraph_from_tf(graph, gd, name, param_shapes=None, meta=None, tags=None) -> OpGraph:
    """An OpGraph of ``gd``'s nodes (same order), reading shapes from the tf ``graph``.

    ``param_shapes``: {resource placeholder name: (shape, dtype)} of captured variables.
    ``tags``: {op name: layer index} recorded while tracing (see
    :class:`~placetool.costmodel.tf.tracing._LayerTagger`).
    """
    tf = import_tf()
    param_shapes = param_shapes or {}
    nodes = list(gd.node)
    n = len(nodes)
    index = {nd.name: i for i, nd in enumerate(nodes)}
    ops = {op.name: op for op in graph.get_operations()}
    op_types = [nd.op for nd in nodes]

    t_first, out_shapes, out_dtypes, unknown, unknown_types = _output_tensors(nodes, ops)
    tensor_op, tensor_bytes, out_bytes = _tensor_sizes(n, t_first, out_shapes, out_dtypes)
    e_src, e_dst, e_t, uf = _edges(tf, nodes, index, t_first, out_dtypes)
    flops, param_bytes, allowed, opaque = _op_facts(tf, graph, nodes, ops, out_shapes, out_dtypes,
                                                    param_shapes)
    group = np.array([uf.find(i) for i in range(n)], np.int64)

    meta = dict(meta or {})
    meta.update({"unknown_shapes": unknown, "unknown_shape_op_types": sorted(unknown_types),
                 "opaque_ops": opaque[:50], "n_opaque_ops": len(opaque)})
    layer = None
    if tags is not None:
        layer = _layers_from_tags([nd.name for nd in nodes], tags, group,
                                  np.asarray(e_src, np.int64), np.asarray(e_dst, np.int64))
    g = OpGraph.from_arrays(
        name, [nd.name for nd in nodes], op_types, out_bytes,
        np.asarray(e_src, np.int32), np.asarray(e_dst, np.int32),
        edge_tensor=np.asarray(e_t, np.int32), tensor_op=tensor_op, tensor_bytes=tensor_bytes,
        param_bytes=param_bytes, flops=flops, group=group, allowed=allowed, layer=layer,
        meta=meta,
    )
    return g


def _output_tensors(nodes, ops):
    """Tensors: one per output of each op, in op order. Returns (``t_first``: first tensor
    of each op, n + 1 long; output shapes and dtypes per op; how many outputs had unknown
    dims; the op types that had them)."""
    n = len(nodes)
    t_first = np.zeros(n + 1, np.int64)
    out_shapes, out_dtypes = [], []
    unknown, unknown_types = 0, set()
    for i, nd in enumerate(nodes):
        op = ops[nd.name]
        shapes, dts = [], []
        for t in op.outputs:
            s = t.shape
            dims = s.as_list() if s.rank is not None else None
            if dims is None or any(d is None for d in dims):
                # data-dependent sizes (e.g. BroadcastGradientArgs' index vectors): count
                # unknown dims as 1, an unknown rank as 0 bytes, and say so in meta
                unknown += 1
                unknown_types.add(nd.op)
                dims = [1 if d is None else d for d in dims] if dims is not None else None
            shapes.append(dims)
            dts.append(t.dtype)
        out_shapes.append(shapes)
        out_dtypes.append(dts)
        t_first[i + 1] = t_first[i] + len(shapes)
    return t_first, out_shapes, out_dtypes, unknown, unknown_types


def _tensor_sizes(n, t_first, out_shapes, out_dtypes):
    """(producing op of each tensor, bytes of each tensor, output bytes of each op)."""
    nt = int(t_first[-1])
    tensor_op = np.repeat(np.arange(n, dtype=np.int32), np.diff(t_first))
    tensor_bytes = np.zeros(nt, np.int64)
    for i in range(n):
        for k, (s, dt) in enumerate(zip(out_shapes[i], out_dtypes[i])):
            tensor_bytes[t_first[i] + k] = _tensor_bytes(s, dt)
    out_bytes = np.zeros(n, np.int64)
    np.add.at(out_bytes, tensor_op, tensor_bytes)
    return tensor_op, tensor_bytes, out_bytes


def _edges(tf, nodes, index, t_first, out_dtypes):
    """Edges (source op, destination op, tensor or -1 for a control edge), each once, and
    the colocation union-find: resource consumers with their resource, ``_class`` loc:@."""
    n = len(nodes)
    e_src, e_dst, e_t = [], [], []
    seen = set()
    uf = _UnionFind(n)
    for j, nd in enumerate(nodes):
        for inp in nd.input:
            if inp.startswith("^"):
                src = index[inp[1:]]
                key = (src, j, -1)
                t = -1
            else:
                nm, _, k = inp.partition(":")
                src = index[nm]
                t = int(t_first[src]) + (int(k) if k else 0)
                key = (src, j, t)
                if out_dtypes[src][t - int(t_first[src])] == tf.resource:
                    uf.union(src, j)  # TF places resource consumers with the resource
            if key in seen:
                continue
            seen.add(key)
            e_src.append(src)
            e_dst.append(j)
            e_t.append(t)
        cls = nd.attr["_class"].list.s if "_class" in nd.attr else []
        for c in cls:
            c = c.decode() if isinstance(c, bytes) else c
            if c.startswith("loc:@") and c[5:] in index:
                uf.union(index[c[5:]], j)
    return e_src, e_dst, e_t, uf


def _op_facts(tf, graph, nodes, ops, out_shapes, out_dtypes, param_shapes):
    """Per-op facts: (FLOPs, parameter bytes, device kinds allowed, names of opaque ops)."""
    from tensorflow.python.framework import kernels

    n = len(nodes)
    gpu_ok: dict[str, bool] = {}
    flops = np.zeros(n, np.float64)
    param_bytes = np.zeros(n, np.int64)
    allowed = np.full(n, ALL_KINDS, np.uint8)
    opaque = []
    for i, nd in enumerate(nodes):
        op = ops[nd.name]
        in_shapes = [_shape_list(t) for t in op.inputs]
        attrs = {k: _attr_value(nd.attr[k]) for k in ("transpose_a", "transpose_b", "adj_x", "adj_y")
                 if k in nd.attr}
        f = own_flops(nd.op, out_shapes[i], in_shapes, attrs)
        if f is None:
            f = tf_registered_flops(graph, nd)
        flops[i] = max(0.0, f or 0.0)
        if nd.name in param_shapes:
            s, dt = param_shapes[nd.name]
            param_bytes[i] = _tensor_bytes(s, tf.as_dtype(dt))
        elif nd.op in ("VarHandleOp", "VariableV2", "Variable"):
            s = [d.size for d in nd.attr["shape"].shape.dim]
            param_bytes[i] = _tensor_bytes(s if all(d >= 0 for d in s) else None,
                                           tf.as_dtype(nd.attr["dtype"].type))
        if nd.op not in gpu_ok:
            kl = kernels.get_registered_kernels_for_op(nd.op).kernel
            gpu_ok[nd.op] = any(k.device_type in ("GPU", "DEFAULT") for k in kl) or not kl
        cpu_only = (not gpu_ok[nd.op] or nd.op.startswith(CPU_ONLY_PREFIXES)
                    or "Dataset" in nd.op
                    or any(dt == tf.string for dt in out_dtypes[i])
                    or any(t.dtype == tf.string for t in op.inputs))
        # sources and pass-throughs of strings have GPU kernels (host memory): not pinned
        if cpu_only and nd.op not in ("Placeholder", "Const", "Identity", "NoOp"):
            allowed[i] = KIND_BITS["cpu"]
        if nd.op in OPAQUE:
            opaque.append(nd.name)
    return flops, param_bytes, allowed, opaque


def _shape_list(t):
    s = t.shape
    if s.rank is None:
        return None
    d = s.as_list()
    return None if any(x is None for x in d) else d


def _attr_value(a):
    which = a.WhichOneof("value")
    return getattr(a, which) if which else None


def _tensor_bytes(shape, dtype) -> int:
    """elements x dtype size; resource/variant handles count 0, strings 8 bytes each."""
    if shape is None:
        return 0
    name = dtype.name
    if name in ("resource", "variant"):
        return 0
    size = 8 if name == "string" else dtype.size
    return int(np.prod(shape, dtype=np.int64)) * int(size)


class _UnionFind:
    def __init__(self, n):
        self.p = list(range(n))

    def find(self, x):
        p = self.p
        while p[x] != x:
            p[x] = p[p[x]]
            x = p[x]
        return x

    def union(self, a, b):
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.p[max(ra, rb)] = min(ra, rb)


def _layers_from_tags(names, tags, group, src, dst) -> np.ndarray:
    """Layer index per op: recorded forward tags, gradients by name, then neighbours.

    1. ops created inside a tagged layer's ``call`` carry its index;
    2. ``gradient_tape/X/...`` ops take the tag of the forward op ``X/...`` they
       differentiate (longest matching name prefix);
    3. a group takes the tag most common among its tagged ops (variables with their
       readers and updates);
    4. remaining ops take the most common tag among tagged neighbours, repeatedly.
    """
    n = len(names)
    layer = np.full(n, -1, np.int32)
    fwd = {}
    for i, nm in enumerate(names):
        if nm in tags:
            layer[i] = tags[nm]
            fwd[nm] = tags[nm]
    scope: dict[str, int] = {}
    for nm, t in fwd.items():
        parts = nm.split("/")
        for k in range(1, len(parts)):
            s = "/".join(parts[:k])
            if scope.get(s, t) != t:
                scope[s] = -2  # ambiguous scope (shared by several layers)
            else:
                scope[s] = t
    for i, nm in enumerate(names):
        if layer[i] >= 0 or not nm.startswith("gradient_tape/"):
            continue
        parts = nm[len("gradient_tape/"):].split("/")
        for k in range(len(parts), 0, -1):
            s = "/".join(parts[:k])
            t = fwd.get(s, scope.get(s, -1))
            if t >= 0:
                layer[i] = t
                break
            if t == -2:
                break
    _group_vote(layer, group, only_untagged=True)
    for _ in range(1000):
        if not _neighbour_vote(layer, src, dst):
            break
    _group_vote(layer, group, only_untagged=False)  # one tag per group
    if (layer >= 0).any():
        layer[layer < 0] = 0  # ops connected to nothing tagged (unused constants)
    return layer


def _majority(keys, labels):
    """For each distinct key, its most common label: (unique keys, labels)."""
    pairs, counts = np.unique(np.stack([keys, labels]), axis=1, return_counts=True)
    order = np.lexsort((-counts, pairs[0]))
    pk = pairs[0][order]
    first = np.r_[True, pk[1:] != pk[:-1]]
    return pk[first], pairs[1][order][first]


def _group_vote(layer, group, only_untagged):
    tagged = layer >= 0
    if not tagged.any():
        return
    g, best = _majority(group[tagged], layer[tagged])
    gl = np.full(int(group.max()) + 1, -1, np.int64)
    gl[g] = best
    fill = (gl[group] >= 0) & (~tagged if only_untagged else True)
    layer[fill] = gl[group[fill]]


def _neighbour_vote(layer, src, dst) -> bool:
    untagged = layer < 0
    if not untagged.any() or not (layer >= 0).any():
        return False
    a = np.concatenate([src, dst])
    b = np.concatenate([dst, src])
    m = untagged[a] & (layer[b] >= 0)
    if not m.any():
        return False
    ops, best = _majority(a[m], layer[b[m]])
    layer[ops] = best
    return True
