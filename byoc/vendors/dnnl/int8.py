"""oneDNN int8: the kernels of a quantized (QDQ) model, computed in int8 with the model's own scales.

A quantized model reads each convolution and matrix product as dequantize -> op -> quantize
(onnxruntime's `quantize_static` writes them so). Each such chain, with its bias and activation,
is one composite here and one int8 oneDNN primitive (see `dnnl.quantization`). A quantize or
dequantize between them (around a residual add, a pooling, a reshape) is a reorder between int8
and float32, so that a quantized model stays in one region where its float model does.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax
from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from byoc.annotate.patterns import unary
from byoc.annotate.predicates import clip_bounds
from byoc.backend import Backend
from byoc.frontend.quantized import same_quantization
from byoc.ir.types import constant_array, dtype_name, is_tensor_constant, op_name, static_shape
from byoc.vendors.dnnl import emitters
from byoc.vendors.dnnl.predicates import binary_broadcast, expected_constants, layer_norm_last_axis, scalar_constant

_ACTIVATIONS = ("relax.nn.relu", "relax.clip")
_OPS = {"conv2d": "relax.nn.conv2d", "conv1d": "relax.nn.conv1d", "dense": "relax.matmul"}


def _dequantized(constant: bool) -> DFPattern:
    return is_op("relax.dequantize")(is_const() if constant else wildcard(), is_const(), is_const())


def _quantized(value: DFPattern) -> DFPattern:
    return is_op("relax.quantize")(value, is_const(), is_const())


def _quantized_pattern(op: str, bias: bool, activation: bool, quantized_output: bool) -> tuple[DFPattern, dict[str, DFPattern]]:
    """dequantize(x), dequantize(constant w) -> `op` [-> add a constant bias] [-> ReLU or clip] [-> quantize]."""
    source, weights = _dequantized(False), _dequantized(True)
    out = root = is_op(op)(source, weights)
    parts: dict[str, DFPattern] = {"root": root, "source": source, "weights": weights}
    if bias:
        parts["bias"] = is_const()
        out = is_op("relax.add")(out, parts["bias"])
    if activation:
        out = unary(_ACTIVATIONS[0], out) | unary(_ACTIVATIONS[1], out)
    if quantized_output:
        out = parts["output"] = _quantized(out)
    return out, parts


def _quantized_residual(op: str, residual_first: bool, relu: bool) -> tuple[DFPattern, dict[str, DFPattern]]:
    """A quantized convolution whose quantized result is added to another quantized tensor and
    quantized again (a residual block's end): quantize([ReLU](dequantize(quantize(conv + bias)) +
    dequantize(b))). One pattern per operand order, as for the float residual patterns."""
    convolution, parts = _quantized_pattern(op, bias=True, activation=False, quantized_output=True)
    parts["inner_quantize"] = parts.pop("output")
    parts["inner"] = is_op("relax.dequantize")(convolution, is_const(), is_const())
    parts["residual"] = _dequantized(False)
    added = is_op("relax.add")(*((parts["residual"], parts["inner"]) if residual_first else (parts["inner"], parts["residual"])))
    out = parts["output"] = _quantized(unary("relax.nn.relu", added) if relu else added)
    return out, parts


def quantized_residual(match) -> str | None:
    """The conv's result is quantized and read back with one scale and zero point: fused, that
    rounding step is skipped (the result is nearer the float model's, within a step of onnxruntime's)."""
    inner, quantize = match["inner"], match["inner_quantize"]
    if not same_quantization(quantize, inner):
        return "the convolution's result is read back with another scale than it was quantized with"
    if static_shape(match["residual"].ty) != static_shape(match["root"].ty):
        return "the residual operand is broadcast; a fused residual add needs the full output shape"
    if match["root"].attrs.groups > 1:
        return "a grouped convolution does not take a fused residual add"  # oneDNN 3.2: reference code, see fused_conv
    return _per_tensor(match["residual"], "residual") or quantized_kernel(match)


def _result(match) -> str | None:
    """Why a kernel's result quantize (where it has one) is not one oneDNN takes."""
    output = match.get("output")
    return _per_tensor(output, "result") if output is not None else None


