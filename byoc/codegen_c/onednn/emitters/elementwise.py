"""Emitters of element-wise, binary and selection ops, poolings and reductions."""

from __future__ import annotations

import math

from byoc.codegen_c.kernel_call import CBuffer, KernelCall, KernelCode
from byoc.codegen_c.onednn.emitters.shared import GELU_FORMS
from byoc.codegen_c.onednn.kernel import BINARY, Kernel, c_float, c_text, eltwise_args, quantizing, scalar_of
from byoc.codegen_c.onednn.kernel_scales import dequantized, result_quantize, scales_of


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


def resize(call: KernelCall) -> KernelCode:
    """A resize of NCHW data as oneDNN's resampling (see `onednn_resampling` in the dnnl vendor
    for the modes that compute as the model does), in any layout its producer left."""
    kernel = Kernel(call)
    node = call.nodes[0]
    x, out = call.arg(node, 0), call.outputs[0]
    algorithm = "dnnl_resampling_linear" if node["attrs"]["method"] == "linear" else "dnnl_resampling_nearest"
    kernel.direct("DNNL_ARG_SRC", f"{x.name}_mem")
    kernel.result(out)
    create = (f"dnnl_resampling_forward_primitive_desc_create(&pd, byoc_engine, dnnl_forward_inference, {algorithm}, NULL, "
              f"{kernel.md_of(x)}, {kernel.md(out.shape)}, NULL)")
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
    if middle_block(x.shape, axes) and x.dtype == "float32":
        return _reduce_as_product(kernel, x, out, axes, node["op"] == "relax.mean")
    # Read in plain layout: oneDNN 3.2 reduces the innermost axes of the layout in its JIT kernel,
    # and a producer's channels-last layout (acdb) puts height and width in the middle: ConvNeXt
    # V2's sums over them ran in reference code, 1.5 ms each against 0.05 for a copy to plain.
    source = kernel.plain_source(x)
    src_md = kernel.md(x.shape, "plain", x.dtype)
    kernel.direct("DNNL_ARG_SRC", source)
    if kept != out.shape:  # reduced dimensions dropped: the result is written with them kept, through a view
        dst_md = kernel.md(kept, "plain")
        kernel.direct("DNNL_ARG_DST", kernel.result_view(out, dst_md))
    else:
        dst_md = kernel.md(out.shape)
        kernel.result(out)
    algorithm = REDUCTIONS[node["op"]]
    create = f"dnnl_reduction_primitive_desc_create(&pd, byoc_engine, {algorithm}, {src_md}, {dst_md}, 0.f, 0.f, NULL)"
    return kernel.code(create)


def middle_block(shape: tuple, axes: list[int]) -> bool:
    """Whether `axes` are one block of consecutive axes before the innermost, in a shape of
    fixed sizes, none 0 (a sum over nothing is a product of no terms, which oneDNN leaves
    unwritten)."""
    return (bool(axes) and axes == list(range(axes[0], axes[-1] + 1)) and axes[-1] < len(shape) - 1
            and all(isinstance(d, int) and d > 0 for d in shape))


def _reduce_as_product(kernel: Kernel, x: CBuffer, out: CBuffer, axes: list[int], mean: bool) -> KernelCode:
    """A sum (or mean) over a block of middle axes as a product by a row of ones (of 1 / n): x
    read as (outer, summed, inner), and (1, summed) @ x is (outer, 1, inner). oneDNN 3.2 reduces
    over other than the innermost axes in reference code only (ConvNeXt V2's sum over height and
    width, channels last, took 0.17 ms for 16 KB), and its matmul is a JIT kernel for any such
    shape (ResNeSt's sum over its radix splits, ConvNeXt V2's mean over channels)."""
    k = kernel.k
    outer, summed, inner = (math.prod(x.shape[:axes[0]]), math.prod(x.shape[axes[0]:axes[-1] + 1]),
                            math.prod(x.shape[axes[-1] + 1:]))
    row_md, x_md, dst_md = (kernel.md(shape, "plain") for shape in ((1, 1, summed), (outer, summed, inner), (outer, 1, inner)))
    kernel.state += [f"static float {k}_ones[{summed}];", f"static dnnl_memory_t {k}_row = NULL;"]
    kernel.setup += [f"for (int i = 0; i < {summed}; i++) {k}_ones[i] = {f'1.f / {summed}.f' if mean else '1.f'};",
                     kernel.check(f"dnnl_memory_create(&{k}_row, {row_md}, byoc_engine, {k}_ones)", "row of ones")]
    kernel.direct("DNNL_ARG_SRC", f"{k}_row")
    kernel.direct("DNNL_ARG_WEIGHTS", kernel.rows_view(x, x_md))
    kernel.direct("DNNL_ARG_DST", kernel.result_view(out, dst_md))
    return kernel.code(f"dnnl_matmul_primitive_desc_create(&pd, byoc_engine, {row_md}, {x_md}, NULL, {dst_md}, NULL)")


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
    """One element-wise op, or a GELU, HardSwish or HardSigmoid composite as one op."""
    kernel = Kernel(call)
    node = call.nodes[0]
    x = next(b for b in call.arg_buffers[0] if b is not None and b.kind != "constant")
    out = call.outputs[0]
    if call.pattern in GELU_FORMS:
        algorithm, alpha, beta = GELU_FORMS[call.pattern], "0.f", "0.f"
    elif call.pattern == "hard_swish":  # x * max(0, min(1, x / 6 + 1 / 2))
        algorithm, alpha, beta = "dnnl_eltwise_hardswish", c_float(1.0 / 6.0), c_float(0.5)
    elif call.pattern == "hard_sigmoid":  # max(0, min(1, alpha * x + beta))
        alpha, beta = (c_float(_constant_operand(call, call.node(op))) for op in ("relax.multiply", "relax.add"))
        algorithm = "dnnl_eltwise_hardsigmoid"
    else:
        algorithm, alpha, beta = eltwise_args(call, node)
    kernel.direct("DNNL_ARG_SRC", f"{x.name}_mem")
    kernel.result(out)
    create = (
        f"dnnl_eltwise_forward_primitive_desc_create(&pd, byoc_engine, dnnl_forward_inference, {algorithm}, "
        f"{kernel.md_of(x)}, {kernel.md_of(x)}, {alpha}, {beta}, NULL)"
    )
    return kernel.code(create)


