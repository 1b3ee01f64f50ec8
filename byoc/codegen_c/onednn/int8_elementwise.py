"""Emitters of element-wise kernels on int8 data: a quantized model's residual adds, its sums and
products with a constant or a float operand, and its GELU and other element-wise ops, each one
oneDNN binary primitive that reads int8 and writes int8, its requantization in scales and
post-ops."""

from __future__ import annotations

import math

import numpy as np

from byoc.codegen_c.kernel_call import CBuffer, KernelCall, KernelCode
from byoc.codegen_c.onednn.kernel import BINARY, Kernel, eltwise_args, post_op, quantizing, zero_point_offset
from byoc.codegen_c.onednn.kernel_scales import Scales, dequantized, dequantized_source, scales_of


def _requantizing_binary(call: KernelCall, a: tuple[CBuffer, Scales], b: tuple[CBuffer, Scales] | CBuffer | float,
                         activations: list[dict], result: Scales) -> KernelCode:
    """One binary add on int8 data: `a` (int8, its scale a source scale) plus `b` (int8 with its
    scale, a float constant of the region broadcast over `a`, or a number), then `activations`
    (element-wise post-ops), quantized. Binary primitives take no zero points: those of the operands
    are a constant offset, added by a linear post-op before the activations (folded into the
    requantizing one without them), and the result's scale and zero point are a last linear
    post-op; the conversion to int8 rounds and saturates, as QuantizeLinear does."""
    kernel = Kernel(call)
    source, source_scales = a
    out = call.outputs[0]
    offset = zero_point_offset(source_scales)
    kernel.source("DNNL_ARG_SRC_0", source, "dnnl_query_src_md")
    if isinstance(b, tuple):
        other, other_scales = b
        offset += zero_point_offset(other_scales)
        src1_md = kernel.like_md(source, other.dtype)
        kernel.source("DNNL_ARG_SRC_1", other, "dnnl_query_src_md", index=1)
    elif isinstance(b, CBuffer):  # a float constant, its shape broadcast along the leading axes
        shape = (1,) * (len(source.shape) - len(b.shape)) + b.shape
        src1_md = kernel.md(shape, "plain")
        kernel.direct("DNNL_ARG_SRC_1", kernel.view(b, shape))
    else:  # a number, broadcast: a memory of one element per dimension
        offset += b
        src1_md = kernel.md((1,) * len(source.shape), "plain")
        kernel.direct("DNNL_ARG_SRC_1", kernel.array("zero", np.zeros(1, np.float32), "float32", src1_md))
    steps = [post_op("dnnl_eltwise_linear", 1.0, offset)] if activations else []
    steps += activations
    steps.append(quantizing(result, 0.0 if activations else offset))
    attr = kernel.post_ops(steps, [], len(out.shape))
    kernel.scales(attr, "DNNL_ARG_SRC_0", source_scales, 0, zero_point=False)
    if isinstance(b, tuple):
        kernel.scales(attr, "DNNL_ARG_SRC_1", b[1], 0, zero_point=False)
    dst_md = kernel.like_md(source, out.dtype)
    kernel.result(out)
    create = f"dnnl_binary_primitive_desc_create(&pd, byoc_engine, dnnl_binary_add, {kernel.md_of(source)}, {src1_md}, {dst_md}, {attr})"
    return kernel.code(create, (attr,))


def quantized_add(call: KernelCall) -> KernelCode:
    """quantize([ReLU](dequantize(a) + dequantize(b))) as one binary primitive on the int8 data."""
    add = call.node("relax.add")
    a, b = ((call.arg(node, 0), scales_of(call, node)) for node in (dequantized(call, call.arg(add, i)) for i in (0, 1)))
    relu = [post_op("dnnl_eltwise_relu")] if any(n["op"] == "relax.nn.relu" for n in call.nodes) else []
    return _requantizing_binary(call, a, b, relu, scales_of(call, call.nodes[-1]))


def quantized_with_constant(call: KernelCall) -> KernelCode:
    """quantize(dequantize(a) + c), c a float constant (a bias added after a quantized product,
    as exported models write it; position embeddings), or quantize(dequantize(a) * c), c one
    number (attention's scale; a sum with 0 whose source scale is multiplied by c), as one
    binary primitive on the int8 data."""
    root = next(n for n in call.nodes if n["op"] in ("relax.add", "relax.multiply"))
    index = next(i for i in (0, 1) if dequantized(call, call.arg(root, i)) is not None)
    source, constant = dequantized(call, call.arg(root, index)), call.arg(root, 1 - index)
    a, scales, result = call.arg(source, 0), scales_of(call, source), scales_of(call, call.nodes[-1])
    number = float(np.asarray(call.constants[constant.name]).reshape(-1)[0]) if constant.size == 1 else None
    if root["op"] == "relax.add":
        return _requantizing_binary(call, (a, scales), constant if number is None else number, [], result)
    if number is None:
        return _requantizing_rows(call, (a, scales), constant, [{"op": "binary", "algorithm": "dnnl_binary_mul"}], result)
    return _requantizing_binary(call, (a, Scales(scales.scale * np.float32(number), scales.zero_point, scales.axis)), 0.0, [], result)


