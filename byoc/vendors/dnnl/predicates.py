"""oneDNN's limits, one predicate each; a predicate returns the reason it rejects."""

from __future__ import annotations

import math

from tvm import relax

from byoc.ir.types import constant_array, is_tensor_constant, static_shape


def _shape(expr: relax.Expr) -> tuple[int, ...]:
    return static_shape(expr.ty)


def conv2d_nchw(call: relax.Call) -> str | None:
    attrs = call.attrs
    if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NCHW", "OIHW", "NCHW"):
        return f"layouts {attrs.data_layout}/{attrs.kernel_layout}; oneDNN kernels here take NCHW/OIHW"
    if not is_tensor_constant(call.args[1]):
        return "convolution weights must be constants (reordered once at load)"
    return None


def fused_conv(match) -> str | None:
    reason = conv2d_nchw(match["root"])
    residual = match.get("residual")
    if reason is None and residual is not None and _shape(residual) != _shape(match.root):
        return "the residual operand is broadcast; a fused residual add needs the full output shape"
    # conv2d_bias(_act) also matches an add of a computed tensor: a residual too
    added = match.get("bias")
    if residual is None and added is not None and not is_tensor_constant(added):
        residual = added
    if reason is None and residual is not None and 1 < match["root"].attrs.groups < _shape(match["root"].args[0])[1]:
        # oneDNN 3.2 has no JIT kernel for a grouped convolution with a binary post-op: it ran
        # ShuffleNet's in its reference code, 150 ms each; unfused, the add is its own primitive.
        return "a grouped convolution does not take a fused residual add"
    return reason


def dense_constant_weight(match) -> str | None:
    weight = match["root"].args[1]
    return None if len(_shape(weight)) == 2 else "fused dense needs 2-D weights"


def matmul_shapes(call: relax.Call) -> str | None:
    a, b = (_shape(arg) for arg in call.args)
    if len(a) < 2 or len(b) < 2:
        return "matmul of vectors is not supported"
    if is_tensor_constant(call.args[1]):
        return None if len(b) == 2 else "constant weights must be 2-D"
    if len(a) != len(b) or a[:-2] != b[:-2]:
        return f"batched matmul needs equal batch dimensions, got {a} x {b}"
    return None


def pool_nchw(call: relax.Call) -> str | None:
    if call.attrs.layout != "NCHW" or len(_shape(call.args[0])) != 4:
        return "pooling takes 4-D NCHW tensors"
    return None


def mean_keepdims(call: relax.Call) -> str | None:
    return None if call.attrs.keepdims else "mean must keep its reduced dimensions"


def binary_broadcast(call: relax.Call) -> str | None:
    a, b, out = _shape(call.args[0]), _shape(call.args[1]), _shape(call)
    commutative = call.op.name in ("relax.add", "relax.multiply")
    if a != out and not (commutative and b == out):
        return "the first operand must have the output's shape (oneDNN broadcasts the second only)"
    other = call.args[1] if a == out else call.args[0]
    if len(_shape(other)) < len(out) and not is_tensor_constant(other):
        return "a broadcast operand of lower rank must be a constant"
    return None


def concat_same_rank(call: relax.Call) -> str | None:
    ranks = {len(_shape(f)) for f in call.args[0].fields}
    return None if len(ranks) == 1 else "inputs of different ranks"


def layer_norm_last_axis(call: relax.Call) -> str | None:
    attrs = call.attrs
    rank = len(_shape(call.args[0]))
    if [int(a) % rank for a in attrs.axes] != [rank - 1]:
        return "layer normalisation over the last axis only"
    if not (attrs.center and attrs.scale) or not all(is_tensor_constant(a) for a in call.args[1:3]):
        return "scale and shift must be constant"
    return None


_GELU_CONSTANTS = {"relax.divide": math.sqrt(2.0), "relax.add": 1.0, "relax.multiply": 0.5}


def gelu_constants(match) -> str | None:
    bias = match.get("bias")
    for call in match.calls:
        if call.op.name not in _GELU_CONSTANTS:
            continue
        for arg in call.args:
            if is_tensor_constant(arg) and (bias is None or not arg.same_as(bias)):
                value = constant_array(arg)
                if value.size != 1 or not math.isclose(float(value.reshape(())), _GELU_CONSTANTS[call.op.name], rel_tol=1e-5):
                    return "not the erf form of GELU: 0.5 * x * (1 + erf(x / sqrt(2)))"
    return None


def dense_gelu(match) -> str | None:
    return dense_constant_weight(match) or gelu_constants(match)


def dense_residual(match) -> str | None:
    if _shape(match["residual"]) != _shape(match["root"]):
        return "the residual must have the output's shape"
    return dense_constant_weight(match)


def scaled_matmul(match) -> str | None:
    if constant_array(match["scale"]).size != 1:
        return "the scale must be one number"
    return matmul_shapes(match["root"])
