"""Emitters of products: convolutions and matrix products (float, int8 with the model's scales, or
quantized per call), on oneDNN, on OpenBLAS where it was measured faster (`product_choice`), or
with run-time dimensions where their sizes change at every call."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from byoc.codegen_c.kernel_call import CBuffer, KernelCall, KernelCode
from byoc.codegen_c.onednn import openblas
from byoc.codegen_c.onednn.emitters.shared import (
    LOOP_BINARY,
    SMALL_ROWS,
    chosen_when_made,
    executed,
    follow_layouts,
    fused_tail,
    in_loops,
    reorder_with_attributes,
    transposed_result,
)
from byoc.codegen_c.onednn.kernel import BINARY, Kernel, eltwise_args, in_sequence, post_op, scalar_of
from byoc.codegen_c.onednn.kernel_scales import KernelQuantization, dequantized, kernel_quantization, scales_of
from byoc.codegen_c.onednn.library import dims_decl
from byoc.codegen_c.onednn.product_choice import MEASURED_MACS, Product, kernel_for
from byoc.codegen_c.onednn.settings import onednn_settings
from byoc.codegen_c.symbolic_shapes import SymbolicDim, names_of


def convolution(call: KernelCall) -> KernelCode:
    """conv1d or conv2d with optional bias, residual add and activation, as one primitive with post-ops."""
    kernel = Kernel(call)
    conv = next(n for n in call.nodes if n["op"] in ("relax.nn.conv2d", "relax.nn.conv1d"))
    attrs = conv["attrs"]
    x, w = call.arg(conv, 0), call.arg(conv, 1)
    quantized = kernel_quantization(call, conv)
    if quantized is not None:  # an int8 convolution: its operands are the int8 tensors behind the dequantizes
        x, w = quantized.source, quantized.weights
    out = call.outputs[0]
    groups = attrs["groups"]
    oc, icg, *window = w.shape
    weight_shape = (groups, oc // groups, icg, *window) if groups > 1 else w.shape
    bias, post, residuals = fused_tail(call, conv)
    followed = x.kind == "intermediate" and follow_layouts(call)
    src_md = kernel.md_of(x) if followed else kernel.md(x.shape, dtype=x.dtype)
    weights_any = kernel.md(weight_shape, dtype=w.dtype)
    weights_plain = kernel.view(w, weight_shape)
    bias_memory = kernel.view(bias, (oc,)) if bias is not None else None
    bias_md = kernel.md((oc,), "plain") if bias is not None else "NULL"
    dst_md = kernel.md(out.shape, dtype=out.dtype)
    # A residual that comes in plain NCHW from outside the region, against the NHWC or blocked
    # result the convolution runs in, sent it to oneDNN's reference code: a ResNet-50 block cut
    # at a residual took 133 ms instead of 2, MobileNetV2 blocks 8-21 ms instead of 0.1-0.3. It
    # is reordered per call into NHWC (where oneDNN chooses) or the layout oneDNN asks for it in
    # (where layouts follow their producer).
    spatial = len(window)  # padding lists the starts of every spatial axis, then the ends
    channels_last = "acb" if spatial == 1 else "acdb"
    attr = kernel.post_ops(post, residuals, len(out.shape), "any" if followed else channels_last)
    if quantized is not None:  # per output channel: the weights' first dimension (groups: the first two)
        kernel.quantization(attr, quantized, 0b11 if groups > 1 else 0b1)
    geometry = _conv_geometry(kernel, attrs, spatial)

    def create(pd: str, src: str, dst: str) -> str:
        return (f"dnnl_convolution_forward_primitive_desc_create(&{pd}, byoc_engine, dnnl_forward_inference, dnnl_convolution_direct, "
                f"{src}, {weights_any}, {bias_md}, {dst}, {geometry}, {attr})")

    # Where the layouts in hand send a convolution to oneDNN's reference or GEMM code, first let
    # oneDNN choose them if it did not (with AVX-512, a followed NCHW input and a residual add in
    # another layout: MobileNetV2 ran 35x slower; ConvNeXt's depthwise convolutions after a
    # transpose to plain NCHW ran im2col), then take plain NCHW, where its GEMM kernels take grouped
    # convolutions with few channels per group (ShuffleNet ran 400x slower in its reference code).
    chosen = (create("retry_pd", kernel.md(x.shape, dtype=x.dtype), kernel.md(out.shape, dtype=out.dtype)),) if followed else ()
    retry = (*chosen, create("retry_pd", kernel.md(x.shape, "plain", x.dtype), kernel.md(out.shape, "plain", out.dtype)))
    kernel.source("DNNL_ARG_SRC", x, "dnnl_query_src_md")
    kernel.weights("DNNL_ARG_WEIGHTS", weights_plain, "dnnl_query_weights_md")
    if bias_memory is not None:
        kernel.direct("DNNL_ARG_BIAS", bias_memory)
    kernel.result(out)
    return kernel.code(create("pd", src_md, dst_md), (attr,), retry=retry)


def _conv_geometry(kernel: Kernel, attrs: dict, spatial: int) -> str:
    """A convolution's strides, dilations and padding as dims arrays; returns them as the
    descriptor's arguments."""
    names = [f"{kernel.k}_{part}" for part in ("strides", "dilates", "pad_l", "pad_r")]
    values = [attrs["strides"], [d - 1 for d in attrs["dilation"]], attrs["padding"][:spatial], attrs["padding"][spatial:]]
    kernel.setup += [dims_decl(name, tuple(value)) for name, value in zip(names, values)]
    return ", ".join(names)