def _source_and_result(match) -> str | None:
    return _per_tensor(match["source"], "source") or _result(match)


def _per_tensor(call: relax.Call, what: str) -> str | None:
    scale, zero = (constant_array(a) for a in call.args[1:3])
    if scale.size != 1 or np.unique(zero).size != 1:
        return f"the {what} is quantized per channel; oneDNN takes one scale and zero point for it"
    return None


def _weights(call: relax.Call, channel_axis: int) -> str | None:
    data, scale, zero = call.args
    if dtype_name(data.ty) != "int8":
        return f"weights are {dtype_name(data.ty)}; oneDNN's int8 kernels take int8 weights"
    if np.any(constant_array(zero) != 0):
        return "weights have a zero point other than 0; oneDNN's int8 kernels take symmetric weights"
    rank = len(static_shape(data.ty))
    if constant_array(scale).size > 1 and int(call.attrs.axis) % rank != channel_axis % rank:
        return f"weights are quantized along axis {int(call.attrs.axis)}, not per output channel"
    return None


def quantized_kernel(match) -> str | None:
    """A quantized convolution or dense layer that oneDNN computes in int8."""
    root = match["root"]
    if root.op.name == "relax.matmul":
        if len(static_shape(match["weights"].ty)) != 2:
            return "a quantized matrix product takes 2-D constant weights"
        channel_axis = -1
    else:
        attrs = root.attrs
        if (attrs.data_layout, attrs.kernel_layout) not in (("NCHW", "OIHW"), ("NCW", "OIW")):
            return f"layouts {attrs.data_layout}/{attrs.kernel_layout}; oneDNN kernels here take channels first"
        channel_axis = 0
    return _per_tensor(match["source"], "source") or _weights(match["weights"], channel_axis) or _result(match)


def _quantized_product(quantized_output: bool) -> tuple[DFPattern, dict[str, DFPattern]]:
    """[quantize](matmul(dequantize(a), dequantize(b))) of two quantized activations: attention's
    scores and its weighted sum of the values."""
    parts = {"source": _dequantized(False), "weights": _dequantized(False)}
    out = parts["root"] = is_op("relax.matmul")(parts["source"], parts["weights"])
    if quantized_output:
        out = parts["output"] = _quantized(out)
    return out, parts


def quantized_product(match) -> str | None:
    a, b = (static_shape(match[k].ty) for k in ("source", "weights"))
    if len(a) != len(b) or len(a) < 2 or a[:-2] != b[:-2]:
        return "the operands' batch dimensions differ; an int8 product takes them equal"
    if any(is_tensor_constant(match[k].args[0]) for k in ("source", "weights")):
        return "an operand is constant (see the quantized dense layer)"
    return _per_tensor(match["source"], "first operand") or _per_tensor(match["weights"], "second operand") or _result(match)


_BATCH_NORM = ("relax.subtract", "relax.divide", "relax.multiply", "relax.add")  # as TVM decomposes it, by constants