def _constant_operand(call: KernelCall, node: dict) -> float:
    """The value of a binary node's scalar constant operand, on either side (patterns match
    commutative ops both ways round)."""
    return scalar_of(call, node, next(i for i, arg in enumerate(node["args"]) if "const" in arg))


def binary(call: KernelCall) -> KernelCode:
    """add/subtract/multiply/divide with numpy broadcasting of the second operand; c / x and
    c - x with a scalar constant c are element-wise ops. A quantize after it (see byoc.annotate.qdq) is a
    linear post-op and an int8 result, which the conversion rounds and saturates."""
    node = call.nodes[0]
    a, b, out = call.arg(node, 0), call.arg(node, 1), call.outputs[0]
    if a.kind == "constant" and a.size == 1 and b.shape == out.shape and node["op"] in ("relax.divide", "relax.subtract"):
        return eltwise(call)
    if a.shape != out.shape:  # only commutative ops get here this way round (see the predicate)
        a, b = b, a
    group = _broadcast_group(a, b, out) if result_quantize(call) is None else None
    if group is not None:
        return _grouped(call, a, b, out, group)
    kernel = Kernel(call)
    kernel.source("DNNL_ARG_SRC_0", a, "dnnl_query_src_md")
    if b.shape == a.shape:
        # oneDNN's JIT kernel wants both operands in one layout (else its reference code runs,
        # 100x slower): the second is reordered into the first's where their producers differ.
        src1_md = kernel.md_of(a)
        kernel.source("DNNL_ARG_SRC_1", b, "dnnl_query_src_md", index=1)
    else:
        src1_memory, src1_md = f"{b.name}_mem", kernel.md_of(b)
        if b.kind != "constant" and len(b.shape) == len(out.shape):
            # oneDNN's JIT kernel broadcasts a plain operand only: a squeeze-and-excitation's
            # scales (1x104x1x1) from a convolution came in its blocked layout, and RegNet's
            # products ran in reference code (41 ms of 47). Reordered per call, they are tiny.
            src1_memory, src1_md = kernel.plain_source(b), kernel.md(b.shape, "plain", b.dtype)
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


def _broadcast_group(a: CBuffer, b: CBuffer, out: CBuffer) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Where `b` repeats `a` along one run of axes and equals it on the others, at 3 or 5
    dimensions (4 take their own path, per channel in NCHW or NHWC): the shapes to see `a` and
    `b` as, so that oneDNN's JIT kernel broadcasts (per channel, or per image and position). As
    they are, oneDNN 3.2 broadcasts over a leading axis (an image's per-channel mean, 3x1x1 against
    3x320x320: 81 ms of SSDlite's 100) or a middle one of 5 (Swin's position bias, 1x16x1x64x64
    against 1x16x6x64x64: 95 ms) only in its reference code. None otherwise."""
    full = (1,) * (len(out.shape) - len(b.shape)) + tuple(b.shape)
    if a.shape != out.shape or full == tuple(out.shape) or len(out.shape) not in (3, 5):
        return None
    differ = [i for i, (d, o) in enumerate(zip(full, out.shape)) if d != o]
    first, last = differ[0], differ[-1]
    if any(full[i] != 1 for i in differ) or differ != list(range(first, last + 1)):
        return None
    size = tuple(out.shape)
    outer, middle, inner = math.prod(size[:first]), math.prod(size[first:last + 1]), math.prod(size[last + 1:])
    if inner == 1:  # varies along the leading axes: per channel
        return (1, outer, middle), (1, outer, 1)
    return (outer, middle, inner), (outer, 1, inner)  # per image and position


def _grouped(call: KernelCall, a: CBuffer, b: CBuffer, out: CBuffer, shapes: tuple[tuple[int, ...], tuple[int, ...]]) -> KernelCode:
    """A binary op over `a` and `b` seen in the shapes `_broadcast_group` chose (plain views)."""
    kernel = Kernel(call)
    md, operand_md = kernel.md(shapes[0], "plain"), kernel.md(shapes[1], "plain")
    kernel.direct("DNNL_ARG_SRC_0", kernel.rows_view(a, md))
    kernel.direct("DNNL_ARG_SRC_1", kernel.rows_view(b, operand_md))
    kernel.direct("DNNL_ARG_DST", kernel.result_view(out, md))
    algorithm = BINARY[call.nodes[0]["op"]]
    return kernel.code(f"dnnl_binary_primitive_desc_create(&pd, byoc_engine, {algorithm}, {md}, {operand_md}, {md}, NULL)")


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