def deconvolution(call: KernelCall) -> KernelCode:
    """conv2d_transpose (YOLOv8-seg's mask upsampling, U-Nets' decoders) with optional bias and
    activation, as oneDNN's deconvolution primitive with post-ops. Its weights are stored IOHW
    (ONNX ConvTranspose's: input channels first), and read as the OIHW oneDNN takes through a
    descriptor with those strides, reordered once at initialisation like any weights."""
    kernel = Kernel(call)
    deconv = next(n for n in call.nodes if n["op"] == "relax.nn.conv2d_transpose")
    attrs = deconv["attrs"]
    x, w, out = call.arg(deconv, 0), call.arg(deconv, 1), call.outputs[0]
    groups = attrs["groups"]
    ic, per_group, *window = w.shape
    area, icg = math.prod(window), ic // groups
    # element (g, o, i, h, w) of oneDNN's (groups, oc / groups, ic / groups, kh, kw) is IOHW's ((g * icg + i) * per_group + o, ...)
    shape, strides = (per_group, ic, *window), [area, per_group * area, window[1], 1]
    if groups > 1:
        shape, strides = (groups, per_group, icg, *window), [icg * per_group * area, *strides]
    weights = kernel.name_of("weights_view")
    kernel.state.append(f"static dnnl_memory_t {weights} = NULL;")
    kernel.setup.append(kernel.check(f"dnnl_memory_create(&{weights}, {kernel.strided_md(shape, strides, w.dtype)}, byoc_engine, "
                                     f"{w.name})", f"view of {w.name}"))
    bias, post, residuals = fused_tail(call, deconv)
    oc = per_group * groups
    attr = kernel.post_ops(post, residuals, len(out.shape), "acdb")
    # oneDNN reads the output padding from the result's size: it is taken off the end padding
    geometry = _conv_geometry(kernel, {**attrs, "padding": [*attrs["padding"][:2], *(p - o for p, o in zip(attrs["padding"][2:],
                                                                                                          attrs["output_padding"]))]}, 2)
    create = (f"dnnl_deconvolution_forward_primitive_desc_create(&pd, byoc_engine, dnnl_forward_inference, dnnl_deconvolution_direct, "
              f"{kernel.md(x.shape, dtype=x.dtype)}, {kernel.md(shape, dtype=w.dtype)}, "
              f"{kernel.md((oc,), 'plain') if bias is not None else 'NULL'}, {kernel.md(out.shape, dtype=out.dtype)}, {geometry}, {attr})")
    kernel.source("DNNL_ARG_SRC", x, "dnnl_query_src_md")
    kernel.weights("DNNL_ARG_WEIGHTS", weights, "dnnl_query_weights_md")
    if bias is not None:
        kernel.direct("DNNL_ARG_BIAS", kernel.view(bias, (oc,)))
    kernel.result(out)
    return kernel.code(create, (attr,))


