"""byoc's own converters, for ONNX ops where TVM's converter is wrong or too general for a
static-shape compiler. Each returns None to leave the op to TVM's converter.

- Clip with constant bounds: one `relax.clip` (TVM emits two kernels and NaN guards per Clip,
  which backends cannot recognise, and building them took 8 s on MobileNetV2 here).
- Shape: a constant. TVM returns a symbolic shape value that most of its other converters
  refuse ("cannot handle ShapeExpr inputs"); byoc compiles static shapes only, so the shape of
  every tensor is known.
- Dropout: the identity at inference, with an all-true mask; TVM keeps a `relax.nn.dropout`
  op that no backend takes and that splits regions.
- ReduceMax, ReduceMin: an all-infinite reduction is infinite (TVM returns the finite extreme).
- Split with empty pieces: strided slices (TVM's split wants strictly increasing indices).
- Pad of a float tensor in constant mode: one `relax.nn.pad` (TVM emits a kernel of its own,
  which no vendor can take).
- RMSNormalization: TVM's converter fails when its axes cover the whole tensor.
- Pow with an exponent of another type than the base: the result has the base's type.
- OneHot: a depth of any numeric type, negative indices counted from the end.
- ConvTranspose with `output_shape`: pads derived from it as the ONNX spec says (TVM ignores
  it); a negative total padding is extra output at the end, which is what output_padding is.
- IsInf with detect_negative or detect_positive off (TVM ignores both).
- Mish: x * tanh(softplus(x)) written without log(1 + e^x), which loses every digit when e^x
  is below float32's epsilon.
- Softplus: max(x, 0) + log1p(e^-|x|), with log1p as Goldberg writes it (TVM's log(1 + e^x)
  overflows above x = 88 and loses every digit below x = -17).
- Resize: `axes` spelled out over every axis (TVM wants a scale or size per axis), and the
  forms whose results TVM gets wrong refused by name (antialiasing, the half_pixel_symmetric
  mapping, align_corners onto a single pixel, a keep_aspect_ratio_policy, and scales that do
  not give whole output sizes: TVM maps coordinates by the size ratio, ONNX by the scale).
- EyeLike with a dtype of its own, SpaceToDepth in CRD mode, Upsample (opset 7 to 9, scales
  as an input): TVM's converters refuse or miss them; with static shapes each is a constant or
  a reshape-transpose-reshape or one resize.
- Sum, Max, Min, Mean of several inputs: a chain of broadcasting adds (maximums, minimums);
  TVM broadcasts, stacks and reduces, which no backend recognises as the residual add that
  Caffe2's ResNet-50 writes as Sum.
- NonMaxSuppression without its optional inputs: ONNX's defaults (TVM assumes other ones).
- LayerNormalization: Y stays one `relax.nn.layer_norm` (backends fuse it); the optional Mean
  and InvStdDev outputs, which TVM returns as 0-d placeholders, are computed.
- Reshape of a dimension to one element: a shape value (see `reshape`).
- Tile whose repeats are a shape value (a model with dynamic dimensions): a broadcast (see `tile`).
- Slice before opset 10 (bounds as attributes): TVM's converter reads only the later inputs.
- PRelu before opset 7, one slope per channel (axis 1, as opset 6 defines it); a slope that does
  not broadcast is an error naming the shapes (TVM's converter raised an IndexError).
- Gather and the other ops that index: see `index_operands` (indices out of range are errors).
- The sequence ops: see `sequences` (negative positions as ONNX counts them).
- Einsum of one or two operands: transposes, sums and one matrix product (see `einsum`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tvm
from tvm import relax

from byoc.errors import ModelLoadError
from byoc.frontend.onnx.einsum import einsum
from byoc.frontend.onnx.index_operands import INDEX_CONVERTERS
from byoc.frontend.onnx.sequences import SEQUENCE_CONVERTERS
from byoc.ir.types import constant_array, has_static_shape, is_tensor_constant, static_shape

# TVM's converter for an op, for byoc converters that correct or complete it.
TvmConverter = Callable[[str, Sequence[relax.Expr | None], dict[str, Any]], relax.Expr]
Converter = Callable[[relax.BlockBuilder, Sequence[relax.Expr | None], dict[str, Any], int, TvmConverter], relax.Expr | None]


def _scalar_constant(expr: relax.Expr | None) -> float | None:
    if expr is not None and is_tensor_constant(expr) and constant_array(expr).size == 1:
        return float(constant_array(expr).reshape(()))
    return None


def tvm_scalar(value: float, dtype: str):
    """A scalar of `dtype` for a PrimValue (TVM infers int64 or float64 from Python numbers)."""
    return tvm.tirx.const(value, dtype)


def _outputs(attrs: dict[str, Any]) -> int:
    return int(attrs.get("tvm_custom", {}).get("num_outputs", 1))


def clip(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    if "min" in attrs or "max" in attrs:
        low, high = attrs.get("min", -math.inf), attrs.get("max", math.inf)
    else:
        bounds = [inputs[i] if len(inputs) > i else None for i in (1, 2)]
        low, high = (default if b is None else _scalar_constant(b) for b, default in zip(bounds, (-math.inf, math.inf)))
        if low is None or high is None:
            return None
    dtype = str(inputs[0].ty.dtype)
    if dtype.startswith(("int", "uint")):  # an absent bound of an integer Clip is the type's limit, not infinity
        limits = np.iinfo(dtype)
        low, high = max(low, limits.min), min(high, limits.max, np.iinfo(np.int64).max)
        return relax.op.clip(inputs[0], relax.prim_value(int(low)), relax.prim_value(int(high)))
    return relax.op.clip(inputs[0], relax.prim_value(float(low)), relax.prim_value(float(high)))


def shape(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    ty = inputs[0].ty
    if not isinstance(ty, relax.TensorType) or not has_static_shape(ty):
        return None  # TVM's converter: a symbolic shape value, which its other converters follow
    dims = static_shape(ty, "the input of Shape")
    rank = len(dims)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    # relax.const turns an int64 numpy array into an int32 constant unless told the dtype.
    return relax.const(np.array(dims[start:end], dtype=np.int64), "int64")


def range_(bb, inputs, attrs, opset, tvm_converter) -> relax.Expr | None:
    start, limit, delta = inputs
    # TVM's converter gives a range to a symbolic limit a length of its own (`range_len_0`),
    # which then matches no other dimension: arange(sequence) has length `sequence`.
    limit = getattr(limit, "value", limit)  # a PrimValue's expression
    step, first = _scalar_constant(delta), _scalar_constant(start)
    if first is None or step is None or not tvm.ir.is_prim_expr(limit) or not str(start.ty.dtype).startswith("int"):
        return None
    return relax.op.arange(int(first), limit, int(step), str(start.ty.dtype))


def dropout(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    training = inputs[2] if len(inputs) > 2 else None
    if training is not None:
        if not is_tensor_constant(training):
            return None
        ratio = _scalar_constant(inputs[1]) if len(inputs) > 1 and inputs[1] is not None else 0.5
        if bool(constant_array(training)) and ratio != 0.0:
            raise ModelLoadError(f"Dropout in training mode with ratio {ratio} draws random numbers; byoc compiles for inference")
    data = inputs[0]
    if _outputs(attrs) < 2:
        return data
    mask = relax.const(np.ones(static_shape(data.ty, "the input of Dropout"), dtype=bool))
    return relax.Tuple([data, mask])


def layer_normalization(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    if _outputs(attrs) < 2:
        return None
    data, scale, bias = inputs[0], inputs[1], inputs[2] if len(inputs) > 2 else None
    rank = data.ty.ndim
    axis = attrs.get("axis", -1)
    axes = list(range(axis + rank if axis < 0 else axis, rank))
    epsilon = float(attrs.get("epsilon", 1e-5))
    if bias is None:
        bias = relax.const(np.zeros(static_shape(scale.ty), dtype=str(scale.ty.dtype)), str(scale.ty.dtype))
    normalized = bb.emit(relax.op.nn.layer_norm(data, scale, bias, axes, epsilon))
    mean = bb.emit(relax.op.mean(data, axes, keepdims=True))
    variance = bb.emit(relax.op.variance(data, axes, keepdims=True))
    inverse = bb.emit(relax.op.rsqrt(relax.op.add(variance, relax.const(epsilon, str(data.ty.dtype)))))
    return relax.Tuple([normalized, mean, inverse][: _outputs(attrs)])


def _reduce_extreme(op: str, infinity: float) -> Converter:
    """ReduceMax (ReduceMin) of values that are all -inf (+inf) is -inf (+inf); TVM starts its
    reductions from the lowest (highest) finite value and returns that instead. The masked rows
    of attention (ONNX's own Attention definition) depend on it."""

    def convert(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
        data = inputs[0]
        # bfloat16 too: TVM's bfloat16 reduction starts from -inf, but a bfloat16 model is computed
        # in float32 where the backend takes no bfloat16 (byoc.frontend.float16).
        if not isinstance(data.ty, relax.TensorType) or not str(data.ty.dtype).startswith(("float", "bfloat")):
            return None
        result = bb.normalize(tvm(op, inputs, attrs))
        dtype = str(data.ty.dtype)
        if has_static_shape(data.ty) and 0 in static_shape(data.ty):  # an empty reduction is the identity
            return relax.const(np.full(static_shape(result.ty), infinity, dtype=dtype), dtype)
        at_infinity = bb.normalize(relax.op.astype(relax.op.equal(data, relax.const(infinity, dtype)), dtype))
        all_infinite = bb.normalize(tvm("ReduceMin", [at_infinity, *inputs[1:]], attrs))
        return relax.op.where(relax.op.equal(all_infinite, relax.const(1.0, dtype)), relax.const(infinity, dtype), result)

    return convert


def split(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    """Split into pieces some of which are empty: TVM's split takes increasing indices only."""
    sizes = attrs.get("split")
    if sizes is None and len(inputs) > 1 and inputs[1] is not None and is_tensor_constant(inputs[1]):
        sizes = constant_array(inputs[1]).tolist()
    if sizes is None or 0 not in sizes:
        return None
    data = inputs[0]
    rank = len(static_shape(data.ty, "the input of Split"))
    axis = attrs.get("axis", 0)
    axis = axis + rank if axis < 0 else axis
    starts = np.cumsum([0, *sizes])
    return relax.Tuple([bb.emit(relax.op.strided_slice(data, axes=[axis], begin=[int(b)], end=[int(e)]))
                        for b, e in zip(starts[:-1], starts[1:])])


def reshape(bb, inputs, attrs, opset, tvm_converter) -> relax.Expr | None:
    """A dimension (a scalar shape value: Squeeze of Shape, and sums of such) reshaped to one
    element, as torch's exporter writes `past + seq` before concatenating it into a shape: a
    one-dimension shape value, which TVM's Concat and Expand follow (its converter refuses to
    reshape a scalar that is not a tensor)."""
    data = inputs[0]
    # TVM's converters pass a dimension as a PrimExpr (past + seq) or as a PrimValue around one
    dimension = data if tvm.ir.is_prim_expr(data) else getattr(data, "value", None) if isinstance(data.ty, tvm.ir.PrimType) else None
    if dimension is None or _scalar_constant(inputs[1]) not in (1.0, -1.0):
        return None
    return relax.ShapeExpr([dimension])


def tile(bb, inputs, attrs, opset, tvm_converter) -> relax.Expr | None:
    """Tile whose repeats are a shape value (DeBERTa repeats its relative positions over the
    batch, `Tile(x, Concat(Shape(mask)[0:1], 1, 1))`): x seen with a unit axis before each of
    its axes, broadcast to the repeats there, and the pairs merged. TVM's converter takes
    constant repeats only ("cannot handle ShapeExpr inputs")."""
    x, repeats = inputs
    ty = repeats.ty
    values = getattr(ty, "values", None) if isinstance(ty, relax.ShapeType) else None
    if values is None or x.ty.shape is None or not isinstance(x.ty.shape, relax.ShapeExpr):
        return None
    dims = list(x.ty.shape.values)
    if len(values) != len(dims):
        raise ModelLoadError(f"Tile's repeats have {len(values)} values for an input of rank {len(dims)}")
    unit = tvm.tirx.IntImm("int64", 1)
    spread = bb.normalize(relax.op.reshape(x, relax.ShapeExpr([d for dim in dims for d in (unit, dim)])))
    wide = bb.normalize(relax.op.broadcast_to(spread, relax.ShapeExpr([d for r, dim in zip(values, dims) for d in (r, dim)])))
    return relax.op.reshape(wide, relax.ShapeExpr([r * dim for r, dim in zip(values, dims)]))


def slice_v1(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    """Slice before opset 10 gives starts, ends and axes as attributes; TVM's converter reads
    only the inputs of the later form."""
    if opset >= 10:
        return None
    bounds = [relax.const(np.array(attrs[name], "int64"), "int64") if name in attrs else None for name in ("starts", "ends", "axes")]
    rest = {k: v for k, v in attrs.items() if k not in ("starts", "ends", "axes")}
    return tvm("Slice", [inputs[0], *bounds, None], rest)


def prelu(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    """Before opset 7 PRelu's slope is one value or one per channel (axis 1); from opset 7 it
    broadcasts from the last axis. TVM's converter assumes the later form and fails on a slope
    that does not broadcast with an IndexError."""
    x, slope = inputs
    if not (has_static_shape(x.ty) and has_static_shape(slope.ty)):
        return None
    shape, slopes = static_shape(x.ty, "the input of PRelu"), static_shape(slope.ty, "the slope of PRelu")
    if opset < 7 and len(slopes) == 1 and len(shape) > 1 and slopes[0] == shape[1] != 1:
        return relax.op.nn.prelu(x, slope, axis=1)
    if len(slopes) > len(shape) or any(s not in (1, d) for s, d in zip(slopes[::-1], shape[::-1])):
        raise ModelLoadError(f"PRelu's slope of shape {tuple(slopes)} does not broadcast to its input's {tuple(shape)} "
                             "(from opset 7 the slope broadcasts from the last axis)")
    return None


def pad(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    """Pad of a float tensor by constant, non-negative widths with a constant value: one
    `relax.nn.pad`, which vendors take (TVM's converter emits a kernel of its own, which none
    can, and which cut Swin's window attention into regions)."""
    mode = attrs.get("mode", b"constant")
    data = inputs[0]
    if (mode.decode() if isinstance(mode, bytes) else mode) != "constant" or not str(data.ty.dtype).startswith("float"):
        return None
    rank = data.ty.ndim  # the widths are per axis; the sizes may be symbolic
    if rank < 0:
        return None
    if opset < 11:
        widths, value = np.array(attrs.get("pads", [0] * 2 * rank)), float(attrs.get("value", 0.0))
    else:
        widths = _constant_operand(inputs, 1)
        value = _scalar_constant(inputs[2]) if len(inputs) > 2 and inputs[2] is not None else 0.0
        axes = _constant_operand(inputs, 3)
        if widths is None or value is None or (len(inputs) > 3 and inputs[3] is not None and axes is None):
            return None
        if axes is not None:
            full = np.zeros(2 * rank, dtype=np.int64)
            for i, axis in enumerate(int(a) % rank for a in axes):
                full[axis], full[rank + axis] = widths[i], widths[len(axes) + i]
            widths = full
    if len(widths) != 2 * rank or (widths < 0).any():
        return None  # negative widths crop: TVM's converter
    return relax.op.nn.pad(data, [int(w) for pair in zip(widths[:rank], widths[rank:]) for w in pair], "constant", value)


def rms_normalization(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    """x / sqrt(mean(x^2) + epsilon) * scale over the trailing axes from `axis`, in float32
    (TVM's converter fails when the axes cover the whole tensor)."""
    data, scale = inputs[0], inputs[1]
    dtype = str(data.ty.dtype)
    rank = len(static_shape(data.ty, "the input of RMSNormalization"))
    axis = attrs.get("axis", -1)
    axes = list(range(axis + rank if axis < 0 else axis, rank))
    wide = relax.op.astype(data, "float32") if dtype != "float32" else data
    mean_square = bb.emit(relax.op.mean(relax.op.multiply(wide, wide), axes, keepdims=True))
    inverse = bb.emit(relax.op.rsqrt(relax.op.add(mean_square, relax.const(float(attrs.get("epsilon", 1e-5)), "float32"))))
    normalized = bb.emit(relax.op.multiply(wide, inverse))
    if dtype != "float32":
        normalized = bb.emit(relax.op.astype(normalized, dtype))
    return relax.op.multiply(normalized, scale)


def power(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    """Pow with an exponent of another type: the result has the base's type (TVM wants one)."""
    base, exponent = inputs[0], inputs[1]
    if str(base.ty.dtype) == str(exponent.ty.dtype):
        return None
    dtype = str(base.ty.dtype)
    if dtype.startswith("float"):
        return relax.op.power(base, relax.op.astype(exponent, dtype))
    wide = "float64" if "64" in dtype or "64" in str(exponent.ty.dtype) else "float32"
    return relax.op.astype(relax.op.power(relax.op.astype(base, wide), relax.op.astype(exponent, wide)), dtype)


def one_hot(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    """OneHot with a depth of any numeric type (TVM wants an integer) and negative indices
    counted from the end, as ONNX defines them."""
    indices, depth, values = inputs[0], inputs[1], inputs[2]
    if not (is_tensor_constant(depth) and is_tensor_constant(values)):
        return None
    size = int(constant_array(depth).reshape(()))
    off, on = constant_array(values).reshape(-1)[:2].tolist()
    if not str(indices.ty.dtype).startswith(("int", "uint")):  # ONNX takes indices of any numeric type
        indices = bb.emit(relax.op.astype(indices, "int64"))
    dtype = str(indices.ty.dtype)
    wrapped = bb.emit(relax.op.where(relax.op.less(indices, relax.const(0, dtype)),
                                     relax.op.add(indices, relax.const(size, dtype)), indices))
    values_dtype = str(values.ty.dtype)
    axis = attrs.get("axis", -1)
    if axis < -1:  # TVM's one_hot counts only -1 from the end
        axis += len(static_shape(indices.ty, "the indices of OneHot")) + 1
    return relax.op.one_hot(wrapped, relax.prim_value(tvm_scalar(on, values_dtype)), relax.prim_value(tvm_scalar(off, values_dtype)),
                            size, axis)


def conv_transpose(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    if "output_shape" not in attrs:
        return None
    data_shape = static_shape(inputs[0].ty, "the input of ConvTranspose")
    kernel = attrs.get("kernel_shape") or static_shape(inputs[1].ty, "the weight of ConvTranspose")[2:]
    spatial = len(data_shape) - 2
    strides = list(attrs.get("strides", [1] * spatial))
    dilations = list(attrs.get("dilations", [1] * spatial))
    output_padding = list(attrs.get("output_padding", [0] * spatial))
    output_shape = list(attrs["output_shape"])[-spatial:]
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    upper = (auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad) == "SAME_UPPER"
    begin, end = [], []
    for i in range(spatial):
        total = strides[i] * (data_shape[i + 2] - 1) + output_padding[i] + (kernel[i] - 1) * dilations[i] + 1 - output_shape[i]
        if total < 0:
            output_padding[i] -= total
            total = 0
        first = total // 2 if upper else total - total // 2
        begin.append(first)
        end.append(total - first)
    rest = {k: v for k, v in attrs.items() if k not in ("output_shape", "auto_pad")}
    return tvm("ConvTranspose", inputs, {**rest, "pads": begin + end, "output_padding": output_padding})


def is_inf(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    negative, positive = attrs.get("detect_negative", 1), attrs.get("detect_positive", 1)
    if negative and positive:
        return None
    data = inputs[0]
    infinite = relax.op.isinf(data)
    if not (negative or positive):
        return relax.op.logical_and(infinite, relax.op.not_equal(data, data))  # all false, shaped like data
    zero = relax.const(0, str(data.ty.dtype))
    side = relax.op.greater(data, zero) if positive else relax.op.less(data, zero)
    return relax.op.logical_and(infinite, side)


def mish(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    # tanh(log(1 + e)) = (e^2 + 2e) / (e^2 + 2e + 2) for e = e^x; above x = 20 mish(x) is x.
    data = inputs[0]
    dtype = str(data.ty.dtype)
    bound = relax.const(20.0, dtype)
    e = bb.emit(relax.op.exp(relax.op.minimum(data, bound)))
    numerator = bb.emit(relax.op.multiply(e, relax.op.add(e, relax.const(2.0, dtype))))
    tanh_softplus = relax.op.divide(numerator, relax.op.add(numerator, relax.const(2.0, dtype)))
    return relax.op.where(relax.op.greater(data, bound), data, relax.op.multiply(data, tanh_softplus))


def softplus(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    data = inputs[0]
    dtype = str(data.ty.dtype)
    one = relax.const(1.0, dtype)
    small = bb.emit(relax.op.exp(relax.op.negative(relax.op.abs(data))))
    shifted = bb.emit(relax.op.add(one, small))
    # log1p(u) = u * log(1 + u) / ((1 + u) - 1): exact where 1 + u rounds, and u itself where it rounds to 1.
    log1p = relax.op.where(relax.op.equal(shifted, one), small,
                           relax.op.divide(relax.op.multiply(small, relax.op.log(shifted)), relax.op.subtract(shifted, one)))
    return relax.op.add(relax.op.maximum(data, relax.const(0.0, dtype)), log1p)


def eye_like(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    from onnx.helper import tensor_dtype_to_np_dtype

    rows, columns = static_shape(inputs[0].ty, "the input of EyeLike")
    dtype = tensor_dtype_to_np_dtype(attrs["dtype"]) if "dtype" in attrs else np.dtype(str(inputs[0].ty.dtype))
    return relax.const(np.eye(rows, columns, k=int(attrs.get("k", 0)), dtype=dtype), str(dtype))


def space_to_depth(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    if _text(attrs.get("mode"), "DCR") != "CRD":
        return None
    n, c, h, w = static_shape(inputs[0].ty, "the input of SpaceToDepth")
    b = int(attrs["blocksize"])
    blocks = relax.op.reshape(inputs[0], (n, c, h // b, b, w // b, b))
    return relax.op.reshape(relax.op.permute_dims(blocks, (0, 1, 3, 5, 2, 4)), (n, c * b * b, h // b, w // b))


def upsample(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    data = inputs[0]
    factors = attrs.get("scales") or (constant_array(inputs[1]).reshape(-1).tolist() if len(inputs) > 1 and is_tensor_constant(inputs[1]) else None)
    shape = static_shape(data.ty, "the input of Upsample")
    if factors is None or len(shape) != 4 or factors[0] != 1 or factors[1] != 1:
        return None
    size = [int(math.floor(d * f)) for d, f in zip(shape[2:], factors[2:])]
    method = "nearest_neighbor" if _text(attrs.get("mode"), "nearest") == "nearest" else "linear"
    return relax.op.image.resize2d(data, size, layout="NCHW", method=method, coordinate_transformation_mode="asymmetric",
                                   rounding_method="floor")


def non_max_suppression(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    # ONNX's defaults: no box kept, IoU threshold 0, no score threshold (TVM assumes IoU 0.5
    # and a score threshold of 0, which drops every negative score).
    defaults = {2: np.array([0], np.int64), 3: np.array([0.0], np.float32), 4: np.array([-np.inf], np.float32)}
    absent = [i for i in defaults if len(inputs) <= i or inputs[i] is None]
    if not absent:
        return None
    filled = [*inputs[:2], *(relax.const(defaults[i]) if i in absent else inputs[i] for i in defaults)]
    return tvm("NonMaxSuppression", filled, attrs)


def _text(value: Any, default: str) -> str:
    if value is None:
        return default
    return value.decode() if isinstance(value, bytes) else str(value)


def _variadic(binary: Callable[[relax.Expr, relax.Expr], relax.Expr], mean: bool = False) -> Converter:
    def convert(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
        operands = [i for i in inputs if i is not None]
        result = operands[0]
        for operand in operands[1:]:
            result = bb.emit(binary(result, operand))
        if mean and len(operands) > 1:
            return relax.op.divide(result, relax.const(float(len(operands)), str(result.ty.dtype)))
        return result

    return convert


def _constant_operand(inputs, index: int) -> np.ndarray | None:
    """A constant, non-empty optional operand as an array, else None."""
    if len(inputs) <= index or inputs[index] is None or not is_tensor_constant(inputs[index]):
        return None
    array = constant_array(inputs[index]).reshape(-1)
    return array if array.size else None


def _resize_refusal(attrs: dict[str, Any], shape: list[int], scales: np.ndarray | None, sizes: np.ndarray | None) -> str | None:
    """Why TVM's resize would get this Resize wrong, or None."""
    if attrs.get("antialias", 0):
        return "Resize with antialias=1 is not supported (TVM's resize does not antialias)"
    if _text(attrs.get("keep_aspect_ratio_policy"), "stretch") != "stretch":
        return "Resize with a keep_aspect_ratio_policy is not supported"
    mapping = _text(attrs.get("coordinate_transformation_mode"), "half_pixel")
    if mapping == "half_pixel_symmetric":
        return "Resize's half_pixel_symmetric coordinate mapping is not supported by TVM's resize"
    if "axes" in attrs:
        return None
    spatial = shape[2:]
    if scales is not None and _text(attrs.get("mode"), "nearest") != "nearest":
        factors = scales[-len(spatial):]
        if any(abs(d * f - round(d * f)) > 1e-6 for d, f in zip(spatial, factors)):
            return (f"Resize by scales {[round(float(f), 6) for f in factors]} is not supported: they give fractional output "
                    "sizes, and TVM maps coordinates by the ratio of the sizes, ONNX by the scales")
    out = sizes[-len(spatial):] if sizes is not None else (np.floor(np.multiply(spatial, scales[-len(spatial):])) if scales is not None else None)
    if mapping == "align_corners" and out is not None and any(int(o) == 1 for o in out):
        return "Resize with align_corners onto a single pixel is not supported (TVM divides by zero)"
    return None


def resize(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    data = inputs[0]
    shape = static_shape(data.ty, "the input of Resize")
    scales, sizes = _constant_operand(inputs, 2), _constant_operand(inputs, 3)
    refusal = _resize_refusal(attrs, shape, scales, sizes)
    if refusal is not None:
        raise ModelLoadError(refusal)
    given = sizes if sizes is not None else scales
    if "axes" not in attrs or given is None:
        return None
    # TVM wants a size or scale for every axis, and a region of interest over every axis.
    rank = len(shape)
    axes = [a + rank if a < 0 else a for a in attrs["axes"]]
    full = np.array(shape if sizes is not None else [1.0] * rank, "int64" if sizes is not None else "float32")
    full[axes] = given
    roi, roi_given = inputs[1] if len(inputs) > 1 else None, _constant_operand(inputs, 1)
    if roi_given is not None and roi_given.size == 2 * len(axes):
        full_roi = np.array([0.0] * rank + [1.0] * rank, "float32")
        full_roi[axes] = roi_given[: len(axes)]
        full_roi[[a + rank for a in axes]] = roi_given[len(axes):]
        roi = relax.const(full_roi)
    rest = {k: v for k, v in attrs.items() if k != "axes"}
    operands = [data, roi, None, relax.const(full)] if sizes is not None else [data, roi, relax.const(full)]
    return tvm("Resize", operands, rest)


def unsqueeze(bb, inputs, attrs, opset, tvm) -> relax.Expr | None:
    """One axis given as a 0-d tensor (onnx's own function body of AffineGrid writes it so, and
    onnxruntime takes it), as the 1-D tensor TVM's converter reads: it failed on it (a
    TypeError)."""
    if len(inputs) > 1 and inputs[1] is not None and is_tensor_constant(inputs[1]) and constant_array(inputs[1]).ndim == 0:
        return tvm("Unsqueeze", [inputs[0], relax.const(constant_array(inputs[1]).reshape(1))], attrs)
    return None


CONVERTERS: dict[str, Converter] = {
    "IsInf": is_inf,
    "Einsum": einsum,
    "Mish": mish,
    "Resize": resize,
    "Softplus": softplus,
    "Sum": _variadic(relax.op.add),
    "Max": _variadic(relax.op.maximum),
    "Min": _variadic(relax.op.minimum),
    "Mean": _variadic(relax.op.add, mean=True),
    "EyeLike": eye_like,
    "SpaceToDepth": space_to_depth,
    "Upsample": upsample,
    "NonMaxSuppression": non_max_suppression,
    "ConvTranspose": conv_transpose,
    "OneHot": one_hot,
    "RMSNormalization": rms_normalization,
    "Pow": power,
    "Split": split,
    "Slice": slice_v1,
    "Tile": tile,
    "Reshape": reshape,
    "PRelu": prelu,
    "Pad": pad,
    "ReduceMax": _reduce_extreme("ReduceMax", -math.inf),
    "ReduceMin": _reduce_extreme("ReduceMin", math.inf),
    "Clip": clip,
    "Shape": shape,
    "Range": range_,
    "Dropout": dropout,
    "LayerNormalization": layer_normalization,
    "Unsqueeze": unsqueeze,
    **INDEX_CONVERTERS,
    **SEQUENCE_CONVERTERS,
}
