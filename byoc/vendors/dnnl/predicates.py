"""oneDNN's limits, one predicate each; a predicate returns the reason it rejects."""

from __future__ import annotations

import math

import tvm
from tvm import relax

from byoc.annotate.predicates import scalar_constant
from byoc.codegen_c.onednn.emitters.elementwise import middle_block
from byoc.ir.types import constant_array, dtype_name, is_tensor_constant, static_shape
from byoc.timing import onednn_has_avx512_core


def _shape(expr: relax.Expr) -> tuple[int, ...]:
    return static_shape(expr.ty)


_CONV_LAYOUTS = {"relax.nn.conv1d": ("NCW", "OIW", "NCW"), "relax.nn.conv2d": ("NCHW", "OIHW", "NCHW")}


def conv_channels_first(call: relax.Call) -> str | None:
    attrs = call.attrs
    wanted = _CONV_LAYOUTS[call.op.name]
    if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != wanted:
        return f"layouts {attrs.data_layout}/{attrs.kernel_layout}; oneDNN kernels here take {wanted[0]}/{wanted[1]}"
    if not is_tensor_constant(call.args[1]):
        return "convolution weights must be constants (reordered once at load)"
    return None


def fused_conv(match) -> str | None:
    reason = conv_channels_first(match["root"])
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
    if is_tensor_constant(call.args[1]) and len(b) == 2:
        return None
    if len(a) != len(b) or any(i != j and 1 not in (i, j) for i, j in zip(a[:-2], b[:-2])):
        return f"batched matmul needs equal batch dimensions, or 1 on one side, got {a} x {b}"
    return None


def pool_nchw(call: relax.Call) -> str | None:
    if call.attrs.layout != "NCHW" or len(_shape(call.args[0])) != 4:
        return "pooling takes 4-D NCHW tensors"
    return None


def binary_broadcast(call: relax.Call) -> str | None:
    a, b, out = _shape(call.args[0]), _shape(call.args[1]), _shape(call)
    commutative = call.op.name in ("relax.add", "relax.multiply")
    if call.op.name in ("relax.divide", "relax.subtract") and scalar_constant(call.args[0]) is not None:
        return None  # c / x and c - x are element-wise ops (pow and linear)
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


def group_norm_channels_first(call: relax.Call) -> str | None:
    """Group normalisation over every axis after the channels (axis 1), with constant scale and
    shift."""
    attrs = call.attrs
    shape = _shape(call.args[0])
    rank = len(shape)
    if rank < 3 or int(attrs.channel_axis) % rank != 1:
        return "group normalisation with the channels on axis 1 only"
    if sorted(int(a) % rank for a in attrs.axes) != list(range(2, rank)):
        return "group normalisation over every axis after the channels only"
    if not all(is_tensor_constant(a) for a in call.args[1:3]):
        return "scale and shift must be constant"
    return None


_TO_NEAREST = ("", "round", "round_prefer_floor", "round_prefer_ceil")


def onednn_resampling(call: relax.Call) -> str | None:
    """A resize oneDNN's resampling computes as the model does. oneDNN maps an output position o
    to the input position (o + 0.5) * in / out - 0.5, taking the nearest (rounded) or
    interpolating linearly between the two around it, clamped to the edges. That is ONNX's and
    torch's `half_pixel` linear resize at any size, and, for a nearest resize by a whole factor,
    both `half_pixel` rounded to the nearest (no position falls half-way, so how ties go does not
    matter) and `asymmetric` with `floor` (torch's nn.Upsample, YOLO's). Other modes
    (align_corners, cubic, half_pixel rounded up or down) stay on the host."""
    attrs = call.attrs
    if attrs.layout != "NCHW":
        return "a resize of NCHW data only"
    if attrs.out_dtype is not None and str(attrs.out_dtype) not in ("", "float32"):
        return "a resize that keeps the dtype only"
    shape, size = _shape(call.args[0]), _shape(call)
    mode = str(attrs.coordinate_transformation_mode)
    if attrs.method == "linear":
        if mode == "half_pixel" or (mode == "pytorch_half_pixel" and min(size[2:]) > 1):
            return None
        return f"a linear resize with {mode} coordinates (oneDNN's are half_pixel)"
    if attrs.method != "nearest_neighbor":
        return f"a {attrs.method} resize (oneDNN has nearest and linear)"
    if any(o % i for i, o in zip(shape[2:], size[2:])):
        return "a nearest resize by a whole factor only"
    rounding = str(attrs.rounding_method)
    if (mode in ("half_pixel", "pytorch_half_pixel") and rounding in _TO_NEAREST) or (mode == "asymmetric" and rounding == "floor"):
        return None
    return f"a nearest resize with {mode} coordinates and {attrs.rounding_method or 'default'} rounding"


