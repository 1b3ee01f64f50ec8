"""oneDNN int8: the kernels of a quantized (QDQ) model, computed in int8 with the model's own scales.

A quantized model reads each convolution and matrix product as dequantize -> op -> quantize
(onnxruntime's `quantize_static` writes them so; the patterns are `byoc.annotate.qdq`'s). Each
such chain, with its bias and activation, is one composite here and one int8 oneDNN primitive
(see `byoc.codegen_c.onednn.kernel_scales`). A quantize or dequantize between them (around a
residual add, a pooling, a reshape) is a reorder between int8 and float32, so that a quantized
model stays in one region where its float model does. The checks here are oneDNN's limits on
the scales, zero points and types.
"""

from __future__ import annotations

import math

import numpy as np
from tvm import relax

from byoc.annotate import qdq
from byoc.annotate.idioms import GELU_FORMS
from byoc.annotate.predicates import clip_bounds, expected_constants, scalar_constant
from byoc.backend import Backend
from byoc.codegen_c.onednn import ELTWISE_OPS, emitters, int8_elementwise
from byoc.frontend.int8_weights import same_quantization
from byoc.ir.types import constant_array, dtype_name, is_tensor_constant, op_name, static_shape
from byoc.processing.quantize import WEIGHT_LEVELS_WITHOUT_VNNI
from byoc.processing.saturation import Int8Product
from byoc.timing import onednn_has_avx512_core
from byoc.vendors.dnnl.predicates import binary_broadcast, layer_norm_last_axis

_OPS = {"conv2d": "relax.nn.conv2d", "conv1d": "relax.nn.conv1d", "dense": "relax.matmul"}


def saturates(product: Int8Product) -> str | None:
    """Why oneDNN 3.2 cannot compute this int8 kernel exactly without VNNI, or None where it can.
    Measured one kernel at a time under ONEDNN_MAX_CPU_ISA=AVX2 against onnxruntime with VNNI:
    - a matrix product (`gemm:jit`) of a u8 or s8 source is exact with weights within +-64 and
      saturates beyond (9% relative L2 on a dense layer with full-range weights, 20% with an s8
      source); a product of two activations saturates (30% with the weights' zero point 0);
    - a convolution (`jit_uni_int8:avx2`) of a u8 source is exact with weights within +-64 and
      saturates beyond (8.5%); of an s8 source it halves the weights, whatever they are (1-2%)."""
    largest = int(np.abs(product.weights.astype(np.int32)).max()) if product.weights is not None and product.weights.size else 0
    no_vnni = "oneDNN's int8 kernels without VNNI add pairs of products in 16 bits"
    if product.op != "relax.matmul" and product.source_dtype == "int8":
        return f"an s8 source; {no_vnni}, so oneDNN halves the weights"
    if largest > WEIGHT_LEVELS_WITHOUT_VNNI:
        return f"weights reach +-{largest}; {no_vnni}, which saturate with weights beyond +-{WEIGHT_LEVELS_WITHOUT_VNNI}"
    if product.weights is None:
        return f"a product of two activations; {no_vnni}, which saturate with operands of full range"
    return None


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


def quantized_product(match) -> str | None:
    a, b = (static_shape(match[k].ty) for k in ("source", "weights"))
    if len(a) != len(b) or len(a) < 2 or a[:-2] != b[:-2]:
        return "the operands' batch dimensions differ; an int8 product takes them equal"
    if any(is_tensor_constant(match[k].args[0]) for k in ("source", "weights")):
        return "an operand is constant (see the quantized dense layer)"
    return _per_tensor(match["source"], "first operand") or _per_tensor(match["weights"], "second operand") or _result(match)


_DYNAMIC_CONSTANTS = expected_constants(qdq.DYNAMIC_QUANTIZE_CONSTANTS, "ONNX's DynamicQuantizeLinear")


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
    for index in range(len(qdq.BATCH_NORM)):
        constant = match.get(f"normalization{index}")
        shape = static_shape(constant.ty) if constant is not None else ()
        if constant is not None and math.prod(shape) != 1 and tuple(shape) not in ((1, channels, *[1] * (rank - 2)), (channels, *[1] * (rank - 2))):
            return "the batch normalisation's constants are not one value per output channel"
    return _DYNAMIC_CONSTANTS(match) or _weights(match["weights"], channel_axis)


def quantized_add(match) -> str | None:
    if static_shape(match["a"].ty) != static_shape(match["b"].ty):
        return "the operands are broadcast; an int8 add takes two tensors of one shape"
    return _per_tensor(match["a"], "first operand") or _per_tensor(match["b"], "second operand") or _result(match)


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
    # int8_elementwise.quantized_with_constant): the constant must repeat along the leading axes only.
    if op_name(match["root"]) == "relax.multiply" and math.prod(shape) != 1 and not _along_leading_axes(shape, source):
        return "the constant is broadcast along an inner axis; a product with it on int8 data takes it along the leading axes only"
    return _per_tensor(a, "operand") or _result(match)