def dynamic_convolution(call: KernelCall) -> KernelCode:
    """A convolution whose float input is quantized at run time (ONNX ConvInteger on
    DynamicQuantizeLinear's result, as `quantize_dynamic` writes it; see byoc.annotate.qdq): per
    call, the input's range, scale and zero point as the op defines them (read in the layout the input
    comes in), the input quantized to uint8 channels-last (the int8 kernels' layout) by a reorder
    with them, and one int8 convolution with that scale and zero point, the weights' scales, the
    float bias, and a batch norm and activation after it as post-ops."""
    kernel = Kernel(call)
    conv = next(n for n in call.nodes if n["op"] in ("relax.nn.conv2d", "relax.nn.conv1d"))
    attrs = conv["attrs"]
    x = call.arg(call.node("relax.quantize"), 0)
    weights_node = dequantized(call, call.arg(conv, 1))
    w, weight_scales = call.arg(weights_node, 0), scales_of(call, weights_node)
    out = call.outputs[0]
    groups = attrs["groups"]
    oc, icg, *window = w.shape
    weight_shape = (groups, oc // groups, icg, *window) if groups > 1 else w.shape
    bias, post, residuals = fused_tail(call, conv)
    channels_last = "acb" if len(window) == 1 else "acdb"
    q_md = kernel.md(x.shape, channels_last, "uint8")
    count = f"dnnl_memory_desc_get_size({kernel.md_of(x)}) / sizeof(float)"
    quantized = _quantized_at_run_time(kernel, f"{x.name}_mem", kernel.md_of(x), count, q_md)
    attr = kernel.post_ops(post, residuals, len(out.shape), channels_last)
    _run_time_source_scales(kernel, attr)
    kernel.scales(attr, "DNNL_ARG_WEIGHTS", weight_scales, (0b11 if groups > 1 else 0b1) if weight_scales.per_channel else 0)
    geometry = _conv_geometry(kernel, attrs, len(window))
    weights_md, dst_md = kernel.md(weight_shape, dtype=w.dtype), kernel.md(out.shape, dtype=out.dtype)
    bias_md = kernel.md((oc,), "plain") if bias is not None else "NULL"
    kernel.direct("DNNL_ARG_SRC", quantized)
    kernel.weights("DNNL_ARG_WEIGHTS", kernel.view(w, weight_shape), "dnnl_query_weights_md")
    if bias is not None:
        kernel.direct("DNNL_ARG_BIAS", kernel.view(bias, (oc,)))
    kernel.result(out)
    create = (f"dnnl_convolution_forward_primitive_desc_create(&pd, byoc_engine, dnnl_forward_inference, dnnl_convolution_direct, "
              f"{q_md}, {weights_md}, {bias_md}, {dst_md}, {geometry}, {attr})")
    return kernel.code(create, (attr,))


def matmul(call: KernelCall) -> KernelCode:
    """matmul with optional bias and activations; constant weights are reordered once."""
    kernel = Kernel(call)
    node = call.node("relax.matmul")
    (x, x_scale), (w, w_scale) = (_unscaled(call, call.arg(node, i)) for i in (0, 1))
    quantized = kernel_quantization(call, node)
    if quantized is not None:  # an int8 product of the int8 tensors behind the dequantizes
        x, w = quantized.source, quantized.weights or w
    out = call.outputs[0]
    # A bias other than one value per output column (T5's position bias on attention scores)
    # runs in oneDNN 3.2's reference code (1.8 ms against 0.01); oneDNN adds it before the scale.
    bias, post, residuals = fused_tail(call, node, takes_bias=lambda b: x_scale * w_scale == 1.0 and b.size == out.shape[-1])
    if x_scale * w_scale != 1.0:  # (a * c) @ (b * d) = c * d * (a @ b): the first post-op
        post, residuals = [post_op("dnnl_eltwise_linear", x_scale * w_scale), *post], [(b, i + 1) for b, i in residuals]
    product = _dense_product(call, x, w, out, bias, post) if quantized is None else None
    option = onednn_settings(call.settings).dense_kernel
    chosen = kernel_for(product, option) if product is not None else "onednn"  # measured: this (building) machine's choice
    if chosen == "openblas" and option == "openblas":  # named: no choice left to make where the model loads
        return _openblas_product(call, x, w, out, bias, post, residuals)
    blas = _openblas_product(call, x, w, out, bias, post, residuals) if product is not None and option == "measured" \
        and openblas.installed() else None
    # The rows of an input of rank > 2 times 2-D constant weights are one matrix product: oneDNN
    # reads the leading dimensions as a batch otherwise, and ConvNeXt's 1x7x7x1024 by 1024x4096
    # ran as 7 products of 7 rows, reading the 16 MB of weights 7 times (7.4 ms; 2.6 ms as one).
    channels = out.shape[-1]  # bias and post-op operands must be per channel: (1, channels) in the product of rows
    rows = w.kind == "constant" and len(w.shape) == 2 and len(x.shape) > 2 and (bias is None or bias.size == channels) \
        and all(b.size == channels and len(b.shape) <= 2 for b, _ in residuals)
    if rows:
        count = math.prod(x.shape[:-1])
        x_shape, out_shape = (count, x.shape[-1]), (count, out.shape[-1])
    else:
        x_shape, out_shape = x.shape, out.shape
    ones = (1,) * (len(x_shape) - len(w.shape))
    weight_shape = ones + w.shape
    bias_md, bias_memory = "NULL", None
    if bias is not None:
        bias_shape = (1, channels) if rows else (1,) * (len(out_shape) - len(bias.shape)) + bias.shape
        bias_md, bias_memory = kernel.md(bias_shape, "plain"), kernel.view(bias, bias_shape)
    attr = kernel.post_ops(post, residuals, len(out_shape))
    if quantized is not None and w.kind != "constant" and w.dtype == "uint8":  # read as int8 w - 128 (see _as_int8)
        weight_scales = quantized.weight_scales
        quantized = dataclasses.replace(quantized, weight_scales=dataclasses.replace(weight_scales, zero_point=weight_scales.zero_point - 128))
    if quantized is not None:  # per output column: the weights' last dimension
        kernel.quantization(attr, quantized, 1 << (len(weight_shape) - 1))
    weights_md = kernel.md(weight_shape, dtype=w.dtype)
    if rows:
        src_md, dst_md = kernel.md(x_shape, "plain", x.dtype), kernel.md(out_shape, "plain", out.dtype)
        kernel.direct("DNNL_ARG_SRC", kernel.rows_view(x, src_md))
    else:
        src_md, dst_md = kernel.md(x_shape, dtype=x.dtype), kernel.md(out_shape, dtype=out.dtype)
        kernel.source("DNNL_ARG_SRC", x, "dnnl_query_src_md")
    if w.kind == "constant":
        kernel.weights("DNNL_ARG_WEIGHTS", kernel.view(w, weight_shape), "dnnl_query_weights_md")
    elif quantized is not None and w.dtype == "uint8":
        weights_md = kernel.like_md(w, "int8")
        kernel.direct("DNNL_ARG_WEIGHTS", _as_int8(kernel, w, weights_md))
    else:
        kernel.source("DNNL_ARG_WEIGHTS", w, "dnnl_query_weights_md")
    if bias_memory is not None:
        kernel.direct("DNNL_ARG_BIAS", bias_memory)
    given = None
    if rows:
        kernel.direct("DNNL_ARG_DST", kernel.result_view(out, dst_md))
    else:
        kernel.result(out)
        if quantized is None:  # activations read as their producers left them, the result as its reader wants it
            layouts = (src_md if x.kind == "constant" else kernel.md_of(x), weights_md if w.kind == "constant" else kernel.md_of(w),
                       transposed_result(kernel, call) or dst_md)
            given = f"dnnl_matmul_primitive_desc_create(&pd, byoc_engine, {', '.join(layouts[:2])}, {bias_md}, {layouts[2]}, {attr})"
    create = f"dnnl_matmul_primitive_desc_create(&pd, byoc_engine, {src_md}, {weights_md}, {bias_md}, {dst_md}, {attr})"
    code = kernel.code(create, (attr,), first=given)
    if blas is not None:
        # Both kernels are in the C; which one runs is asked of byoc where the region loads (the
        # loading machine's measured choice, see `product_choice`), else the building machine's.
        built = int(chosen == "openblas")
        return chosen_when_made(f"{call.name}_by_openblas", blas, code, f'byoc_dense_by_openblas("{product.key}", {built})',
                                reads_settled=False)
    split = _sized_post_ops(call, post, residuals) if _sized_product(call, x, w, out, quantized, bias, rows) else None
    return code if split is None else _sized_or_not(call, x, w, out, split, code)


def _dense_product(call: KernelCall, x: CBuffer, w: CBuffer, out: CBuffer, bias: CBuffer | None, post: list[dict]) -> Product | None:
    """The product OpenBLAS may run (`product_choice`): float32 activations of fixed shape times
    constant 2-D weights, a bias per output column or none, and (unless a kernel is named) at
    least MEASURED_MACS multiply-adds; None for any other."""
    if not (w.kind == "constant" and len(w.shape) == 2 and x.kind != "constant" and len(x.shape) >= 2
            and {x.dtype, w.dtype, out.dtype} == {"float32"} and not names_of(x.shape) | names_of(out.shape)
            and (bias is None or bias.size == out.shape[-1]) and not any("operand" in node for node in post)):
        return None
    product = Product(math.prod(x.shape[:-1]), x.shape[-1], w.shape[1], bias is not None, bool(post))
    if product.m * product.k * product.n < MEASURED_MACS and onednn_settings(call.settings).dense_kernel == "measured":
        return None
    return product


def _openblas_product(call: KernelCall, x: CBuffer, w: CBuffer, out: CBuffer, bias: CBuffer | None, post: list[dict],
                      residuals: list[tuple[CBuffer, int]]) -> KernelCode:
    """The product by OpenBLAS's sgemm on the rows of `x` in plain layout, into the result in
    plain layout; then the bias (a binary add) and the post-ops by one oneDNN primitive in place,
    or none where there are neither."""
    kernel = Kernel(call, "blas")
    m, k, n = math.prod(x.shape[:-1]), x.shape[-1], w.shape[1]
    source = kernel.plain_source(x)
    out_md = kernel.md(out.shape, "plain", out.dtype)
    kernel.result(out, md=out_md)
    result = kernel.exec_args[-1][1]
    kernel.before += [
        "{",
        "  void* a = NULL;",
        "  void* c = NULL;",
        "  " + kernel.check(f"dnnl_memory_get_data_handle({source}, &a)", "data of the source"),
        "  " + kernel.check(f"dnnl_memory_get_data_handle({result}, &c)", "data of the result"),
        f"  scipy_cblas_sgemm({openblas.ROW_MAJOR}, {openblas.NO_TRANSPOSE}, {openblas.NO_TRANSPOSE}, {m}, {n}, {k}, 1.f, "
        f"(const float*)a, {k}, (const float*){w.name}, {n}, 0.f, (float*)c, {n});",
        "}",
    ]
    if bias is None and not post:
        kernel.setup += kernel.bind  # the result's memory, made without a primitive
        kernel.exec_args.clear()
        return kernel.code_without_primitive()
    # The first of the bias and post-ops is the primitive, the others its post-ops: oneDNN 3.2 runs
    # an element-wise primitive with binary post-ops in its reference code (a scale by a constant
    # after an identity took 10x a binary primitive's time).
    rank = len(out.shape)
    first, second = ("DNNL_ARG_SRC_0", "DNNL_ARG_SRC_1") if bias is not None or any(i == 0 for _, i in residuals) else ("DNNL_ARG_SRC", None)
    kernel.exec_args[0] = (first, result)
    if bias is not None:
        algorithm, operand, md = "dnnl_binary_add", kernel.view(bias, (1,) * (rank - 1) + (n,)), kernel.md((1,) * (rank - 1) + (n,), "plain")
    else:
        head, post = post[0], post[1:]
        residuals, operands = [(b, i - 1) for b, i in residuals if i > 0], [b for b, i in residuals if i == 0]
        if operands:
            algorithm = head.get("algorithm") or BINARY[head["op"]]
            shape = (1,) * (rank - len(operands[0].shape)) + operands[0].shape
            operand, md = (kernel.view(operands[0], shape), kernel.md(shape, "plain")) if len(operands[0].shape) < rank else \
                (f"{operands[0].name}_mem", kernel.md_of(operands[0]))
    attr = kernel.post_ops(post, residuals, rank)
    if second is None:
        algorithm, alpha, beta = eltwise_args(call, head)
        create = (f"dnnl_eltwise_forward_primitive_desc_create(&pd, byoc_engine, dnnl_forward_inference, {algorithm}, "
                  f"{out_md}, {out_md}, {alpha}, {beta}, {attr})")
    else:
        kernel.direct(second, operand)
        create = f"dnnl_binary_primitive_desc_create(&pd, byoc_engine, {algorithm}, {out_md}, {md}, {out_md}, {attr})"
    kernel.direct("DNNL_ARG_DST", result)
    return kernel.code(create, (attr,))


# A product of two activations whose sizes follow the model's dimensions (attention's scores
# over a key/value cache one position longer at every step of a generation) is made again for
# each new size: oneDNN's JIT kernel takes 60-160 us to make, several times a small product's
# run. Below this many multiply-adds, the product runs oneDNN's GEMM with run-time dimensions
# instead: one primitive for every size, 2-5 us to make again (its cache hits), at most 1.5x
# slower a call at these sizes; above it, the JIT kernel's speed pays for making it (a 12-head
# 128x64x128 product: 55 us against 97).
SIZED_PRODUCT_MACS = 1 << 20


def _sized_product(call: KernelCall, x: CBuffer, w: CBuffer, out: CBuffer, quantized: KernelQuantization | None, bias: CBuffer | None,
                   rows: bool) -> bool:
    """Whether a product may take run-time dimensions: float32 activations times activations,
    no bias, with a symbolic dimension."""
    return quantized is None and bias is None and not rows and w.kind != "constant" and x.kind != "constant" \
        and {x.dtype, w.dtype, out.dtype} == {"float32"} and bool(names_of(out.shape) | names_of(x.shape))


def _scalar_linear(call: KernelCall, node: dict, operand: CBuffer) -> dict | None:
    """A binary post-op with a constant scalar as the element-wise linear one it is; None for
    any other."""
    if operand.kind != "constant" or operand.size != 1:
        return None
    value = float(np.asarray(call.constants[operand.name]).reshape(-1)[0])
    first = call.arg(node, 0).name == operand.name
    if node["op"] == "relax.multiply":
        return post_op("dnnl_eltwise_linear", value)
    if node["op"] == "relax.add":
        return post_op("dnnl_eltwise_linear", 1.0, value)
    if node["op"] == "relax.subtract":
        return post_op("dnnl_eltwise_linear", -1.0, value) if first else post_op("dnnl_eltwise_linear", 1.0, -value)
    if node["op"] == "relax.divide" and not first and value != 0.0:
        return post_op("dnnl_eltwise_linear", 1.0 / value)
    return None


_SizedPostOps = tuple[list[dict], tuple[dict, CBuffer] | None, list[dict]]  # on the product, the binary op, on the binary op


def _sized_post_ops(call: KernelCall, post: list[dict], residuals: list[tuple[CBuffer, int]]) -> _SizedPostOps | None:
    """The post-ops of a product with run-time dimensions, which take no tensor operand: the
    element-wise ones (a constant scalar's binary op as a linear one) on the product, then at
    most one binary op with a tensor of the result's rank (attention's mask), run in place by a
    binary primitive with the element-wise ops after it as its post-ops. None where they do not
    split so."""
    operands = {index: buffer for buffer, index in residuals}
    head: list[dict] = []
    binary: tuple[dict, CBuffer] | None = None
    tail: list[dict] = []
    rank = len(call.outputs[0].shape)
    for index, node in enumerate(post):
        if "operand" in node:  # an operand an emitter made (a quantized residual's)
            return None
        if index in operands:
            linear = _scalar_linear(call, node, operands[index])
            if linear is None:
                if binary is not None or len(operands[index].shape) != rank:
                    return None
                binary = node, operands[index]
                continue
            node = linear
        (tail if binary is not None else head).append(node)
    return head, binary, tail


def _sized_or_not(call: KernelCall, x: CBuffer, w: CBuffer, out: CBuffer, split: _SizedPostOps, jit: KernelCode) -> KernelCode:
    """The product with run-time dimensions where it is small (SIZED_PRODUCT_MACS) and its
    operands are in layouts oneDNN's GEMM reads, else `jit` (a primitive for these sizes): which
    is chosen each time the kernel is made, for the dimensions then."""
    head, binary, tail = split
    kernel = Kernel(call, "sized")
    runtime = [sum(1 << i for i, d in enumerate(b.shape) if isinstance(d, SymbolicDim)) for b in (x, w, out)]
    produced = transposed_result(kernel, call) or kernel.md(out.shape, "plain", out.dtype)
    mds = []
    for what, md, axes in zip(("source", "weights", "result"), (kernel.md_of(x), kernel.md_of(w), produced), runtime):
        name = kernel.local_md()
        kernel.setup += [kernel.check(f"byoc_runtime_md(&{name}, {md}, {axes})", f"{what} of any size")]
        mds.append(name)
    attr = kernel.post_ops(head, [], len(out.shape))
    kernel.direct("DNNL_ARG_SRC", f"{x.name}_mem")
    kernel.direct("DNNL_ARG_WEIGHTS", f"{w.name}_mem")
    kernel.result(out, md=produced)
    codes = [kernel.code(f"dnnl_matmul_primitive_desc_create(&pd, byoc_engine, {mds[0]}, {mds[1]}, NULL, {mds[2]}, {attr})", (attr,))]
    if binary is not None:  # in place on the result (post-ops compute `result op operand`)
        node, operand = binary
        masked = Kernel(call, "masked")
        result = kernel.exec_args[-1][1]  # the memory the product writes
        attr = masked.post_ops(tail, [], len(out.shape))
        masked.direct("DNNL_ARG_SRC_0", result)
        masked.direct("DNNL_ARG_SRC_1", f"{operand.name}_mem")
        masked.direct("DNNL_ARG_DST", result)
        create = (f"dnnl_binary_primitive_desc_create(&pd, byoc_engine, {node.get('algorithm') or BINARY[node['op']]}, "
                  f"byoc_md({result}), {masked.md_of(operand)}, byoc_md({result}), {attr})")
        codes.append(masked.code(create, (attr,)))
        if not tail and node["op"] in LOOP_BINARY and not node.get("algorithm"):
            codes[-1] = chosen_when_made(f"{call.name}_mask_in_loops", in_loops(masked, result, operand, node["op"]), codes[-1],
                                f"byoc_small_rows(byoc_md({result}), {SMALL_ROWS}) > 0 && "
                                f"byoc_broadcast_rows({result}, {operand.name}_mem, {LOOP_BINARY[node['op']]}, 0)")
    macs = math.prod(out.shape) * x.shape[-1]
    return chosen_when_made(f"{call.name}_any_size", in_sequence(codes), jit,
                   f"!byoc_settled && {macs} <= {SIZED_PRODUCT_MACS} && byoc_gemm_axis({kernel.md_of(x)}) >= 0 && "
                   f"byoc_gemm_axis({kernel.md_of(w)}) >= 0")


def _unscaled(call: KernelCall, operand: CBuffer) -> tuple[CBuffer, float]:
    """A product's operand before its product with a constant inside the kernel (torch's
    attention scales q and k each), and that constant; else the operand itself and 1."""
    for node, outputs in zip(call.nodes, call.node_outputs):
        if operand in outputs and node["op"] == "relax.multiply":
            index = next(i for i in (0, 1) if call.arg(node, i).kind != "constant")
            return call.arg(node, index), scalar_of(call, node, 1 - index)
    return operand, 1.0


def _as_int8(kernel: Kernel, w: CBuffer, md: str) -> str:
    """Per call, uint8 data `w` as int8 `w - 128` (exact), in a memory of `md` that is returned:
    oneDNN 3.2's int8 matrix products take int8 weights only, and the second operand of a product
    of two quantized activations (attention's keys and values) is uint8."""
    name = kernel.name_of("int8")
    kernel.state += [f"static dnnl_memory_t {name} = NULL, {name}_shift = NULL;", f"static dnnl_primitive_t {name}_reorder = NULL;",
                     f"static int32_t {name}_zero = 128;"]
    kernel.setup += [
        kernel.check(f"dnnl_memory_create(&{name}, {md}, byoc_engine, DNNL_MEMORY_ALLOCATE)", "int8 operand"),
        kernel.check(f"dnnl_memory_create(&{name}_shift, {kernel.md((1,), 'plain', 'int32')}, byoc_engine, &{name}_zero)", "operand shift"),
        *reorder_with_attributes(kernel, f"{name}_reorder", kernel.md_of(w), md, [("zero_points", "DNNL_ARG_SRC")], "int8 operand"),
    ]
    kernel.before += executed(kernel, f"{name}_reorder", [("DNNL_ARG_FROM", f"{w.name}_mem"), ("DNNL_ARG_TO", name),
                                                          ("DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC", f"{name}_shift")], "int8 operand")
    return name


def _quantized_at_run_time(kernel: Kernel, source: str, source_md: str, count: int | str, q_md: str) -> str:
    """Per call, the float memory `source` (`count` values in memory, a C expression or a number)
    quantized to uint8 as ONNX's DynamicQuantizeLinear defines it, into a memory of `q_md` that is
    returned; its scale and zero point are `<kernel>_scale_mem` and `<kernel>_zero_mem` (see
    `_run_time_source_scales`). The range is read in whatever layout `source` has: a blocked
    layout's padding holds zeros, and the range includes 0 anyway."""
    k = kernel.k
    kernel.state += [f"static float {k}_scale = 1.f;", f"static int32_t {k}_zero = 0;",
                     f"static dnnl_memory_t {k}_scale_mem = NULL, {k}_zero_mem = NULL, {k}_q = NULL;",
                     f"static dnnl_primitive_t {k}_quantize = NULL;"]
    scale_md, zero_md = kernel.md((1,), "plain", "float32"), kernel.md((1,), "plain", "int32")
    kernel.setup += [
        kernel.check(f"dnnl_memory_create(&{k}_scale_mem, {scale_md}, byoc_engine, &{k}_scale)", "run-time scale"),
        kernel.check(f"dnnl_memory_create(&{k}_zero_mem, {zero_md}, byoc_engine, &{k}_zero)", "run-time zero point"),
        kernel.check(f"dnnl_memory_create(&{k}_q, {q_md}, byoc_engine, DNNL_MEMORY_ALLOCATE)", "quantized input"),
        *reorder_with_attributes(kernel, f"{k}_quantize", source_md, q_md, [("scales", "DNNL_ARG_DST"), ("zero_points", "DNNL_ARG_DST")],
                                  "input quantization"),
    ]
    # DynamicQuantizeLinear: scale = (max(x, 0) - min(x, 0)) / 255, zero point = the level of 0,
    # rounded half to even; an all-zero input quantizes to its zero point 0 at any scale.
    kernel.before += [
        "{",
        "  void* data = NULL;",
        "  float low, high;",
        "  " + kernel.check(f"dnnl_memory_get_data_handle({source}, &data)", "input"),
        f"  byoc_range((const float*)data, (long)({count}), &low, &high);",
        f"  {k}_scale = (high - low) / 255.f;",
        f"  {k}_zero = {k}_scale > 0.f ? (int32_t)nearbyintf(fminf(fmaxf(0.f - low / {k}_scale, 0.f), 255.f)) : 0;",
        f"  if (!({k}_scale > 0.f)) {k}_scale = 1.f;",
        "}",
        *executed(kernel, f"{k}_quantize", _run_time_scales(k, source, f"{k}_q", "DNNL_ARG_DST"), "input quantization"),
    ]
    return f"{k}_q"


def _run_time_scales(k: str, source: str, target: str, side: str) -> list[tuple[str, str]]:
    """The arguments of a reorder from `source` to `target` with kernel `k`'s run-time scale and
    zero point (`_quantized_at_run_time`) on `side` (DNNL_ARG_SRC or DNNL_ARG_DST)."""
    return [("DNNL_ARG_FROM", source), ("DNNL_ARG_TO", target), (f"DNNL_ARG_ATTR_SCALES | {side}", f"{k}_scale_mem"),
            (f"DNNL_ARG_ATTR_ZERO_POINTS | {side}", f"{k}_zero_mem")]


def _dequantized_at_run_time(kernel: Kernel, quantized: str, q_md: str, float_md: str) -> str:
    """Per call, after `_quantized_at_run_time`, its uint8 result read back as float32 with the same
    scale and zero point, into a memory of `float_md` that is returned: the source of a float
    product where the int8 one would saturate (byoc.processing.saturation)."""
    k = kernel.k
    kernel.state += [f"static dnnl_memory_t {k}_dq = NULL;", f"static dnnl_primitive_t {k}_dequantize = NULL;"]
    kernel.setup += [
        kernel.check(f"dnnl_memory_create(&{k}_dq, {float_md}, byoc_engine, DNNL_MEMORY_ALLOCATE)", "dequantized input"),
        *reorder_with_attributes(kernel, f"{k}_dequantize", q_md, float_md, [("scales", "DNNL_ARG_SRC"), ("zero_points", "DNNL_ARG_SRC")],
                                  "input dequantization"),
    ]
    kernel.before += executed(kernel, f"{k}_dequantize", _run_time_scales(k, quantized, f"{k}_dq", "DNNL_ARG_SRC"), "input dequantization")
    return f"{k}_dq"


def _run_time_source_scales(kernel: Kernel, attr: str) -> None:
    """The product's source scale and zero point, set per call (`_quantized_at_run_time`)."""
    k = kernel.k
    kernel.setup += [kernel.check(f"dnnl_primitive_attr_set_scales_mask({attr}, DNNL_ARG_SRC, 0)", "scales"),
                     kernel.check(f"dnnl_primitive_attr_set_zero_points_mask({attr}, DNNL_ARG_SRC, 0)", "zero points")]
    kernel.exec_args += [("DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC", f"{k}_scale_mem"), ("DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC", f"{k}_zero_mem")]


def dynamic_dense(call: KernelCall) -> KernelCode:
    """A dense layer whose float input is quantized at run time (ONNX DynamicQuantizeLinear, as
    `quantize_dynamic` writes it; see byoc.annotate.qdq): per call, the input's range, scale and zero
    point as the op defines them, the input quantized to uint8 by a reorder with them, and the
    product one int8 primitive with that scale and zero point, the weights' scales and the
    float bias: what onnxruntime's DynamicQuantizeMatMul computes. Where that product would
    saturate (byoc.processing.saturation folded its weights to float32), the quantized input is
    read back as float32 and the product is a float one, exactly."""
    kernel = Kernel(call)
    node = call.node("relax.matmul")
    x = call.arg(call.node("relax.quantize"), 0)
    weights_node = dequantized(call, call.arg(node, 1))
    w = call.arg(weights_node, 0) if weights_node is not None else call.arg(node, 1)
    out = call.outputs[0]
    bias, post, residuals = fused_tail(call, node)
    count = math.prod(x.shape[:-1])
    x_shape, out_shape = (count, x.shape[-1]), (count, out.shape[-1])
    x_md, q_md = kernel.md(x_shape, "plain", "float32"), kernel.md(x_shape, "plain", "uint8")
    quantized = _quantized_at_run_time(kernel, kernel.rows_view(x, x_md), x_md, count * x.shape[-1], q_md)
    attr = kernel.post_ops(post, residuals, len(out_shape))
    if weights_node is None:
        quantized, q_md = _dequantized_at_run_time(kernel, quantized, q_md, x_md), x_md
    else:
        _run_time_source_scales(kernel, attr)
        weight_scales = scales_of(call, weights_node)
        kernel.scales(attr, "DNNL_ARG_WEIGHTS", weight_scales, 1 << 1 if weight_scales.per_channel else 0)
    weights_md = kernel.md(w.shape, dtype=w.dtype)
    bias_md = "NULL"
    kernel.direct("DNNL_ARG_SRC", quantized)
    kernel.weights("DNNL_ARG_WEIGHTS", kernel.view(w, w.shape), "dnnl_query_weights_md")
    if bias is not None:
        bias_md = kernel.md((1, out_shape[-1]), "plain")
        kernel.direct("DNNL_ARG_BIAS", kernel.view(bias, (1, out_shape[-1])))
    dst_md = kernel.md(out_shape, "plain", out.dtype)
    kernel.direct("DNNL_ARG_DST", kernel.result_view(out, dst_md))
    create = f"dnnl_matmul_primitive_desc_create(&pd, byoc_engine, {q_md}, {weights_md}, {bias_md}, {dst_md}, {attr})"
    return kernel.code(create, (attr,))