def _dynamically_quantized(op: str, bias: bool, batch_norm: bool = False, activation: bool = False) -> tuple[DFPattern, dict[str, DFPattern]]:
    """x, quantized at run time by ONNX's DynamicQuantizeLinear as TVM imports it (the range of
    x widened to 0, scale = range / 255, zero point = round(clip(0 - low / scale, 0, 255)) as
    uint8) and read back, times dequantized constant int8 weights (a dense layer or a
    convolution) [+ a constant bias] [then a batch normalisation] [then ReLU or clip]: how
    `quantize_dynamic` writes them (see byoc.frontend.onnx_qoperator). The batch normalisation
    after a convolution (which a float model folds into its weights, but int8 weights cannot
    take) and the activation become post-ops of the int8 kernel."""
    x = wildcard()
    parts: dict[str, DFPattern] = {name: is_const() for name in ("high_floor", "low_ceiling", "levels", "origin")}
    parts["greatest"], parts["least"] = is_op("relax.max")(x), is_op("relax.min")(x)
    high = is_op("relax.maximum")(parts["high_floor"], parts["greatest"])
    low = is_op("relax.minimum")(parts["low_ceiling"], parts["least"])
    scale = is_op("relax.divide")(is_op("relax.subtract")(high, low), parts["levels"])
    parts["clip"] = unary("relax.clip", is_op("relax.subtract")(parts["origin"], is_op("relax.divide")(low, scale)))
    zero = is_op("relax.astype")(is_op("relax.round")(parts["clip"]))
    parts["quantize"] = is_op("relax.quantize")(x, scale, zero)
    parts["source"] = is_op("relax.dequantize")(parts["quantize"], scale, zero)
    parts["weights"] = _dequantized(True)
    out = parts["root"] = is_op(op)(parts["source"], parts["weights"])
    if bias:
        parts["bias"] = is_const()
        out = is_op("relax.add")(out, parts["bias"])
    for index, step in enumerate(_BATCH_NORM if batch_norm else ()):
        parts[f"normalization{index}"] = is_const()
        out = is_op(step)(out, parts[f"normalization{index}"])
    if activation:
        out = unary(_ACTIVATIONS[0], out) | unary(_ACTIVATIONS[1], out)
    return out, parts


_DYNAMIC_CONSTANTS = expected_constants({"high_floor": 0.0, "low_ceiling": 0.0, "levels": 255.0, "origin": 0.0},
                                        "ONNX's DynamicQuantizeLinear")


def dynamically_quantized(match) -> str | None:
    """A dense layer or convolution on an input quantized at run time, computed as one int8 kernel."""
    if any(match[part].attrs.axis is not None for part in ("greatest", "least")):
        return "the input's range is taken along some axes; DynamicQuantizeLinear takes it over the whole tensor"
    if clip_bounds(match["clip"]) != (0.0, 255.0) or dtype_name(match["quantize"].ty) != "uint8":
        return "the input is not quantized to uint8 over [0, 255] as DynamicQuantizeLinear does"
    root = match["root"]
    if root.op.name == "relax.matmul":
        if len(static_shape(match["weights"].ty)) != 2 or len(static_shape(match["source"].ty)) < 2:
            return "a quantized matrix product takes 2-D constant weights"
        channel_axis, channels = -1, static_shape(root.ty)[-1]
    else:
        attrs = root.attrs
        if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) not in (("NCHW", "OIHW", "NCHW"), ("NCW", "OIW", "NCW")):
            return f"layouts {attrs.data_layout}/{attrs.kernel_layout}; oneDNN kernels here take channels first"
        channel_axis, channels = 0, static_shape(root.ty)[1]
    bias = match.get("bias")
    if bias is not None and constant_array(bias).size != channels:
        return "the bias is not one value per output channel"
    rank = len(static_shape(root.ty))
    for index in range(len(_BATCH_NORM)):
        constant = match.get(f"normalization{index}")
        shape = static_shape(constant.ty) if constant is not None else ()
        if constant is not None and math.prod(shape) != 1 and tuple(shape) not in ((1, channels, *[1] * (rank - 2)), (channels, *[1] * (rank - 2))):
            return "the batch normalisation's constants are not one value per output channel"
    return _DYNAMIC_CONSTANTS(match) or _weights(match["weights"], channel_axis)


def _quantized_add() -> tuple[DFPattern, dict[str, DFPattern]]:
    """quantize(add(dequantize(a), dequantize(b))), a ReLU before the quantize or not: a residual add."""
    parts = {"a": _dequantized(False), "b": _dequantized(False)}
    added = parts["root"] = is_op("relax.add")(parts["a"], parts["b"])
    parts["output"] = _quantized(added | unary("relax.nn.relu", added))
    return parts["output"], parts


def quantized_add(match) -> str | None:
    if static_shape(match["a"].ty) != static_shape(match["b"].ty):
        return "the operands are broadcast; an int8 add takes two tensors of one shape"
    return _per_tensor(match["a"], "first operand") or _per_tensor(match["b"], "second operand") or _result(match)