_FLOAT_BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide")


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
    # RMSNorm's 1 / rms per row), or, the data seen as rows (see int8_elementwise._requantizing_rows),
    # broadcast along the leading axes (an attention mask over the heads); any other broadcast
    # runs in its reference code.
    if dtype_name(other.ty) != "float32" or \
            (shape != result and not int8_elementwise.one_value_per_row(shape, result) and not _along_leading_axes(shape, result)):
        return "the other operand is not a float32 tensor of the result's shape, one value per row, nor repeated along the leading axes"
    if static_shape(match["a"].ty) != result:
        return "the int8 operand is broadcast"
    if op_name(root) == "relax.divide" and root.args[1].same_as(match["a"]):
        return "x / dequantize(a) divides by the int8 operand"
    return _per_tensor(match["a"], "int8 operand") or _result(match)


def quantized_softmax(match) -> str | None:
    if not onednn_has_avx512_core():  # measured: `ref:any` under ONEDNN_MAX_CPU_ISA=AVX2
        return "oneDNN 3.2 writes a softmax's int8 result in its reference code below AVX-512: a float softmax and a reorder"
    if np.any(constant_array(match["output"].args[2]) != 0):
        return "oneDNN's softmax takes a result scale, not a zero point"
    return _result(match)


def quantized_layer_norm(match) -> str | None:
    return layer_norm_last_axis(match["root"]) or _source_and_result(match)


_GELU_CONSTANTS = expected_constants(GELU_FORMS["gelu"][1], "the erf form of GELU")


def quantized_gelu(match) -> str | None:
    return _GELU_CONSTANTS(match) or _source_and_result(match)


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


def declare(backend: Backend) -> None:
    """The int8 composites and the quantize/dequantize reorders, declared before the float
    patterns so that a quantized chain is matched whole."""
    for name, op in _OPS.items():
        emit = emitters.dynamic_dense if name == "dense" else emitters.dynamic_convolution
        tails = ((False, False),) if name == "dense" else ((True, True), (True, False), (False, True), (False, False))
        for batch_norm, activation in tails:  # (batch normalisation, activation) after the product, longest first
            for bias in (True, False):
                suffix = "_bias" * bias + "_bn" * batch_norm + "_act" * activation
                backend.pattern(f"q{name}_dynamic{suffix}", *qdq.dynamically_quantized(op, bias, batch_norm, activation),
                                check=dynamically_quantized, emit=emit)
    for name in ("conv2d", "conv1d"):
        for residual_first in (False, True):
            for relu in (True, False):
                backend.pattern(f"q{name}_bias_add{'_relu' * relu}{'_swapped' * residual_first}",
                                *qdq.quantized_residual(_OPS[name], residual_first, relu), check=quantized_residual, emit=emitters.convolution)
    for name, op in _OPS.items():
        emit = emitters.matmul if name == "dense" else emitters.convolution
        for bias in (True, False):
            for activation in (True, False):
                for output in (True, False):
                    suffix = "_bias" * bias + "_act" * activation + ("" if output else "_float")
                    backend.pattern(f"q{name}{suffix}", *qdq.quantized_op(op, bias, activation, output), check=quantized_kernel, emit=emit)
    for output in (True, False):
        backend.pattern(f"qmatmul{'' if output else '_float'}", *qdq.quantized_product(output), check=quantized_product, emit=emitters.matmul)
    backend.pattern("qgelu", *qdq.quantized_gelu(), check=quantized_gelu, emit=int8_elementwise.quantized_gelu)
    for op in ELTWISE_OPS:
        backend.pattern(f"qeltwise_{op.removeprefix('relax.').removeprefix('nn.')}", *qdq.quantized_eltwise(op), check=_source_and_result,
                        emit=int8_elementwise.quantized_eltwise)
    backend.pattern("qadd", *qdq.quantized_add(), check=quantized_add, emit=int8_elementwise.quantized_add)
    for name in ("add", "multiply"):
        backend.pattern(f"q{name}_constant", *qdq.quantized_with(f"relax.{name}", "constant"), check=quantized_with_constant,
                        emit=int8_elementwise.quantized_with_constant)
    backend.pattern("qmax_pool2d", *qdq.quantized_max_pool(), check=quantized_max_pool, emit=emitters.pooling)
    backend.pattern("requantize", *qdq.requantized(), check=_source_and_result, emit=emitters.reorder)
    backend.supports("relax.quantize", "relax.dequantize", check=quantize_op, emit=emitters.reorder)


def declare_results(backend: Backend) -> None:
    """Float ops that write their quantized result as int8, declared after the float composites:
    a composite that ends in a product (the erf GELU of a model byoc quantizes itself, its result
    quantized for the next dense layer) keeps it, rather than losing it to a product alone and
    leaving its erf without a kernel."""
    for output in (True, False):
        backend.pattern(f"qlayer_norm{'' if output else '_float'}", *qdq.quantized_layer_norm(output), check=quantized_layer_norm,
                        emit=emitters.layer_norm)
    backend.pattern("softmax_quantized", *qdq.quantized_result("relax.nn.softmax", operands=1), check=quantized_softmax, emit=emitters.softmax)
    for op in _FLOAT_BINARY:  # one operand int8: read as it is, not through a dequantizing reorder
        backend.pattern(f"q{op.removeprefix('relax.')}_float", *qdq.quantized_with(op, "other"), check=quantized_with_float,
                        emit=int8_elementwise.quantized_with_float)
    for op in _FLOAT_BINARY:
        backend.pattern(f"{op.removeprefix('relax.')}_quantized", *qdq.quantized_result(op), check=quantized_result, emit=emitters.binary)