def sum_axes(call: relax.Call) -> str | None:
    """A sum over the innermost axes, which oneDNN 3.2 reduces in its JIT kernel, or over one
    block of middle axes of float32, which the region computes as a product by a row of ones
    (byoc.codegen_c.onednn.emitters.elementwise). Any other axes oneDNN reduces in its reference
    code (ConvNeXt V2's sum over height and width, channels last, as a reduction: 0.17 ms for
    16 KB, and the model 1.8x slower than with the sums on the host)."""
    shape, axes = _shape(call.args[0]), call.attrs.axis
    rank = len(shape)
    reduced = sorted(range(rank) if axes is None else {int(a) % rank for a in axes})
    if reduced == list(range(rank - len(reduced), rank)):
        return None
    if dtype_name(call.args[0].ty) == "float32" and middle_block(shape, reduced):
        return None
    return "a sum over axes that are neither the innermost nor one block of middle axes of float32"


def power_scalar(call: relax.Call) -> str | None:
    if scalar_constant(call.args[1]) is None:
        return "the exponent must be one constant number"
    return None if not is_tensor_constant(call.args[0]) else "the base is a constant"


def dense_residual(match) -> str | None:
    if _shape(match["residual"]) != _shape(match["root"]):
        return "the residual must have the output's shape"
    return dense_constant_weight(match)


# The axes along which a tensor added to a matrix product may vary (by the product's rank) for
# oneDNN 3.2 to run the sum as a binary post-op in its JIT kernels (brgemm, and GEMM on AVX2:
# the same on both). Any other broadcast runs the whole product in its reference code: Swin's
# position bias (1, heads, n, n) over (windows, heads, n, n) took 0.56 ms a product there, so
# such a sum is a primitive of its own.
_POST_OP_AXES = {2: ((), (1,), (0, 1)), 3: ((), (1,), (2,), (0, 2), (0, 1, 2)), 4: ((), (3,), (0, 3), (0, 2, 3), (0, 1, 2, 3))}