def _quantized_with(op: str, other: str) -> tuple[DFPattern, dict[str, DFPattern]]:
    """quantize(op(dequantize(a), x)), x on either side: a float constant (`other` "constant"),
    or ("other") a float tensor computed in the region: a RMSNorm's or SiLU's product."""
    parts = {"a": _dequantized(False), other: is_const() if other == "constant" else wildcard()}
    parts["root"] = is_op(op)(parts["a"], parts[other]) | is_op(op)(parts[other], parts["a"])
    parts["output"] = _quantized(parts["root"])
    return parts["output"], parts


def _along_leading_axes(shape: tuple[int, ...], full: tuple[int, ...]) -> bool:
    """Whether a tensor of `shape` broadcast to `full` repeats along leading axes only."""
    trailing = shape[next((i for i, d in enumerate(shape) if d != 1), len(shape)):]
    return len(shape) <= len(full) and tuple(full[len(full) - len(trailing):]) == tuple(trailing)


def quantized_with_constant(match) -> str | None:
    constant, a = match["constant"], match["a"]
    if dtype_name(constant.ty) != "float32":
        return "the constant is not float32"
    shape, source = static_shape(constant.ty), static_shape(a.ty)
    if len(shape) > len(source) or static_shape(match["root"].ty) != source:
        return "the constant is broadcast beyond the int8 operand's shape"
    # A product with a tensor runs on the data seen as rows of the constant's size (see
    # emitters.quantized_with_constant): the constant must repeat along the leading axes only.
    if op_name(match["root"]) == "relax.multiply" and math.prod(shape) != 1 and not _along_leading_axes(shape, source):
        return "the constant is broadcast along an inner axis; a product with it on int8 data takes it along the leading axes only"
    return _per_tensor(a, "operand") or _result(match)


_FLOAT_BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")


def _quantized_result(op: str, operands: int = 2) -> tuple[DFPattern, dict[str, DFPattern]]:
    """quantize(op(x, ...)) of float operands: a float op between int8 kernels (a SiLU's product,
    a rotary embedding's, attention's softmax), its result written as int8 by the op itself."""
    parts = {"root": is_op(op)(*(wildcard() for _ in range(operands)))}
    parts["output"] = _quantized(parts["root"])
    return parts["output"], parts


def quantized_result(match) -> str | None:
    root = match["root"]
    if any(dtype_name(a.ty) != "float32" for a in root.args):
        return "the operands are not float32"
    if op_name(root) in ("relax.divide", "relax.subtract") and scalar_constant(root.args[0]) is not None:
        return "c / x and c - x are element-wise ops, which write float32"
    return binary_broadcast(root) or _result(match)


def quantized_with_float(match) -> str | None:
    other, root = match["other"], match["root"]
    if is_tensor_constant(other):
        return "the other operand is a constant (see the constant's own patterns)"
    shape, result = static_shape(other.ty), static_shape(root.ty)
    # oneDNN 3.2's JIT kernel takes a binary post-op's operand whole or along axis 1 only (a
    # RMSNorm's 1 / rms per row), or, the data seen as rows (see emitters._requantizing_rows),
    # broadcast along the leading axes (an attention mask over the heads); any other broadcast
    # runs in its reference code.
    if dtype_name(other.ty) != "float32" or \
            (shape != result and not emitters.one_value_per_row(shape, result) and not _along_leading_axes(shape, result)):
        return "the other operand is not a float32 tensor of the result's shape, one value per row, nor repeated along the leading axes"
    if static_shape(match["a"].ty) != result:
        return "the int8 operand is broadcast"
    if op_name(root) == "relax.divide" and root.args[1].same_as(match["a"]):
        return "x / dequantize(a) divides by the int8 operand"
    return _per_tensor(match["a"], "int8 operand") or _result(match)


def quantized_softmax(match) -> str | None:
    if np.any(constant_array(match["output"].args[2]) != 0):
        return "oneDNN's softmax takes a result scale, not a zero point"
    return _result(match)


