"""What PyTorch's decompositions leave that no backend needs, taken out after constant folding.

torch.export writes `x @ W` on a 3-D `x` as a broadcast of the activations to their own shape
and a batched matmul against the weight broadcast to every batch (`expand`, `bmm`). Folded, the
weight is a 3-D constant with one slice per batch, which no vendor takes as a dense layer's
weight ("constant weights must be 2-D"), and the identity broadcasts are ops of their own that
cut regions. ONNX exports of the same model have neither. So:

- a `broadcast_to` to its operand's own shape is its operand;
- a matmul's constant right operand whose slices along the leading axes are all equal is that
  one 2-D slice, where the product keeps its shape (matmul broadcasts it back); so is a weight
  broadcast to a dynamic batch (`broadcast_to(W, (batch, K, N))`), which cannot be folded;
- `where(c, full_like(x, v), y)` of the result's own shape is `where(c, v, y)`: the safe softmax
  of a model with dynamic dimensions fills its zeros so;
- a bitwise and, or, xor or not of booleans (`mask_a & mask_b`) is the logical op, which ONNX
  and vendors take on booleans (ONNX's BitwiseAnd takes integers only);
- `any` along axes, written as booleans cast to int8, their max and a cast back, takes the max in
  int32: no vendor computes int8 that is not quantized data;
- a convolution of zero padding (TensorFlow's "SAME" padding exported as Pad, then Conv) pads
  its own input: one op instead of a copy of the whole feature map.
- a gather by constant indices that count up by one (`take(x, [[0], [1], ..., [n - 1]])`: torch's
  `as_strided` as the dynamo exporter writes it, ConvNeXt V2's head) is a slice of that range
  and a reshape, which every backend takes; a gather stayed on the host between two regions.

All are exact.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from byoc.ir.rewrite import bound_value, rebuild_module
from byoc.ir.types import constant_array, dtype_name, has_static_shape, is_tensor_constant, op_name, same_shape, static_shape


def _shared_weight(call: relax.Call, builder: relax.BlockBuilder) -> relax.Expr | None:
    lhs, rhs = call.args[0], bound_value(call.args[1], builder)
    if op_name(rhs) == "relax.broadcast_to":
        rhs = bound_value(rhs.args[0], builder)
    if not is_tensor_constant(rhs):
        return None
    weight = constant_array(rhs)
    if weight.ndim == 2 and rhs.same_as(call.args[1]):
        return None  # a plain dense weight already
    if weight.ndim < 2 or getattr(lhs.ty, "ndim", -1) < weight.ndim:
        return None
    slices = weight.reshape(-1, *weight.shape[-2:])
    if not np.array_equal(slices, np.broadcast_to(slices[:1], slices.shape)):
        return None
    rewritten = relax.op.matmul(lhs, relax.const(np.ascontiguousarray(slices[0]), str(weight.dtype)), call.attrs.out_dtype or None)
    rewritten = builder.normalize(rewritten)
    return rewritten if same_shape(rewritten.ty, call.ty) else None


_LOGICAL = {"relax.bitwise_and": relax.op.logical_and, "relax.bitwise_or": relax.op.logical_or,
            "relax.bitwise_xor": relax.op.logical_xor, "relax.bitwise_not": relax.op.logical_not}


def _any_in_int32(call: relax.Call, builder: relax.BlockBuilder) -> relax.Expr | None:
    """`astype(max(astype(b, int8)), bool)` of booleans `b` as `astype(max(astype(b, int32)), bool)`."""
    reduced = bound_value(call.args[0], builder)
    if op_name(reduced) != "relax.max" or dtype_name(reduced.ty) != "int8":
        return None
    cast = bound_value(reduced.args[0], builder)
    if op_name(cast) != "relax.astype" or dtype_name(cast.args[0].ty) != "bool":
        return None
    widened = builder.emit(relax.op.astype(cast.args[0], "int32"))
    largest = builder.emit(relax.op.max(widened, reduced.attrs.axis, reduced.attrs.keepdims))
    return relax.op.astype(largest, "bool")


_CONVOLUTIONS = {"relax.nn.conv1d": (relax.op.nn.conv1d, "NCW"), "relax.nn.conv2d": (relax.op.nn.conv2d, "NCHW")}


def _padding_into_conv(call: relax.Call, builder: relax.BlockBuilder) -> relax.Expr | None:
    padded = bound_value(call.args[0], builder)
    make, layout = _CONVOLUTIONS[op_name(call)]
    a = call.attrs
    if op_name(padded) != "relax.nn.pad" or a.data_layout != layout or padded.attrs.pad_mode != "constant" or \
            float(padded.attrs.pad_value) != 0.0:
        return None
    widths = [int(w) for w in padded.attrs.pad_width]
    if any(widths[:4]):  # the batch or the channels padded
        return None
    spatial = len(widths) // 2 - 2
    own = [int(p) for p in a.padding]  # every start, then every end
    padding = [own[i] + widths[4 + 2 * i] for i in range(spatial)] + [own[spatial + i] + widths[5 + 2 * i] for i in range(spatial)]
    return make(padded.args[0], call.args[1], a.strides, padding, a.dilation, a.groups, a.data_layout, a.kernel_layout,
                a.out_layout, a.out_dtype or None)


def _take_of_a_range(call: relax.Call) -> relax.Expr | None:
    data, indices = call.args
    if (not is_tensor_constant(indices) or call.attrs.axis is None or not has_static_shape(data.ty)
            or not has_static_shape(call.ty)):
        return None
    index = constant_array(indices).ravel()
    shape = static_shape(data.ty)
    axis = int(call.attrs.axis) % len(shape)
    length = shape[axis]
    if index.dtype.kind not in "iu" or index.size == 0 or index.min() < -length or index.max() >= length:
        return None  # an index out of range stays the gather that refuses it
    counted = np.where(index < 0, index + length, index)  # indices from the end, as ONNX allows
    start = int(counted[0])
    if not np.array_equal(counted, np.arange(start, start + index.size)):
        return None
    window = data if index.size == length else relax.op.strided_slice(data, [axis], [start], [start + index.size])
    return relax.op.reshape(window, static_shape(call.ty))


def _simplify(value: relax.Expr, builder: relax.BlockBuilder) -> relax.Expr | None:
    name = op_name(value)
    if name == "relax.take":
        return _take_of_a_range(value)
    if name in _CONVOLUTIONS:
        return _padding_into_conv(value, builder)
    if name in _LOGICAL and all(dtype_name(arg.ty) == "bool" for arg in value.args):
        return _LOGICAL[name](*value.args)
    if name == "relax.astype" and dtype_name(value.ty) == "bool":
        return _any_in_int32(value, builder)
    if name == "relax.broadcast_to" and same_shape(value.args[0].ty, value.ty):
        return value.args[0]
    if name == "relax.matmul":
        return _shared_weight(value, builder)
    if name == "relax.where":
        return _filled_branch(value, builder)
    return None


def _filled_branch(call: relax.Call, builder: relax.BlockBuilder) -> relax.Expr | None:
    branches = [bound_value(a, builder) for a in call.args[1:]]
    filled = [op_name(b) == "relax.full_like" and is_tensor_constant(b.args[1]) and same_shape(b.ty, call.ty) for b in branches]
    if not any(filled):
        return None
    args = [call.args[0]] + [relax.const(constant_array(b.args[1]).astype(str(b.ty.dtype)), str(b.ty.dtype)) if f else a
                             for a, b, f in zip(call.args[1:], branches, filled)]
    return relax.op.where(*args)


def simplify(mod: tvm.IRModule) -> tvm.IRModule:
    return rebuild_module(mod, _simplify)
