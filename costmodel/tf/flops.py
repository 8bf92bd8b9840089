"""FLOPs of TensorFlow ops from their static shapes.

Own formulas for the ops that dominate training steps (MatMul, BatchMatMul, Conv2D and
its two backprops, depthwise convolutions and their backprops, elementwise ops,
reductions); TensorFlow's registered ``flops`` statistics
(``tensorflow/python/profiler/internal/flops_registry.py``) for the rest; 0 where neither
knows the op. One multiply-add counts as 2 FLOPs, as in TensorFlow's registry.
"""

from __future__ import annotations

import math

#: One FLOP per output element.
ELEMENTWISE = frozenset("""
Abs Acos Acosh Add AddN AddV2 Asin Asinh Atan Atan2 Atanh BiasAdd Ceil ClipByValue Cos Cosh
DivNoNan Div Elu EluGrad Equal Erf Exp Expm1 Floor FloorDiv FloorMod Greater GreaterEqual
Inv InvGrad IsFinite LeakyRelu LeakyReluGrad Less LessEqual Log Log1p LogicalAnd LogicalNot
LogicalOr Maximum Minimum Mod Mul MulNoNan Neg NotEqual Pow RealDiv Reciprocal
ReciprocalGrad Relu Relu6 Relu6Grad ReluGrad Round Rsqrt RsqrtGrad Select SelectV2 Selu
SeluGrad Sigmoid SigmoidGrad Sign Sin Sinh Softplus SoftplusGrad Softsign SoftsignGrad
Sqrt SqrtGrad Square SquaredDifference Sub Tan Tanh TanhGrad TruncateDiv Xdivy Xlogy
AssignAddVariableOp AssignSubVariableOp ResourceApplyGradientDescent
""".split())

#: About this many FLOPs per output element (fused optimizer updates, softmax...).
PER_ELEMENT = {
    "Softmax": 5, "LogSoftmax": 5, "ResourceApplyMomentum": 3,
    "ResourceApplyKerasMomentum": 3, "ResourceApplyAdam": 12, "ResourceApplyRMSProp": 8,
    "ResourceApplyAdagradV2": 5,
}

#: One FLOP per input element.
REDUCTIONS = frozenset("Sum Mean Max Min Prod BiasAddGrad All Any ArgMax ArgMin L2Loss".split())


def _prod(shape) -> float:
    return float(math.prod(shape)) if shape is not None else 0.0


def own_flops(op_type: str, out_shapes, in_shapes, attrs) -> float | None:
    """FLOPs from shapes (lists of ints, None where unknown); None if not covered here.

    ``attrs``: a dict-like of the node's attributes (``transpose_a``, ``adj_x``,
    ``data_format``...) already decoded to Python values.
    """
    out = out_shapes[0] if out_shapes else None
    if op_type == "MatMul":
        a = in_shapes[0]
        if out is None or a is None or len(a) != 2:
            return None
        k = a[0] if attrs.get("transpose_a") else a[1]
        return 2.0 * out[0] * out[1] * k
    if op_type in ("BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
        a = in_shapes[0]
        if out is None or a is None or len(a) < 2:
            return None
        k = a[-2] if attrs.get("adj_x") else a[-1]
        return 2.0 * _prod(out) * k
    if op_type in ("Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3D"):
        # Every variant does the forward conv's multiply-adds: 2 * |forward out| * kh*kw*cin.
        if op_type == "Conv2D" or op_type == "Conv3D":
            fwd_out, filt = out, in_shapes[1]
        elif op_type == "Conv2DBackpropInput":  # (input_sizes, filter, out_backprop)
            fwd_out, filt = in_shapes[2], in_shapes[1]
        else:  # Conv2DBackpropFilter: (input, filter_sizes, out_backprop) -> filter grad
            fwd_out, filt = in_shapes[2], out
        if fwd_out is None or filt is None:
            return None
        return 2.0 * _prod(fwd_out) * _prod(filt[:-1])
    if op_type in ("DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
                   "DepthwiseConv2dNativeBackpropFilter"):
        if op_type == "DepthwiseConv2dNative":
            fwd_out, filt = out, in_shapes[1]
        elif op_type == "DepthwiseConv2dNativeBackpropInput":
            fwd_out, filt = in_shapes[2], in_shapes[1]
        else:
            fwd_out, filt = in_shapes[2], out
        if fwd_out is None or filt is None:
            return None
        return 2.0 * _prod(fwd_out) * filt[0] * filt[1]
    if op_type in ELEMENTWISE:
        shapes = [s for s in (out_shapes if op_type not in (
            "AssignAddVariableOp", "AssignSubVariableOp", "ResourceApplyGradientDescent")
            else in_shapes[-1:]) if s is not None]
        return _prod(shapes[0]) if shapes else None
    if op_type in PER_ELEMENT:
        s = out if out is not None else (in_shapes[-1] if in_shapes else None)
        big = max((_prod(x) for x in in_shapes if x is not None), default=0.0)
        return PER_ELEMENT[op_type] * (_prod(s) if op_type.startswith("Log") or op_type == "Softmax" else big)
    if op_type in REDUCTIONS:
        return _prod(in_shapes[0]) if in_shapes and in_shapes[0] is not None else None
    return None


def tf_registered_flops(graph, node_def) -> float | None:
    """TensorFlow's registered ``flops`` statistic for a node of ``graph``, if any."""
    from tensorflow.python.framework import ops
    from tensorflow.python.profiler.internal import flops_registry  # noqa: F401 (registers)
    from tensorflow.python.util import deprecation

    try:
        with deprecation.silence():  # the registry calls a deprecated TF1 shape helper
            v = ops.get_stats_for_node_def(graph, node_def, "flops").value
    except Exception:  # shape-dependent registry functions raise on unknown shapes
        return None
    return float(v) if v is not None else None