def _quantized_layer_norm(quantized_output: bool) -> tuple[DFPattern, dict[str, DFPattern]]:
    """[quantize](layer_norm(dequantize(x))): the layer norm reads the int8 data as it is (see
    `emitters.layer_norm`). A softmax cannot: oneDNN 3.2 applies a source scale to its result."""
    parts = {"source": _dequantized(False)}
    out = parts["root"] = is_op("relax.nn.layer_norm")(parts["source"], is_const(), is_const())
    if quantized_output:
        out = parts["output"] = _quantized(out)
    return out, parts


def quantized_layer_norm(match) -> str | None:
    return layer_norm_last_axis(match["root"]) or _source_and_result(match)


def _quantized_gelu() -> tuple[DFPattern, dict[str, DFPattern]]:
    """0.5 * x * (1 + erf(x / sqrt(2))) with every intermediate result quantized and read back,
    as onnxruntime's tool writes a model's erf GELU: x is read through two dequantizes."""
    x = wildcard()

    def requantized(value: DFPattern) -> DFPattern:
        return is_op("relax.dequantize")(_quantized(value), is_const(), is_const())

    parts = {"source": is_op("relax.dequantize")(x, is_const(), is_const()), "half": is_const(), "sqrt2": is_const(), "one": is_const()}
    half_x = requantized(is_op("relax.multiply")(parts["source"], parts["half"]))
    divided = is_op("relax.divide")(is_op("relax.dequantize")(x, is_const(), is_const()), parts["sqrt2"])
    one_plus = requantized(is_op("relax.add")(requantized(is_op("relax.erf")(divided)), parts["one"]))
    parts["root"] = is_op("relax.multiply")(half_x, one_plus)
    parts["output"] = _quantized(parts["root"])
    return parts["output"], parts


_GELU_CONSTANTS = expected_constants({"sqrt2": math.sqrt(2.0), "one": 1.0, "half": 0.5}, "the erf form of GELU")


def quantized_gelu(match) -> str | None:
    return _GELU_CONSTANTS(match) or _source_and_result(match)


def _quantized_eltwise(op: str) -> tuple[DFPattern, dict[str, DFPattern]]:
    """quantize(op(dequantize(x))), `op` element-wise: exporters' GELU op between two quantized
    dense layers (once `fold_reshapes` has taken the reshapes around it)."""
    parts = {"source": _dequantized(False)}
    parts["root"] = unary(op, parts["source"])
    parts["output"] = _quantized(parts["root"])
    return parts["output"], parts


def _quantized_pool() -> tuple[DFPattern, dict[str, DFPattern]]:
    parts = {"source": _dequantized(False)}
    parts["root"] = is_op("relax.nn.max_pool2d")(parts["source"])
    parts["output"] = _quantized(parts["root"])
    return parts["output"], parts


def quantized_max_pool(match) -> str | None:
    """Max pooling commutes with a quantization that is the same on both sides: it runs on the int8 data."""
    source, output = match["source"], match["output"]
    reason = _per_tensor(source, "source") or _per_tensor(output, "result")
    if reason is None and not same_quantization(output, source):
        return "the result is quantized with another scale than the source"
    if reason is None and dtype_name(source.args[0].ty) != dtype_name(output.ty):
        return "the result is quantized to another type than the source"
    return reason or (None if match["root"].attrs.layout == "NCHW" else "pooling takes NCHW")


def quantize_op(call: relax.Call) -> str | None:
    """A quantize or dequantize on its own: a reorder between float32 and int8."""
    if not all(is_tensor_constant(a) for a in call.args[1:3]):
        return "scale and zero point must be constants"
    if np.unique(constant_array(call.args[2])).size != 1:
        return "zero points differ per channel; oneDNN's reorder takes one"
    return None


def _requantized() -> tuple[DFPattern, dict[str, DFPattern]]:
    """quantize(dequantize(x)) with another scale: int8 data requantized (a softmax's result for
    the product that reads it)."""
    parts = {"source": _dequantized(False)}
    parts["output"] = _quantized(parts["source"])
    return parts["output"], parts


