"""Synthetic layered DAGs with realistic op-time and tensor-size distributions.

They stand in for real training graphs in tests and benchmarks: op FLOPs and tensor
sizes are log-normal (spanning small element-wise ops to big MatMuls and Convs), each op
reads one to three tensors from the previous few layers, about one op in eight is a
variable grouped with the ops that read and update it (TF's colocation), and the input
pipeline is pinned to the CPU. Generation is vectorised and deterministic per seed.

>>> g = layered(1000, seed=0)
>>> g.n_ops, g.n_groups < g.n_ops
(1000, True)
"""

from __future__ import annotations

import numpy as np

from .graph import KIND_BITS, OpGraph

_COMPUTE_TYPES = ("MatMul", "Conv2D", "Relu", "Add", "Mul", "BiasAdd", "Conv2DBackpropInput",
                  "MatMulGrad", "Softmax", "FusedBatchNorm", "Tanh", "Sigmoid")


def layered(n_ops: int, seed: int = 0, width: int | None = None, name: str | None = None) -> OpGraph:
    """A layered random training-like DAG of ``n_ops`` ops (deterministic for a seed)."""
    if n_ops < 2:
        raise ValueError("a synthetic graph needs at least 2 ops")
    rng = np.random.default_rng(seed)
    width = width or max(2, int(round(np.sqrt(n_ops) / 2)))
    layer = np.minimum(np.arange(n_ops) // width, np.iinfo(np.int32).max).astype(np.int32)
    n_layers = int(layer[-1]) + 1

    # Tensor sizes: median ~200 KB, heavy tail to tens of MB; FLOPs: ~0.1..100 GFLOP per op.
    out_bytes = np.clip(rng.lognormal(np.log(2e5), 1.5, n_ops), 256, 64 << 20).astype(np.int64) // 4 * 4
    intensity = rng.lognormal(np.log(8.0), 1.5, n_ops)  # FLOPs per output byte
    flops = np.round(out_bytes * intensity)
    types = np.array(_COMPUTE_TYPES)[rng.integers(0, len(_COMPUTE_TYPES), n_ops)].astype(object)

    # Inputs: 1..3 per op from the previous three layers, mostly the one just before.
    n_in = np.where(layer > 0, 1 + rng.binomial(2, 0.3, n_ops), 0)
    dst = np.repeat(np.arange(n_ops), n_in)
    back = 1 + rng.binomial(2, 0.2, dst.size)
    src_layer = np.maximum(layer[dst] - back, 0)
    src = src_layer * width + rng.integers(0, width, dst.size)
    src = np.minimum(src, dst - 1)
    src = np.where(layer[src] >= layer[dst], (layer[dst] - 1) * width, src)  # stay strictly earlier
    pairs = np.unique(np.stack([src, dst]), axis=1)
    src, dst = pairs[0], pairs[1]

    # Variables: the first op of some layers' slots is a variable read by the next layer's op
    # and updated by an op near the end; all three share a group.
    group = np.arange(n_ops)
    param_bytes = np.zeros(n_ops, np.int64)
    is_var = (rng.random(n_ops) < 0.12) & (layer < n_layers - 1)
    is_var[0] = False
    var = np.flatnonzero(is_var)
    types[var] = "VarHandleOp"
    param_bytes[var] = out_bytes[var]
    flops[var] = 0
    reader = np.minimum(var + width, n_ops - 1)
    group[reader] = var
    types[reader] = "ReadVariableOp"
    # a reader may itself be a variable's slot: keep the grouping one level deep
    is_var[reader] = False
    update = n_ops - 1 - rng.integers(0, max(1, width), var.size)
    ok = update > reader
    group[update[ok]] = var[ok]
    types[update[ok]] = "ResourceApplyGradientDescent"
    extra_src, extra_dst = var[ok], update[ok]
    src = np.concatenate([src, var, extra_src]).astype(np.int32)
    dst = np.concatenate([dst, reader, extra_dst]).astype(np.int32)
    pairs = np.unique(np.stack([src, dst]), axis=1)
    pairs = pairs[:, pairs[0] < pairs[1]]

    # The input pipeline: ops of layer 0 read data on the host.
    allowed = np.full(n_ops, 3, np.uint8)
    inputs = np.flatnonzero(layer == 0)[: max(1, width // 4)]
    allowed[inputs] = KIND_BITS["cpu"]
    types[inputs] = "IteratorGetNext"
    flops[inputs] = 0

    names = [f"L{layer[i]}/{types[i]}_{i}" for i in range(n_ops)]
    return OpGraph.from_arrays(
        name or f"synthetic-{n_ops}",
        names,
        list(types),
        out_bytes,
        pairs[0],
        pairs[1],
        param_bytes=param_bytes,
        flops=flops,
        group=group,
        allowed=allowed,
        layer=np.minimum(layer * 8 // n_layers, 7),
        meta={"generator": "placetool.costmodel.synthetic.layered", "seed": seed, "width": width},
    )