def one_value_per_row(shape: tuple[int, ...], full: tuple[int, ...]) -> bool:
    """Whether an operand of `shape` holds one value per index of axis 1 of a tensor of shape
    `full` (a RMSNorm's 1 / rms per row): the broadcast oneDNN 3.2's JIT kernel takes for a
    binary post-op's operand, with the operand whole."""
    return len(shape) == len(full) > 1 and shape[1] == full[1] and math.prod(shape) == full[1]


def _requantizing_rows(call: KernelCall, source: tuple[CBuffer, Scales], operand: CBuffer, steps: list[dict], result: Scales) -> KernelCode:
    """quantize(dequantize(a) op c), c broadcast along a's leading axes (a RMSNorm's weight, a
    rotary embedding's cos and sin, an attention mask over the heads), on a's data seen as rows of
    c's size: dequantized by its scale and an added offset, then `steps`, c (a constant or a
    tensor of the region) their binary post-op, one row for every row. oneDNN 3.2's JIT kernel
    takes a post-op operand along axis 1 of a matrix; the same along the last axes of a 3-D or 4-D
    tensor, or c as the primary operand with the zero point's share a post-op, runs in its
    reference code (36 ms against 5 for a quantized Llama)."""
    a, scales = source
    out = call.outputs[0]
    kernel = Kernel(call)
    shape = (a.size // operand.size, operand.size)
    rows_md, result_md, row_md, one_md = (kernel.md(s, "plain", t) for s, t in
                                          ((shape, a.dtype), (shape, out.dtype), ((1, shape[1]), "float32"), ((1, 1), "float32")))
    kernel.direct("DNNL_ARG_SRC_0", kernel.rows_view(a, rows_md))
    kernel.direct("DNNL_ARG_SRC_1", kernel.array("zero", np.zeros(1, np.float32), "float32", one_md))
    kernel.direct("DNNL_ARG_DST", kernel.result_view(out, result_md))
    row = kernel.view(operand, (1, shape[1])) if operand.kind == "constant" else kernel.rows_view(operand, row_md)
    steps = [post_op("dnnl_eltwise_linear", 1.0, zero_point_offset(scales)),
             *({**step, "operand": (row, row_md)} if step["op"] == "binary" else step for step in steps), quantizing(result)]
    attr = kernel.post_ops(steps, [], 2)
    kernel.scales(attr, "DNNL_ARG_SRC_0", scales, 0, zero_point=False)
    create = f"dnnl_binary_primitive_desc_create(&pd, byoc_engine, dnnl_binary_add, {rows_md}, {one_md}, {result_md}, {attr})"
    return kernel.code(create, (attr,))


def quantized_with_float(call: KernelCall) -> KernelCode:
    """quantize(dequantize(a) op x), x a float tensor of the result's shape, one value per row, or
    broadcast along the leading axes (or x op dequantize(a) for add, subtract and multiply), as one
    binary primitive on the int8 data `a`: dequantized by its scale and an added offset, x
    applied by a binary post-op, quantized."""
    root = next(n for n in call.nodes if n["op"] in BINARY)
    index = next(i for i in (0, 1) if dequantized(call, call.arg(root, i)) is not None)
    source, other = dequantized(call, call.arg(root, index)), call.arg(root, 1 - index)
    operand = {"op": "binary", "operand": (f"{other.name}_mem", Kernel.md_of(other))}
    if root["op"] == "relax.subtract" and index == 1:  # x - dequantize(a): -dequantize(a), then + x
        steps = [post_op("dnnl_eltwise_linear", -1.0), {**operand, "algorithm": "dnnl_binary_add"}]
    else:
        steps = [{**operand, "algorithm": BINARY[root["op"]]}]
    a, scales, result = call.arg(source, 0), scales_of(call, source), scales_of(call, call.nodes[-1])
    if other.shape != a.shape and not one_value_per_row(other.shape, a.shape):  # repeated along the leading axes (see int8)
        return _requantizing_rows(call, (a, scales), other, steps, result)
    return _requantizing_binary(call, (a, scales), 0.0, steps, result)


def quantized_gelu(call: KernelCall) -> KernelCode:
    """A GELU with its intermediate results quantized (as onnxruntime's tool writes the erf form),
    on the int8 data as one primitive: dequantized by the source scale and an added offset, GELU
    as a post-op, quantized. The intermediate roundings are skipped (the result is nearer the float
    GELU's, within a step of the chain's)."""
    source = dequantized_source(call)
    return _requantizing_binary(call, (call.arg(source, 0), scales_of(call, source)), 0.0, [post_op("dnnl_eltwise_gelu_erf")],
                                scales_of(call, call.nodes[-1]))


def quantized_eltwise(call: KernelCall) -> KernelCode:
    """quantize(f(dequantize(x))), f an element-wise op (a GELU between two quantized dense
    layers), as one primitive on the int8 data, f a post-op."""
    source = dequantized_source(call)
    op = next(n for n in call.nodes if n["op"] not in ("relax.dequantize", "relax.quantize"))
    algorithm, alpha, beta = eltwise_args(call, op)
    return _requantizing_binary(call, (call.arg(source, 0), scales_of(call, source)), 0.0,
                                [{"op": "eltwise", "algorithm": algorithm, "alpha": alpha, "beta": beta}], scales_of(call, call.nodes[-1]))