def declare(backend: Backend) -> None:
    """The int8 composites and the quantize/dequantize reorders, declared before the float
    patterns so that a quantized chain is matched whole."""
    for name, op in _OPS.items():
        emit = emitters.dynamic_dense if name == "dense" else emitters.dynamic_convolution
        tails = ((False, False),) if name == "dense" else ((True, True), (True, False), (False, True), (False, False))
        for batch_norm, activation in tails:  # (batch normalisation, activation) after the product, longest first
            for bias in (True, False):
                suffix = "_bias" * bias + "_bn" * batch_norm + "_act" * activation
                backend.pattern(f"q{name}_dynamic{suffix}", *_dynamically_quantized(op, bias, batch_norm, activation),
                                check=dynamically_quantized, emit=emit)
    for name in ("conv2d", "conv1d"):
        for residual_first in (False, True):
            for relu in (True, False):
                backend.pattern(f"q{name}_bias_add{'_relu' * relu}{'_swapped' * residual_first}",
                                *_quantized_residual(_OPS[name], residual_first, relu), check=quantized_residual, emit=emitters.convolution)
    for name, op in _OPS.items():
        emit = emitters.matmul if name == "dense" else emitters.convolution
        for bias in (True, False):
            for activation in (True, False):
                for output in (True, False):
                    suffix = "_bias" * bias + "_act" * activation + ("" if output else "_float")
                    backend.pattern(f"q{name}{suffix}", *_quantized_pattern(op, bias, activation, output), check=quantized_kernel, emit=emit)
    for output in (True, False):
        backend.pattern(f"qmatmul{'' if output else '_float'}", *_quantized_product(output), check=quantized_product, emit=emitters.matmul)
    backend.pattern("qgelu", *_quantized_gelu(), check=quantized_gelu, emit=emitters.quantized_gelu)
    for op in emitters.ELTWISE_OPS:
        backend.pattern(f"qeltwise_{op.removeprefix('relax.').removeprefix('nn.')}", *_quantized_eltwise(op), check=_source_and_result,
                        emit=emitters.quantized_eltwise)
    backend.pattern("qadd", *_quantized_add(), check=quantized_add, emit=emitters.quantized_add)
    for name in ("add", "multiply"):
        backend.pattern(f"q{name}_constant", *_quantized_with(f"relax.{name}", "constant"), check=quantized_with_constant,
                        emit=emitters.quantized_with_constant)
    backend.pattern("qmax_pool2d", *_quantized_pool(), check=quantized_max_pool, emit=emitters.pooling)
    backend.pattern("requantize", *_requantized(), check=_source_and_result, emit=emitters.reorder)
    backend.supports("relax.quantize", "relax.dequantize", check=quantize_op, emit=emitters.reorder)


def declare_results(backend: Backend) -> None:
    """Float ops that write their quantized result as int8, declared after the float composites:
    a composite that ends in a product (the erf GELU of a model byoc quantizes itself, its result
    quantized for the next dense layer) keeps it, rather than losing it to a product alone and
    leaving its erf without a kernel."""
    for output in (True, False):
        backend.pattern(f"qlayer_norm{'' if output else '_float'}", *_quantized_layer_norm(output), check=quantized_layer_norm,
                        emit=emitters.layer_norm)
    backend.pattern("softmax_quantized", *_quantized_result("relax.nn.softmax", operands=1), check=quantized_softmax, emit=emitters.softmax)
    for op in _FLOAT_BINARY:  # one operand int8: read as it is, not through a dequantizing reorder
        backend.pattern(f"q{op.removeprefix('relax.')}_float", *_quantized_with(op, "other"), check=quantized_with_float,
                        emit=emitters.quantized_with_float)
    for op in _FLOAT_BINARY:
        backend.pattern(f"{op.removeprefix('relax.')}_quantized", *_quantized_result(op), check=quantized_result, emit=emitters.binary)