def _post_op_broadcast(added: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """Whether `added` (the product's rank, each dimension the product's or 1) broadcasts over
    `out` as oneDNN's JIT matrix products take a binary post-op (see `_POST_OP_AXES`)."""
    varies = {axis for axis, (a, o) in enumerate(zip(added, out)) if a == o > 1}
    free = {axis for axis, o in enumerate(out) if o == 1}
    axes = _POST_OP_AXES.get(len(out), ((), tuple(range(len(out)))))
    return any(set(taken) - free == varies for taken in axes)


def activation_product(match) -> str | None:
    """A product (of two activations, or a dense layer without bias) whose constant scales and
    added tensors are post-ops."""
    product = match["root"]
    for name in ("scale", "scale_a", "scale_b"):
        if match.get(name) is not None and scalar_constant(match[name]) is None:
            return "a scale must be one number"
    out = _shape(product)
    for index in range(2):
        added = match.get(f"added{index}")
        if added is None:
            continue
        shape = _shape(added)
        if len(shape) != len(out) or any(d not in (1, o) for d, o in zip(shape, out)):
            return "an added tensor must have the product's rank, each dimension the product's or 1"
        if not _post_op_broadcast(shape, out):
            return f"an added tensor of shape {shape} over the product's {out} is a post-op of oneDNN's reference code only"
    return matmul_shapes(product)


def take_constant_index(call: relax.Call) -> str | None:
    index, axis = call.args[1], call.attrs.axis
    if not is_tensor_constant(index) or constant_array(index).size != 1 or len(_shape(index)) > 1:
        return "only one constant index (a window of the input) is taken"
    size = _shape(call.args[0])[int(axis)]
    value = int(constant_array(index).reshape(()))
    return None if -size <= value < size else f"index {value} is out of range [{-size}, {size - 1}]"


def window_slice(call: relax.Call) -> str | None:
    values = [list(arg.fields) for arg in call.args[1:]]
    if not all(isinstance(v, tvm.tirx.IntImm) for arg in values for v in arg):
        return "slice bounds must be numbers"
    if any(int(v.value) < 1 for v in (values[3] if len(values) > 3 else ())):
        return "a slice with negative steps (reversed)"
    return None if math.prod(_shape(call)) > 0 else "an empty slice"


def constant_pad(call: relax.Call) -> str | None:
    return None if call.attrs.pad_mode == "constant" else f"pad mode {call.attrs.pad_mode!r}; constant padding is taken"


def scalar_selection(call: relax.Call) -> str | None:
    """where(condition, x, c) or where(condition, c, x): a condition fixed in the model (a
    causal mask) or given to the region (a padding mask the host computed from the model's
    input), a one-number constant c, and x of the result's shape (see `byoc.codegen_c.onednn.emitters.select`)."""
    condition, *values = call.args
    if dtype_name(condition.ty) != "bool":
        return "the condition must be boolean"
    scalars = [scalar_constant(v) for v in values]
    if sum(s is not None for s in scalars) != 1:
        return "exactly one of the two values must be a one-number constant"
    x, constant, out = values[scalars.index(None)], next(s for s in scalars if s is not None), _shape(call)
    if _shape(x) != out:
        return "the selected tensor must have the result's shape"
    if math.isnan(constant):
        return "the constant is NaN, which a minimum and a maximum do not keep"
    mask = list(_shape(condition))
    while mask and mask[0] == 1:
        mask.pop(0)
    if len(mask) > len(out) or (mask and tuple(mask) != out[len(out) - len(mask):]):
        return f"the condition {_shape(condition)} must be the result's last dimensions {out}, broadcast over the others"
    return None


def float_cast(call: relax.Call) -> str | None:
    """A float16 model's input or output cast. oneDNN 3.2 converts float16 by a JIT kernel only
    with AVX-512; below it, its reference reorder took 92 ms for GPT-2's logits (128 x 50257),
    the host's kernel 14 ms (byoc.host.half)."""
    if {dtype_name(call.args[0].ty), dtype_name(call.ty)} != {"float32", "float16"}:
        return "casts between float32 and float16 only"
    return None if onednn_has_avx512_core() else "float16 casts need AVX-512 (oneDNN 3.2's other reorders of float16 are slow)"


def repeat_along_an_axis(call: relax.Call) -> str | None:
    return None if call.attrs.axis is not None else "a repeat over the flattened tensor"


def deconvolution_nchw(call: relax.Call) -> str | None:
    attrs = call.attrs
    if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != ("NCHW", "IOHW", "NCHW"):
        return f"layouts {attrs.data_layout}/{attrs.kernel_layout}; oneDNN's deconvolution here takes NCHW/IOHW"
    if not is_tensor_constant(call.args[1]):
        return "deconvolution weights must be constants (reordered once at load)"
    if any(int(p) < int(o) for p, o in zip(list(attrs.padding)[2:], attrs.output_padding)):
        return "an output padding larger than the end padding (oneDNN takes it off the end padding)"
    return None


def fused_deconvolution(match) -> str | None:
    return deconvolution_nchw(match["root"])
