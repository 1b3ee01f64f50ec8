"""C emitters for oneDNN primitives: one per kernel kind, each a call sequence of the oneDNN C
API (v3). Primitives, and weights reordered into the layout the primitive chose, are created once
at initialisation; a call only sets data handles and executes."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from byoc.codegen_c.kernel_call import CBuffer, KernelCall, KernelCode
from byoc.codegen_c.onednn import openblas
from byoc.codegen_c.onednn.kernel import (
    BINARY,
    Kernel,
    c_float,
    c_text,
    eltwise_args,
    in_sequence,
    post_op,
    quantizing,
    scalar_of,
    zero_point_offset,
)
from byoc.codegen_c.onednn.kernel_scales import (
    KernelQuantization,
    Scales,
    dequantized,
    dequantized_source,
    kernel_quantization,
    result_quantize,
    scales_of,
)
from byoc.codegen_c.onednn.library import dims_decl
from byoc.codegen_c.onednn.product_choice import MEASURED_MACS, Product, kernel_for
from byoc.codegen_c.symbolic_shapes import SymbolicDim, names_of, read_shape

# GELU composites (the forms exporters write, `byoc.annotate.idioms`), each fused as one
# element-wise op or post-op: pattern name -> oneDNN algorithm.
GELU_FORMS = {"gelu": "dnnl_eltwise_gelu_erf", "gelu_erf_half_last": "dnnl_eltwise_gelu_erf", "gelu_tanh": "dnnl_eltwise_gelu_tanh"}
# Reshapes: views of their input's data where it is plain (`reshape`); transposes too, where
# their readers take any layout (`permute_dims`).
RESHAPES = ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten")
VIEWS = (*RESHAPES, "relax.permute_dims")


def _outside_operand(call: KernelCall, node: dict) -> CBuffer:
    """The operand of a binary node in a fused kernel that comes from outside the kernel."""
    return next(call.arg(node, i) for i in (1, 0) if call.arg(node, i) in call.inputs)


def _quantized_residual(call: KernelCall, node: dict) -> tuple[CBuffer, Scales] | None:
    """The int8 operand from outside the kernel, and its quantization, of a quantized residual
    add (dequantize(quantize(conv)) + dequantize(b)) inside a kernel; None for any other node."""
    if node["op"] != "relax.add":
        return None
    for index in (0, 1):
        source = dequantized(call, call.arg(node, index))
        if source is not None and call.arg(source, 0) in call.inputs:
            return call.arg(source, 0), scales_of(call, source)
    return None


def _fused_tail(call: KernelCall, root: dict, takes_bias=lambda bias: True) -> tuple[CBuffer | None, list[dict], list[tuple[CBuffer, int]]]:
    """The bias (the first constant added, where the primitive `takes_bias` it), the post-op
    nodes, and the operands of binary post-ops (by post-op index) of the nodes after the root
    of a fused kernel."""
    bias = None
    post: list[dict] = []
    operands: list[tuple[CBuffer, int]] = []
    for node in call.nodes[call.nodes.index(root) + 1 :]:
        if node["op"] in ("relax.quantize", "relax.dequantize"):  # quantization, not a post-op (see `quantization`)
            continue
        residual = _quantized_residual(call, node)
        if residual is not None:
            # + (b - zb) * sb on the float result, b int8: a binary post-op adds b as it is,
            # so the result is scaled by 1 / sb around it.
            b, scales = residual
            scale = float(scales.scale[0])
            post.append(post_op("dnnl_eltwise_linear", 1.0 / scale))
            operands.append((b, len(post)))
            post.append(node)
            post.append(post_op("dnnl_eltwise_linear", scale, zero_point_offset(scales)))
            continue
        form = call.pattern.removeprefix("dense_bias_") if call.pattern else None
        if form in GELU_FORMS and bias is not None:
            post.append({"op": form, "algorithm": GELU_FORMS[form]})  # the rest of the composite is the GELU
            break
        if node["op"] in BINARY:
            operand = _outside_operand(call, node)
            if node["op"] == "relax.add" and bias is None and not post and operand.kind == "constant" and takes_bias(operand):
                bias = operand
                continue
            operands.append((operand, len(post)))
        post.append(node)
    return bias, post, operands


LAYOUT_POLICIES = ("auto", "follow", "choose")


def _follow_layouts(call: KernelCall) -> bool:
    """Whether a convolution takes its input in the layout its producer chose ("follow"), or
    lets oneDNN choose the layout it runs fastest in, at the cost of a reorder where the two
    differ ("choose").

    Measured on a 2-core AVX2 machine: with "choose", deep 3x3 convolutions pick brgconv on
    NHWC (ResNet-18: 19.3 ms of convolutions plus 0.36 ms of reorders, against 21.9 ms with
    "follow"); depthwise-separable networks run best in the blocked layout of the first
    convolution (MobileNetV2: 4.1 ms against 4.8 ms). "auto" follows in regions that hold a
    grouped convolution and chooses elsewhere.
    """
    policy = call.options.get("layout", "auto")
    if policy not in LAYOUT_POLICIES:
        raise ValueError(f"dnnl option layout={policy!r}; expected one of {LAYOUT_POLICIES}")
    if policy != "auto":
        return policy == "follow"
    return any(n["op"] == "relax.nn.conv2d" and n["attrs"]["groups"] > 1 for n in call.graph.get("nodes", ()))


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
    bias, post, residuals = _fused_tail(call, conv)
    followed = x.kind == "intermediate" and _follow_layouts(call)
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
    bias, post, residuals = _fused_tail(call, conv)
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
    bias, post, residuals = _fused_tail(call, node, takes_bias=lambda b: x_scale * w_scale == 1.0 and b.size == out.shape[-1])
    if x_scale * w_scale != 1.0:  # (a * c) @ (b * d) = c * d * (a @ b): the first post-op
        post, residuals = [post_op("dnnl_eltwise_linear", x_scale * w_scale), *post], [(b, i + 1) for b, i in residuals]
    if quantized is None and _dense_by_openblas(call, x, w, out, bias, post):
        return _openblas_product(call, x, w, out, bias, post, residuals)
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
                       _transposed_result(kernel, call) or dst_md)
            given = f"dnnl_matmul_primitive_desc_create(&pd, byoc_engine, {', '.join(layouts[:2])}, {bias_md}, {layouts[2]}, {attr})"
    create = f"dnnl_matmul_primitive_desc_create(&pd, byoc_engine, {src_md}, {weights_md}, {bias_md}, {dst_md}, {attr})"
    code = kernel.code(create, (attr,), first=given)
    split = _sized_post_ops(call, post, residuals) if _sized_product(call, x, w, out, quantized, bias, rows) else None
    return code if split is None else _sized_or_not(call, x, w, out, split, code)


def _dense_by_openblas(call: KernelCall, x: CBuffer, w: CBuffer, out: CBuffer, bias: CBuffer | None, post: list[dict]) -> bool:
    """Whether OpenBLAS runs this product (`product_choice`): float32 activations of fixed shape
    times constant 2-D weights, a bias per output column or none, and OpenBLAS the faster here."""
    if not (w.kind == "constant" and len(w.shape) == 2 and x.kind != "constant" and len(x.shape) >= 2
            and {x.dtype, w.dtype, out.dtype} == {"float32"} and not names_of(x.shape) | names_of(out.shape)
            and (bias is None or bias.size == out.shape[-1]) and not any("operand" in node for node in post)):
        return False
    product = Product(math.prod(x.shape[:-1]), x.shape[-1], w.shape[1], bias is not None, bool(post))
    if product.m * product.k * product.n < MEASURED_MACS and call.options.get("dense_kernel", "measured") == "measured":
        return False
    return kernel_for(product, call.options.get("dense_kernel", "measured")) == "openblas"


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
    kernel.state.append(f"#ifdef __cplusplus\nextern \"C\"\n#endif\n{openblas.SGEMM_DECLARATION}")
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
    produced = _transposed_result(kernel, call) or kernel.md(out.shape, "plain", out.dtype)
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
            codes[-1] = _chosen(f"{call.name}_mask_in_loops", _in_loops(masked, result, operand, node["op"]), codes[-1],
                                f"byoc_small_rows(byoc_md({result}), {SMALL_ROWS}) > 0 && "
                                f"byoc_broadcast_rows({result}, {operand.name}_mem, {LOOP_BINARY[node['op']]}, 0)")
    macs = math.prod(out.shape) * x.shape[-1]
    return _chosen(f"{call.name}_any_size", in_sequence(codes), jit,
                   f"!byoc_settled && {macs} <= {SIZED_PRODUCT_MACS} && byoc_gemm_axis({kernel.md_of(x)}) >= 0 && "
                   f"byoc_gemm_axis({kernel.md_of(w)}) >= 0")


# Attention's scores over a decoder's cache have a new size at every step, and oneDNN's binary
# (the mask) and softmax primitives are made for one size: 30-37 us each to make (GPT-2 tiny's
# first layer, every new length), where its whole step runs in 100. Up to this many values, in a
# dense row-major layout and before the sizes settle (`byoc_settled`), the mask's sum and the
# softmax run as loops of byoc's own (`byoc_broadcast_rows`, `byoc_softmax_rows`): at most about
# 15 us at this size, nothing to make.
SMALL_ROWS = 4096
LOOP_BINARY = {"relax.add": 0, "relax.subtract": 1, "relax.multiply": 2, "relax.divide": 3}


def _chosen(flag: str, first: KernelCode, otherwise: KernelCode, condition: str) -> KernelCode:
    """`first` where the C `condition` holds when the kernel is made (for the dimensions then),
    else `otherwise`; which one is kept in `flag`. It reads `byoc_settled`, or may."""
    return KernelCode(state="\n".join([otherwise.state, first.state, f"static int {flag} = 0;"]),
                      init="\n".join([f"{flag} = {condition};", f"if ({flag}) {{", first.init, "} else {", otherwise.init, "}"]),
                      run="\n".join([f"if ({flag}) {{", first.run, "} else {", otherwise.run, "}"]), reads_settled=True)


def _in_loops(kernel: Kernel, result: str, operand: CBuffer, op: str) -> KernelCode:
    """`result op= operand` in place by `byoc_broadcast_rows`, no primitive made."""
    loops = Kernel(kernel.call, "loops")
    loops.state = []
    loops.before.append(f"byoc_broadcast_rows({result}, {operand.name}_mem, {LOOP_BINARY[op]}, 1);")
    return loops.code_without_primitive()


def _unscaled(call: KernelCall, operand: CBuffer) -> tuple[CBuffer, float]:
    """A product's operand before its product with a constant inside the kernel (torch's
    attention scales q and k each), and that constant; else the operand itself and 1."""
    for node, outputs in zip(call.nodes, call.node_outputs):
        if operand in outputs and node["op"] == "relax.multiply":
            index = next(i for i in (0, 1) if call.arg(node, i).kind != "constant")
            return call.arg(node, index), scalar_of(call, node, 1 - index)
    return operand, 1.0


def _reorder_with_attributes(kernel: Kernel, primitive: str, source_md: str, target_md: str, given: list[tuple[str, str]], what: str,
                             mask: int = 0) -> list[str]:
    """Initialisation of reorder `primitive` from `source_md` to `target_md` whose scales or zero
    points (`given`: ("scales", "DNNL_ARG_DST"), ...; one value each, or one per index of the
    dimensions in `mask`) are given per call."""
    lines = ["dnnl_primitive_attr_t attr;", "dnnl_primitive_desc_t reorder = NULL;", kernel.check("dnnl_primitive_attr_create(&attr)", "attribute")]
    lines += [kernel.check(f"dnnl_primitive_attr_set_{kind}_mask(attr, {arg}, {mask})", kind.replace("_", " ")) for kind, arg in given]
    lines += [kernel.check(f"dnnl_reorder_primitive_desc_create(&reorder, {source_md}, byoc_engine, {target_md}, byoc_engine, attr)", what),
              kernel.check(f"byoc_primitive(&{primitive}, reorder)", what), "dnnl_primitive_attr_destroy(attr);"]
    return ["{", *("  " + line for line in lines), "}"]


def _execute(kernel: Kernel, primitive: str, args: list[tuple[str, str]], what: str) -> list[str]:
    """The lines that run `primitive` once with `args` ((argument, memory) pairs): a reorder
    whose scales or zero points are given per call (`_reorder_with_attributes`)."""
    listed = ", ".join(f"{{{arg}, {memory}}}" for arg, memory in args)
    return ["{", f"  dnnl_exec_arg_t args[{len(args)}] = {{{listed}}};",
            "  " + kernel.check(f"byoc_execute({primitive}, {len(args)}, args)", what), "}"]


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
        *_reorder_with_attributes(kernel, f"{name}_reorder", kernel.md_of(w), md, [("zero_points", "DNNL_ARG_SRC")], "int8 operand"),
    ]
    kernel.before += _execute(kernel, f"{name}_reorder", [("DNNL_ARG_FROM", f"{w.name}_mem"), ("DNNL_ARG_TO", name),
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
        *_reorder_with_attributes(kernel, f"{k}_quantize", source_md, q_md, [("scales", "DNNL_ARG_DST"), ("zero_points", "DNNL_ARG_DST")],
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
        *_execute(kernel, f"{k}_quantize", _run_time_scales(k, source, f"{k}_q", "DNNL_ARG_DST"), "input quantization"),
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
        *_reorder_with_attributes(kernel, f"{k}_dequantize", q_md, float_md, [("scales", "DNNL_ARG_SRC"), ("zero_points", "DNNL_ARG_SRC")],
                                  "input dequantization"),
    ]
    kernel.before += _execute(kernel, f"{k}_dequantize", _run_time_scales(k, quantized, f"{k}_dq", "DNNL_ARG_SRC"), "input dequantization")
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
    bias, post, residuals = _fused_tail(call, node)
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


def pooling(call: KernelCall) -> KernelCode:
    kernel = Kernel(call)
    node = call.nodes[0]
    if call.pattern == "qmax_pool2d":  # on the int8 data: the quantization is the same on both sides
        node = call.node("relax.nn.max_pool2d")
    attrs = node["attrs"]
    x, out = call.arg(node, 0), call.outputs[0]
    source = dequantized(call, x)
    if source is not None:
        x = call.arg(source, 0)
    if node["op"] == "relax.nn.max_pool2d":
        algorithm = "dnnl_pooling_max"
    else:
        algorithm = "dnnl_pooling_avg_include_padding" if attrs["count_include_pad"] else "dnnl_pooling_avg_exclude_padding"
    kh, kw = attrs["pool_size"]
    sh, sw = attrs["strides"]
    dh, dw = attrs["dilation"]
    top, left, bottom, right = attrs["padding"]
    # ceil_mode makes the output one larger: oneDNN expresses that as extra right padding.
    bottom = (out.shape[2] - 1) * sh + (kh - 1) * dh + 1 - x.shape[2] - top
    right = (out.shape[3] - 1) * sw + (kw - 1) * dw + 1 - x.shape[3] - left
    k = kernel.k
    kernel.setup += [
        f"static const dnnl_dims_t {k}_strides = {{{sh}, {sw}}};",
        f"static const dnnl_dims_t {k}_kernel = {{{kh}, {kw}}};",
        f"static const dnnl_dims_t {k}_dilation = {{{dh - 1}, {dw - 1}}};",
        f"static const dnnl_dims_t {k}_pad_l = {{{top}, {left}}};",
        f"static const dnnl_dims_t {k}_pad_r = {{{bottom}, {right}}};",
    ]
    dst_md = kernel.md(out.shape, dtype=out.dtype)
    create = (
        f"dnnl_pooling_forward_primitive_desc_create(&pd, byoc_engine, dnnl_forward_inference, {algorithm}, {kernel.md_of(x)}, "
        f"{dst_md}, {k}_strides, {k}_kernel, {k}_dilation, {k}_pad_l, {k}_pad_r, NULL)"
    )
    kernel.direct("DNNL_ARG_SRC", f"{x.name}_mem")
    kernel.result(out)
    return kernel.code(create)


REDUCTIONS = {"relax.mean": "dnnl_reduction_mean", "relax.sum": "dnnl_reduction_sum"}


def reduction(call: KernelCall) -> KernelCode:
    """A mean or a sum over some axes. A mean over the spatial axes of NCHW, kept, is global
    average pooling, which oneDNN runs with a JIT kernel (its reduction falls back to a
    reference one there)."""
    kernel = Kernel(call)
    node = call.nodes[0]
    x, out = call.arg(node, 0), call.outputs[0]
    axis = node["attrs"]["axis"]  # None: every axis (ONNX ReduceMean without axes, a loss's mean)
    axes = list(range(len(x.shape))) if axis is None else sorted(a % len(x.shape) for a in axis)
    kept = tuple(1 if a in axes else d for a, d in enumerate(x.shape))
    if node["op"] == "relax.mean" and kept == out.shape and len(x.shape) == 4 and axes == [2, 3]:
        return _global_average_pool(kernel, x, out)
    kernel.direct("DNNL_ARG_SRC", f"{x.name}_mem")
    if kept != out.shape:  # reduced dimensions dropped: the result is written with them kept, through a view
        dst_md = kernel.md(kept, "plain")
        kernel.direct("DNNL_ARG_DST", kernel.result_view(out, dst_md))
    else:
        dst_md = kernel.md(out.shape)
        kernel.result(out)
    algorithm = REDUCTIONS[node["op"]]
    create = f"dnnl_reduction_primitive_desc_create(&pd, byoc_engine, {algorithm}, {kernel.md_of(x)}, {dst_md}, 0.f, 0.f, NULL)"
    return kernel.code(create)


def _global_average_pool(kernel: Kernel, x: CBuffer, out: CBuffer) -> KernelCode:
    k = kernel.k
    kernel.setup += [
        f"static const dnnl_dims_t {k}_ones = {{1, 1}};",
        f"static const dnnl_dims_t {k}_kernel = {{{x.shape[2]}, {x.shape[3]}}};",
        f"static const dnnl_dims_t {k}_zeros = {{0, 0}};",
    ]
    dst_md = kernel.md(out.shape)
    kernel.direct("DNNL_ARG_SRC", f"{x.name}_mem")
    kernel.result(out)
    create = (
        f"dnnl_pooling_forward_primitive_desc_create(&pd, byoc_engine, dnnl_forward_inference, dnnl_pooling_avg_exclude_padding, "
        f"{kernel.md_of(x)}, {dst_md}, {k}_ones, {k}_kernel, {k}_zeros, {k}_zeros, {k}_zeros, NULL)"
    )
    return kernel.code(create)


def eltwise(call: KernelCall) -> KernelCode:
    """One element-wise op, or a GELU composite as one op."""
    kernel = Kernel(call)
    node = call.nodes[0]
    x = next(b for b in call.arg_buffers[0] if b is not None and b.kind != "constant")
    out = call.outputs[0]
    algorithm, alpha, beta = (GELU_FORMS[call.pattern], "0.f", "0.f") if call.pattern in GELU_FORMS else eltwise_args(call, node)
    kernel.direct("DNNL_ARG_SRC", f"{x.name}_mem")
    kernel.result(out)
    create = (
        f"dnnl_eltwise_forward_primitive_desc_create(&pd, byoc_engine, dnnl_forward_inference, {algorithm}, "
        f"{kernel.md_of(x)}, {kernel.md_of(x)}, {alpha}, {beta}, NULL)"
    )
    return kernel.code(create)


def binary(call: KernelCall) -> KernelCode:
    """add/subtract/multiply/divide with numpy broadcasting of the second operand; c / x and
    c - x with a scalar constant c are element-wise ops. A quantize after it (see byoc.annotate.qdq) is a
    linear post-op and an int8 result, which the conversion rounds and saturates."""
    node = call.nodes[0]
    a, b, out = call.arg(node, 0), call.arg(node, 1), call.outputs[0]
    if a.kind == "constant" and a.size == 1 and b.shape == out.shape and node["op"] in ("relax.divide", "relax.subtract"):
        return eltwise(call)
    kernel = Kernel(call)
    if a.shape != out.shape:  # only commutative ops get here this way round (see the predicate)
        a, b = b, a
    kernel.source("DNNL_ARG_SRC_0", a, "dnnl_query_src_md")
    if b.shape == a.shape:
        # oneDNN's JIT kernel wants both operands in one layout (else its reference code runs,
        # 100x slower): the second is reordered into the first's where their producers differ.
        src1_md = kernel.md_of(a)
        kernel.source("DNNL_ARG_SRC_1", b, "dnnl_query_src_md", index=1)
    else:
        src1_memory, src1_md = f"{b.name}_mem", kernel.md_of(b)
        if len(b.shape) < len(out.shape):
            shape = (1,) * (len(out.shape) - len(b.shape)) + b.shape
            src1_memory, src1_md = kernel.view(b, shape), kernel.md(shape, "plain")
        kernel.direct("DNNL_ARG_SRC_1", src1_memory)
    kernel.result(out)
    algorithm = BINARY[node["op"]]
    attr, dst_md, quantize = "NULL", kernel.md_of(a), result_quantize(call)
    if quantize is not None:
        result = scales_of(call, quantize)
        attr = kernel.post_ops([quantizing(result)], [], len(out.shape))
        dst_md = kernel.like_md(a, out.dtype)
    create = f"dnnl_binary_primitive_desc_create(&pd, byoc_engine, {algorithm}, {kernel.md_of(a)}, {src1_md}, {dst_md}, {attr})"
    retry: tuple[str, ...] = ()
    if len(out.shape) == 4 and b.shape != out.shape:
        # oneDNN 3.2 broadcasts per channel over nChw8c only in its reference code (DenseNet's
        # batch norms after a concatenation ran 100x slower); its JIT kernel takes NHWC.
        nhwc = kernel.md(out.shape, "acdb")
        retry = (f"dnnl_binary_primitive_desc_create(&retry_pd, byoc_engine, {algorithm}, {nhwc}, {src1_md}, "
                 f"{kernel.md(out.shape, 'acdb', out.dtype)}, {attr})",)
    return kernel.code(create, attrs=(attr,) if quantize is not None else (), retry=retry)


def select(call: KernelCall) -> KernelCode:
    """where(condition, x, c) with a one-number constant c, the condition a constant (GPT-Neo's
    causal mask, every layer) or an input of the region (DeBERTa's padding mask): x clamped
    between two bounds made from the condition (at initialisation for a constant, before each
    call for an input), min(x, high) then max with low as a post-op. Where the condition selects x,
    the bounds are -inf and +inf; where it selects c, both are c. That is where's result for
    every x but NaN. x and the result are seen as rows of the condition's size, the bounds as
    one row: oneDNN 3.2 runs a binary post-op broadcast over rows in its JIT kernel, and one
    broadcast over leading axes only in its reference code (12x slower on GPT-Neo)."""
    node = call.nodes[0]
    condition, out = call.arg(node, 0), call.outputs[0]
    x_first = call.arg(node, 1).kind != "constant" or call.arg(node, 1).size != 1
    x, value = (call.arg(node, 1), scalar_of(call, node, 2)) if x_first else (call.arg(node, 2), scalar_of(call, node, 1))
    kernel = Kernel(call)
    rows_md, row_md = kernel.md((out.size // condition.size, condition.size), "plain"), kernel.md((1, condition.size), "plain")
    high, low = (_selection_bound(kernel, condition, row_md, *((bound, c_float(value)) if x_first else (c_float(value), bound)))
                 for bound in ("INFINITY", "-INFINITY"))
    kernel.direct("DNNL_ARG_SRC_0", kernel.rows_view(x, rows_md))
    kernel.direct("DNNL_ARG_SRC_1", high)
    kernel.direct("DNNL_ARG_DST", kernel.result_view(out, rows_md))
    attr = kernel.post_ops([{"op": "lower bound", "algorithm": "dnnl_binary_max", "operand": (low, row_md)}], [], 2)
    create = f"dnnl_binary_primitive_desc_create(&pd, byoc_engine, dnnl_binary_min, {rows_md}, {row_md}, {rows_md}, {attr})"
    return kernel.code(create, attrs=(attr,))


def _selection_bound(kernel: Kernel, condition: CBuffer, md: str, selected: str, otherwise: str) -> str:
    """A float memory described by `md` holding `selected` where the condition holds and
    `otherwise` elsewhere: filled once at initialisation from a constant condition, before each
    call from one the host computed (a padding mask: one row of the scores' size, so cheap)."""
    name = kernel.name_of("bound")
    kernel.state += [f"static float* {name}_data = NULL;", f"static dnnl_memory_t {name} = NULL;"]
    kernel.setup += [f"{name}_data = (float*)malloc({condition.size} * sizeof(float));",
                     f'if ({name}_data == NULL) BYOC_FAIL("{c_text(kernel.where)}: out of memory for the selection");']
    fill = f"for (int64_t i = 0; i < {condition.size}; ++i) {name}_data[i] = {condition.name}[i] ? {selected} : {otherwise};"
    (kernel.setup if condition.kind == "constant" else kernel.before).append(fill)
    kernel.setup.append(kernel.check(f"dnnl_memory_create(&{name}, {md}, byoc_engine, {name}_data)", "selection bound"))
    return name


def softmax(call: KernelCall) -> KernelCode:
    """Softmax; in the `softmax_nan_to_zero` composite, NaN (from a row masked whole, where
    oneDNN computes -inf - -inf) then becomes 0, as torch's exported attention asks. A quantize
    after it (zero point 0: see byoc.annotate.qdq) is the primitive's result scale and an int8 result."""
    kernel = Kernel(call)
    node = call.nodes[0]
    x, out = call.arg(node, 0), call.outputs[0]
    axis = node["attrs"]["axis"] % len(x.shape)
    kernel.direct("DNNL_ARG_SRC", f"{x.name}_mem")
    kernel.result(out)
    kernel.after[0:0] = _rows_masked_whole(kernel, call, x, kernel.exec_args[-1][1])
    attr, dst_md, quantize = "NULL", kernel.md_of(x), result_quantize(call)
    if quantize is not None:
        attr, dst_md = kernel.post_ops([], [], len(out.shape)), kernel.like_md(x, out.dtype)
        kernel.scales(attr, "DNNL_ARG_DST", scales_of(call, quantize), 0, zero_point=False)
    create = (
        f"dnnl_softmax_forward_primitive_desc_create(&pd, byoc_engine, dnnl_forward_inference, dnnl_softmax_accurate, "
        f"{kernel.md_of(x)}, {dst_md}, {axis}, {attr})"
    )
    code = kernel.code(create, attrs=(attr,) if quantize is not None else ())
    if quantize is not None or axis != len(x.shape) - 1 or not names_of(x.shape) or {x.dtype, out.dtype} != {"float32"}:
        return code
    return _chosen(f"{call.name}_in_loops", _softmax_in_loops(call, x, out), code,
                   f"!byoc_settled && byoc_small_rows({kernel.md_of(x)}, {SMALL_ROWS}) > 0")


def _rows_masked_whole(kernel: Kernel, call: KernelCall, x: CBuffer, result: str) -> list[str]:
    """C after the softmax of scores `x` into memory `result` for torch's two forms of a row
    masked whole: its NaN made 0 (`softmax_nan_to_zero`), or the rows whose every score is -inf,
    and only those, made 0 (`softmax_masked_rows_to_zero`); none for a plain softmax."""
    if call.pattern == "softmax_masked_rows_to_zero":
        return [kernel.check(f"byoc_zero_masked_rows({x.name}_mem, {result}, {math.prod(x.shape[:-1])}, {x.shape[-1]})",
                             "softmax's masked rows")]
    if call.pattern == "softmax_nan_to_zero":
        return [kernel.check(f"byoc_nan_to_zero({result})", "softmax result")]
    return []


def _softmax_in_loops(call: KernelCall, x: CBuffer, out: CBuffer) -> KernelCode:
    """The softmax over the last axis of dense scores by `byoc_softmax_rows`, its result in the
    scores' layout; no primitive made (see SMALL_ROWS)."""
    kernel = Kernel(call, "loops")
    kernel.state = []
    name = kernel.name_of("dst")
    kernel.state.append(f"static byoc_conversion {name};")
    size = f"&{out.name}_bytes" if out.kind == "intermediate" else "NULL"
    kernel.setup.append(kernel.check(f"byoc_result_init(&{name}, &{out.name}_mem, {size}, {kernel.md_of(x)})", "result layout"))
    kernel.before += [kernel.check(f"byoc_softmax_rows({x.name}_mem, {name}.memory, {math.prod(x.shape[:-1])}, {x.shape[-1]})",
                                   "softmax"),
                      *_rows_masked_whole(kernel, call, x, f"{name}.memory")]
    if out.kind != "intermediate":
        kernel.after.append(kernel.check(f"byoc_reorder({name}.reorder, {name}.memory, {out.name}_mem)", f"reorder into {out.name}"))
    return kernel.code_without_primitive()


def concat(call: KernelCall) -> KernelCode:
    kernel = Kernel(call)
    node = call.nodes[0]
    sources = call.arg_buffers[0][0]
    out = call.outputs[0]
    axis = node["attrs"]["axis"] % len(out.shape)
    k = kernel.k
    kernel.setup.append(f"const_dnnl_memory_desc_t {k}_srcs[{len(sources)}] = {{{', '.join(kernel.md_of(s) for s in sources)}}};")
    dst_md = kernel.md(out.shape)
    for index, source in enumerate(sources):
        kernel.direct(f"DNNL_ARG_MULTIPLE_SRC + {index}", f"{source.name}_mem")
    kernel.result(out)
    return kernel.code(f"dnnl_concat_primitive_desc_create(&pd, byoc_engine, {dst_md}, {len(sources)}, {axis}, {k}_srcs, NULL)")


def _strided_copies(call: KernelCall, x: CBuffer, parts: list[tuple[CBuffer, tuple[int, ...], list[int], int]]) -> KernelCode:
    """Each part as a reorder from a view of `x`'s plain data: per part, its buffer, the view's
    shape (the part's, or that shape with a unit axis kept), its element strides into `x` (0:
    broadcast; a multiple of the dense stride: every k-th element) and its first element."""
    kernel = Kernel(call)
    kernel.state = []  # no primitive of its own: one reorder per part
    source = kernel.plain_source(x)
    for index, (part, shape, strides, offset) in enumerate(parts):
        name = f"{kernel.k}_part{index}"
        kernel.state += [f"static dnnl_memory_t {name}_view = NULL;", f"static dnnl_primitive_t {name}_copy = NULL;"]
        view_md, part_md = kernel.strided_md(shape, strides, x.dtype), kernel.md(shape, "plain", part.dtype)
        result = kernel.result_view(part, part_md)
        kernel.setup += [
            kernel.check(f"dnnl_memory_create(&{name}_view, {view_md}, byoc_engine, DNNL_MEMORY_NONE)", f"view {index}"),
            "{",
            "  dnnl_primitive_desc_t copy = NULL;",
            "  " + kernel.check(f"dnnl_reorder_primitive_desc_create(&copy, {view_md}, byoc_engine, {part_md}, byoc_engine, NULL)", f"copy {index}"),
            "  " + kernel.check(f"byoc_primitive(&{name}_copy, copy)", f"copy {index}"),
            "}",
        ]
        kernel.point(f"{name}_view", source, offset * np.dtype(x.dtype).itemsize)
        kernel.before.append(kernel.check(f"byoc_reorder({name}_copy, {name}_view, {result})", f"copy {index}"))
    return kernel.code_without_primitive()


def _window(shape: tuple[int, ...], offsets: tuple[int, ...]) -> tuple[list[int], int]:
    """The strides and first element of a window of a plain tensor of `shape` at `offsets`."""
    dense = _dense_strides(shape)
    return dense, sum(o * s for o, s in zip(offsets, dense))


def split(call: KernelCall) -> KernelCode:
    node = call.nodes[0]
    x = call.arg(node, 0)
    axis = node["attrs"]["axis"] % len(x.shape)
    parts, offset = [], 0
    for part in call.node_outputs[0]:
        begin, offset = offset, offset + part.shape[axis]
        if part.kind != "internal":  # a part nobody reads is not copied
            parts.append((part, part.shape, *_window(x.shape, tuple(begin if a == axis else 0 for a in range(len(x.shape))))))
    return _strided_copies(call, x, parts)


def _dense_strides(shape: tuple[int, ...]) -> list[int]:
    return [math.prod(shape[a + 1 :]) for a in range(len(shape))]


def strided_slice(call: KernelCall) -> KernelCode:
    """A window of the input taking every step-th element (steps of 1: the halves of each head
    that rotary embeddings swap; 2: Swin's patch merging)."""
    node = call.nodes[0]
    x = call.arg(node, 0)
    axes, begin, _, *steps = ([item["prim"] for item in arg["tuple"]] for arg in node["args"][1:])
    dense = _dense_strides(x.shape)
    strides, offset = list(dense), 0
    for index, (axis, start) in enumerate(zip(axes, begin)):
        axis %= len(x.shape)
        size = x.shape[axis]
        offset += min(max(start + size if start < 0 else start, 0), size) * dense[axis]
        strides[axis] *= steps[0][index] if steps else 1
    return _strided_copies(call, x, [(call.outputs[0], call.outputs[0].shape, strides, offset)])


def broadcast_to(call: KernelCall) -> KernelCode:
    """A broadcast (grouped-query attention's keys and values repeated per head): the input
    read with stride 0 along the broadcast axes."""
    x, out = call.arg(call.nodes[0], 0), call.outputs[0]
    shape = (1,) * (len(out.shape) - len(x.shape)) + x.shape
    return _strided_copies(call, x, [(out, out.shape, [0 if d != o else s for d, o, s in zip(shape, out.shape, _dense_strides(shape))], 0)])


def pad(call: KernelCall) -> KernelCode:
    """Constant padding (Swin's windows): the result filled with the value, then the input
    copied into its window by a reorder into a sub-memory of the result."""
    kernel = Kernel(call)
    node = call.nodes[0]
    x, out = call.arg(node, 0), call.outputs[0]
    out_md = kernel.md(out.shape, "plain", out.dtype)
    result = kernel.result_view(out, out_md)
    window = kernel.name_of("window")
    kernel.state.append(f"static dnnl_memory_t {window} = NULL;")
    window_md = kernel.local_md()
    kernel.setup += ["{", "  " + dims_decl("shape", x.shape),
                     "  " + dims_decl("offsets", tuple(node['attrs']['pad_width'][0::2])),
                     "  " + kernel.check(f"dnnl_memory_desc_create_submemory(&{window_md}, {out_md}, shape, offsets)", "padded window"),
                     "  " + kernel.check(f"dnnl_memory_create(&{window}, {window_md}, byoc_engine, DNNL_MEMORY_NONE)", "padded window"),
                     "}"]
    kernel.point(window, result)
    kernel.before += ["{", "  float* data = NULL;",
                      "  " + kernel.check(f"dnnl_memory_get_data_handle({result}, (void**)&data)", "padded result"),
                      f"  byoc_fill(data, (long){out.size}, {c_float(node['attrs']['pad_value'])});", "}"]
    kernel.direct("DNNL_ARG_FROM", f"{x.name}_mem")
    kernel.direct("DNNL_ARG_TO", window)
    return kernel.code(f"dnnl_reorder_primitive_desc_create(&pd, {kernel.md_of(x)}, byoc_engine, {window_md}, byoc_engine, NULL)")


def take(call: KernelCall) -> KernelCode:
    """A constant index along one axis (BERT's pooler takes token 0): a window of the input."""
    node = call.nodes[0]
    x, out = call.arg(node, 0), call.outputs[0]
    axis = node["attrs"]["axis"] % len(x.shape)
    index = int(scalar_of(call, node, 1))
    index = index if index >= 0 else x.shape[axis] + index  # from the end; a symbolic length stays an expression
    window = tuple(1 if a == axis else d for a, d in enumerate(x.shape))
    return _strided_copies(call, x, [(out, window, *_window(x.shape, tuple(index if a == axis else 0 for a in range(len(x.shape)))))])


def layer_norm(call: KernelCall) -> KernelCode:
    """Layer normalisation over the last axis, with its scale and shift; or, for the
    `normalized` composite, without them."""
    kernel = Kernel(call)
    node = call.nodes[0]
    x, out = call.arg(node, 0), call.outputs[0]
    source, quantize = dequantized_source(call), result_quantize(call)
    if source is not None:  # int8 data, read as it is (see epsilon below)
        node, x = call.node("relax.nn.layer_norm"), call.arg(source, 0)
    attr = kernel.post_ops([], [], len(out.shape)) if quantize is not None else "NULL"
    if call.pattern == "normalized":
        epsilon, flags = scalar_of(call, call.node("relax.add"), 1), "0"
    else:
        epsilon, flags = node["attrs"]["epsilon"], "dnnl_use_scale | dnnl_use_shift"
        kernel.direct("DNNL_ARG_SCALE", f"{call.arg(node, 1).name}_mem")
        shift = call.arg(node, 2)
        if quantize is not None:
            # oneDNN takes a result scale but no zero point: round(y / s) + z = round((y + s * z) / s),
            # and y + s * z is the layer norm with s * z added to its shift.
            result = scales_of(call, quantize)
            shifted = np.asarray(call.constants[shift.name], np.float32) + result.scale[0] * np.float32(result.zero_point[0])
            kernel.direct("DNNL_ARG_SHIFT", kernel.array("shift", shifted, "float32"))
            kernel.scales(attr, "DNNL_ARG_DST", result, 0, zero_point=False)
        else:
            kernel.direct("DNNL_ARG_SHIFT", f"{shift.name}_mem")
    if source is not None:
        # The layer norm of s * (x - z) is that of x with epsilon / s^2, exactly: the mean takes
        # z away, and s cancels but for epsilon. (oneDNN 3.2 applies a source scale to the result.)
        epsilon = float(epsilon) / float(scales_of(call, source).scale[0]) ** 2
    kernel.direct("DNNL_ARG_SRC", f"{x.name}_mem")
    kernel.result(out)
    create = (
        f"dnnl_layer_normalization_forward_primitive_desc_create(&pd, byoc_engine, dnnl_forward_inference, {kernel.md_of(x)}, "
        f"{kernel.like_md(x, out.dtype)}, NULL, {c_float(epsilon)}, {flags}, {attr})"
    )
    return kernel.code(create, attrs=(attr,) if attr != "NULL" else ())


def rms_norm(call: KernelCall) -> KernelCode:
    """RMSNorm, x / sqrt(mean(x^2) + epsilon) (times a weight per channel), on x's rows as three
    primitives: the squares; their means, a product with a column of 1 / n; and a layer norm given
    those as its variances, 0 as its means and the weight as its scale. oneDNN 3.2's layer norm
    has no RMS form, and the ops one by one are seven primitives: 17 us at 32 x 128 against 8,
    where the mean as a reduction alone takes 4.4 us and as a product 2.7 (measured, 2 threads)."""
    x, out = call.arg(call.node("relax.power"), 0), call.outputs[0]
    channels = x.shape[-1]
    rows = x.size // channels
    k = call.name
    squares, means, norm = (Kernel(call, part) for part in ("squares", "means", "norm"))
    # The means are written as a column and read as the layer norm's variances: one array.
    squares.state += [f"static float {k}_ones[{channels}];",
                      f"static dnnl_memory_t {k}_squares = NULL, {k}_means = NULL, {k}_variances = NULL, {k}_zero_means = NULL;"]
    rows_md = squares.md((rows, channels), "plain")
    squares.setup.append(squares.check(f"dnnl_memory_create(&{k}_squares, {rows_md}, byoc_engine, DNNL_MEMORY_ALLOCATE)", "squares"))
    x_rows = squares.rows_view(x, rows_md)
    squares.direct("DNNL_ARG_SRC", x_rows)
    squares.direct("DNNL_ARG_DST", f"{k}_squares")
    codes = [squares.code(f"dnnl_eltwise_forward_primitive_desc_create(&pd, byoc_engine, dnnl_forward_inference, dnnl_eltwise_square, "
                          f"{rows_md}, {rows_md}, 0.f, 0.f, NULL)")]

    column_md, means_md = means.md((channels, 1), "plain"), means.md((rows, 1), "plain")
    means.state.append(f"static dnnl_memory_t {k}_column = NULL;")
    means.setup += [f"for (int i = 0; i < {channels}; i++) {k}_ones[i] = 1.f / {channels}.f;",
                    means.check(f"dnnl_memory_create(&{k}_column, {column_md}, byoc_engine, {k}_ones)", "column"),
                    means.check(f"dnnl_memory_create(&{k}_means, {means_md}, byoc_engine, DNNL_MEMORY_ALLOCATE)", "means")]
    means.direct("DNNL_ARG_SRC", f"{k}_squares")
    means.weights("DNNL_ARG_WEIGHTS", f"{k}_column", "dnnl_query_weights_md")
    means.direct("DNNL_ARG_DST", f"{k}_means")
    codes.append(means.code(f"dnnl_matmul_primitive_desc_create(&pd, byoc_engine, {means.md((rows, channels), 'plain')}, "
                            f"{means.md((channels, 1))}, NULL, {means_md}, NULL)"))

    stats_md, norm_md = norm.md((rows,), "plain"), norm.md((rows, channels), "plain")
    norm.setup += ["{", "  void* data = NULL;", "  " + norm.check(f"dnnl_memory_get_data_handle({k}_means, &data)", "means"),
                   "  " + norm.check(f"dnnl_memory_create(&{k}_variances, {stats_md}, byoc_engine, data)", "variances"),
                   "  " + norm.check(f"dnnl_memory_create(&{k}_zero_means, {stats_md}, byoc_engine, DNNL_MEMORY_ALLOCATE)", "means"),
                   "  " + norm.check(f"dnnl_memory_get_data_handle({k}_zero_means, &data)", "means"),
                   f"  memset(data, 0, {rows} * sizeof(float));", "}"]
    norm.direct("DNNL_ARG_SRC", x_rows)
    norm.direct("DNNL_ARG_MEAN", f"{k}_zero_means")
    norm.direct("DNNL_ARG_VARIANCE", f"{k}_variances")
    flags = "dnnl_use_global_stats"
    if call.pattern == "rms_norm":
        weighting = call.nodes[-1]
        weight = next(b for b in (call.arg(weighting, 0), call.arg(weighting, 1)) if b.kind == "constant")
        norm.direct("DNNL_ARG_SCALE", norm.view(weight, (channels,)))
        flags += " | dnnl_use_scale"
    norm.direct("DNNL_ARG_DST", norm.result_view(out, norm_md))
    epsilon = scalar_of(call, call.node("relax.add"), 1)
    codes.append(norm.code(f"dnnl_layer_normalization_forward_primitive_desc_create(&pd, byoc_engine, dnnl_forward_inference, {norm_md}, "
                           f"{norm_md}, NULL, {c_float(epsilon)}, {flags}, NULL)"))
    return in_sequence(codes)


def rotary(call: KernelCall) -> KernelCode:
    """Rotary embeddings, x * cos + rotate_half(x) * sin with rotate_half(x) = concat(-x2, x1), as
    three primitives: each half of x copied into the other half of a scratch tensor by a reorder
    whose scales per position and channel are sin's (negated for -x2), then x * cos plus that, a
    binary with the sum as a post-op. Op by op it was seven primitives (two slices, a negation,
    a concatenation, two products, a sum), and a binary on half of each row runs in oneDNN 3.2's
    reference code (34 us against 0.6 for the scaled copy, measured at 4 x 32 x 16)."""
    x, out = call.arg(call.node("relax.strided_slice"), 0), call.outputs[0]
    channels, half, table_shape = x.shape[-1], x.shape[-1] // 2, (1,) * (len(x.shape) - 2) + x.shape[-2:]
    tables = {}  # "cos" (the product with x) and "sin" (with the rotated halves): constant buffers
    for node in (n for n in call.nodes if n["op"] == "relax.multiply"):
        operands = (call.arg(node, 0), call.arg(node, 1))
        tables["cos" if x in operands else "sin"] = next(b for b in operands if b.kind == "constant")
    sin = np.asarray(call.constants[tables["sin"].name], np.float32).reshape(x.shape[-2], channels)
    k = call.name
    low, high, total = (Kernel(call, part) for part in ("low", "high", "sum"))
    low.state, high.state = [f"static dnnl_memory_t {k}_rotated = NULL;"], []  # the copies are primitives of their own
    low.setup.append(low.check(f"dnnl_memory_create(&{k}_rotated, {low.md(x.shape, 'plain', x.dtype)}, byoc_engine, DNNL_MEMORY_ALLOCATE)",
                               "rotated halves"))
    source = low.plain_source(x)
    # rotated[..., :h] = x[..., h:] * -sin[:, :h]; rotated[..., h:] = x[..., :h] * sin[:, h:]
    for kernel, read_at, write_at, scales in ((low, half, 0, -sin[:, :half]), (high, 0, half, sin[:, half:])):
        half_md = kernel.strided_md(x.shape[:-1] + (half,), _dense_strides(x.shape), x.dtype)
        name = kernel.k
        kernel.state.append(f"static dnnl_memory_t {name}_read = NULL, {name}_write = NULL; static dnnl_primitive_t {name}_copy = NULL;")
        kernel.setup += [kernel.check(f"dnnl_memory_create(&{name}_{side}, {half_md}, byoc_engine, DNNL_MEMORY_NONE)", "half view")
                         for side in ("read", "write")]
        kernel.setup += _reorder_with_attributes(kernel, f"{name}_copy", half_md, half_md, [("scales", "DNNL_ARG_SRC")], "scaled half",
                                                 mask=(1 << (len(x.shape) - 2)) | (1 << (len(x.shape) - 1)))
        scale = kernel.array("scale", np.ascontiguousarray(scales), "float32")
        kernel.point(f"{name}_read", source, read_at * np.dtype(x.dtype).itemsize)
        kernel.point(f"{name}_write", f"{k}_rotated", write_at * np.dtype(x.dtype).itemsize)
        kernel.before += _execute(kernel, f"{name}_copy", [("DNNL_ARG_FROM", f"{name}_read"), ("DNNL_ARG_TO", f"{name}_write"),
                                                          ("DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC", scale)], "scaled half")
    full_md = total.md(x.shape, "plain", x.dtype)
    total.direct("DNNL_ARG_SRC_0", source)
    total.direct("DNNL_ARG_SRC_1", total.view(tables["cos"], table_shape))
    attr = total.post_ops([{"op": "binary", "algorithm": "dnnl_binary_add", "operand": (f"{k}_rotated", full_md)}], [], len(x.shape))
    total.result(out)
    codes = [low.code_without_primitive(), high.code_without_primitive(),
             total.code(f"dnnl_binary_primitive_desc_create(&pd, byoc_engine, dnnl_binary_mul, {full_md}, {total.md(table_shape, 'plain')}, "
                        f"{total.md(out.shape, dtype=out.dtype)}, {attr})", (attr,))]
    return in_sequence(codes)


def _relayout(call: KernelCall, view_setup, view=None) -> KernelCode:
    """A reorder from the input into a view of the output's data (reshape, transpose). With
    `view(kernel, x, out, view_md)` giving a C condition and the descriptor of the output as a
    view of the input's data (None: the output's own), the output is that view wherever the condition
    holds at initialisation, when layouts are known (the library declares such ops views, so the
    input's memory outlives the output)."""
    kernel = Kernel(call)
    x, out = call.arg(call.nodes[0], 0), call.outputs[0]
    view_md = view_setup(kernel, x, out)
    kernel.direct("DNNL_ARG_FROM", f"{x.name}_mem")
    kernel.direct("DNNL_ARG_TO", kernel.result_view(out, view_md))
    viewed = view is not None and out.kind == "intermediate"  # a region output is the caller's memory
    if viewed:
        condition, md = view(kernel, x, out, view_md)
        k = kernel.k
        kernel.state += [f"static int {k}_is_view = 0;", f"static byoc_conversion {k}_alias;"]
        kernel.setup.append(f"{k}_is_view = {condition};")
        if md is not None:  # the output's memory described as a view of the input's
            kernel.setup += [f"if ({k}_is_view) {{",
                             "  " + kernel.check(f"byoc_result_init(&{k}_alias, &{out.name}_mem, &{out.name}_bytes, {md})", "view"), "}"]
    # A view makes no reorder (one per new size of a decoder's cache took 27 us).
    code = kernel.code(f"dnnl_reorder_primitive_desc_create(&pd, {kernel.md_of(x)}, byoc_engine, {view_md}, byoc_engine, NULL)",
                       unless=f"{kernel.k}_is_view" if viewed else None)
    if not viewed:
        return code
    point = ["{", "  void* data = NULL;", "  " + kernel.check(f"dnnl_memory_get_data_handle({x.name}_mem, &data)", f"data of {x.name}"),
             "  " + kernel.check(f"dnnl_memory_set_data_handle({out.name}_mem, data)", "view"), "}"]
    run = [f"if ({kernel.k}_is_view)", *point, "else {", *("  " + line for line in code.run.splitlines()), "}"]
    return dataclasses.replace(code, run="\n".join(run))


def reshape(call: KernelCall) -> KernelCode:
    """A view of the input's data where its producer wrote it in plain layout, else a copy.
    Exporters write reshapes around dense layers and attention's heads: as copies they were a
    third of tiny GPT-2's primitives."""
    return _relayout(call, lambda kernel, x, out: kernel.md(x.shape, "plain", x.dtype),
                     view=lambda kernel, x, out, plain: (f"dnnl_memory_desc_equal({kernel.md_of(x)}, {plain})", None))


def _order(node: dict, rank: int) -> list[int]:
    """Axis j of a transpose's result is axis order[j] of its input."""
    axes = node["attrs"]["axes"]
    return list(range(rank))[::-1] if axes is None else [int(a) for a in axes]


def _permuted_md(kernel: Kernel, md: str, order: list[int]) -> str:
    """A local descriptor: `md` with its axes moved, axis i to position order[i]."""
    name = kernel.local_md("perm")
    kernel.setup += [f"int {name}_axes[{len(order)}] = {{{', '.join(str(a) for a in order)}}};",
                     kernel.check(f"dnnl_memory_desc_permute_axes(&{name}, {md}, {name}_axes)", "transpose view")]
    return name


def _transposed_layout(kernel: Kernel, shape: tuple[int, ...], order: list[int], dtype: str) -> str:
    """The descriptor, with a transpose's input dims, of where each input element lands in its
    result of `shape` (plain): the result's plain layout with axis j moved to order[j]."""
    return _permuted_md(kernel, kernel.md(shape, "plain", dtype), order)


def permute_dims(call: KernelCall) -> KernelCode:
    """A transpose: a view of the input's data where the input was written in the layout the
    transpose undoes (a product writing attention's heads back in place), or where every reader
    is a product, whose JIT kernel reads an operand in any layout (attention's queries, keys and
    values); else a reorder."""
    node = call.nodes[0]
    order = _order(node, len(call.arg(node, 0).shape))
    inverse = [order.index(a) for a in range(len(order))]
    products_only = "1" if _read_by_products(call, node) else "0"

    def view(kernel: Kernel, x: CBuffer, out: CBuffer, _transposed: str) -> tuple[str, str]:
        seen, plain = _permuted_md(kernel, kernel.md_of(x), inverse), kernel.md(out.shape, "plain", out.dtype)
        # Where the transpose moves unit axes only, the data is in plain layout and is described so: with the
        # moved axes' strides kept, oneDNN 3.2's binary misread its broadcast operand (a decoding step's
        # queries times the rotary table, at one new token: values of 1e24).
        same = f"dnnl_memory_desc_equal({seen}, {plain})"
        return f"{products_only} || {same}", f"({same} ? {plain} : {seen})"

    return _relayout(call, lambda kernel, x, out: _transposed_layout(kernel, out.shape, order, out.dtype), view=view)


def _read_by_products(call: KernelCall, node: dict) -> bool:
    """Whether every reader of `node`'s result is a matrix product, or an operand's scaling fused
    into one (`_unscaled`): these take an operand in the layout it comes in."""
    def product(reader: dict) -> bool:
        composite = reader.get("composite")
        return reader["op"] == "relax.matmul" or reader["op"] == "relax.multiply" and composite is not None and any(
            r["op"] == "relax.matmul" and (r.get("composite") or {}).get("id") == composite["id"] for r in call.readers_of(reader))

    readers = call.readers_of(node)
    return bool(readers) and all(product(r) for r in readers)


def _transposed_result(kernel: Kernel, call: KernelCall) -> str | None:
    """For a product whose only reader is a transpose (attention's heads back in place): the
    descriptor that writes the product where the transpose would put it, so that the transpose
    is a view. None otherwise."""
    out = call.outputs[0]
    readers = call.readers_of(call.nodes[-1])
    if out.kind != "intermediate" or len(readers) != 1 or readers[0]["op"] != "relax.permute_dims" or readers[0].get("composite"):
        return None
    transposed = read_shape(readers[0]["outputs"][0]["shape"])
    return _transposed_layout(kernel, transposed, _order(readers[0], len(out.shape)), out.dtype)


def reorder(call: KernelCall) -> KernelCode:
    """One reorder between data types. A quantize or dequantize on its own (a region's input
    quantized, a float op between int8 kernels): between float32 and int8 with the node's scale
    and zero point. Both (`requantize`: int8 data read with one scale and written with another,
    as between a softmax and the product that reads it): from int8 to int8 with both. A float16
    model's input or output cast (see byoc.frontend.float16): between float32 and float16, which
    oneDNN converts with the CPU's own instructions, in parallel."""
    kernel = Kernel(call)
    x, out = call.arg(call.nodes[0], 0), call.outputs[0]
    attr = kernel.post_ops([], [], len(out.shape))
    for node in call.nodes:
        if node["op"] not in ("relax.quantize", "relax.dequantize"):
            continue
        scales = scales_of(call, node)
        arg = "DNNL_ARG_DST" if node["op"] == "relax.quantize" else "DNNL_ARG_SRC"
        kernel.scales(attr, arg, scales, 1 << (scales.axis % len(x.shape)) if scales.per_channel else 0)
    dst_md = kernel.like_md(x, out.dtype)
    kernel.direct("DNNL_ARG_FROM", f"{x.name}_mem")
    kernel.result(out)
    create = f"dnnl_reorder_primitive_desc_create(&pd, {kernel.md_of(x)}, byoc_engine, {dst_md}, byoc_engine, {attr})"
    return kernel.code(create, (attr,))
