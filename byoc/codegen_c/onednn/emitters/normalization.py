"""Emitters of softmax, layer and RMS normalisation, and rotary embeddings."""

from __future__ import annotations

import math

import numpy as np

from byoc.codegen_c.kernel_call import CBuffer, KernelCall, KernelCode
from byoc.codegen_c.onednn.emitters.movement import dense_strides
from byoc.codegen_c.onednn.emitters.shared import SMALL_ROWS, chosen_when_made, executed, reorder_with_attributes
from byoc.codegen_c.onednn.kernel import Kernel, c_float, in_sequence, scalar_of
from byoc.codegen_c.onednn.kernel_scales import dequantized_source, result_quantize, scales_of
from byoc.codegen_c.symbolic_shapes import names_of


def softmax(call: KernelCall) -> KernelCode:
    """Softmax; in the `softmax_nan_to_zero` composite, NaN (from a row masked whole, where
    oneDNN computes -inf - -inf) then becomes 0, as torch's exported attention asks. A quantize
    after it (zero point 0: see byoc.annotate.qdq) is the primitive's result scale and an int8 result."""
    kernel = Kernel(call)
    # The softmax itself: a composite's first node may be another (torch.export's guard of rows
    # masked whole compares the scores with -inf first; CoAtNet's region failed on it)
    node = call.node("relax.nn.softmax")
    x, out = call.arg(node, 0), call.outputs[0]
    axis = node["attrs"]["axis"] % len(x.shape)
    quantize = result_quantize(call)
    if quantize is None:
        # In plain layout: oneDNN 3.2's softmax over a convolution's channel-blocked result
        # (aBcd16b) is reference code, 1 ms each in EfficientFormer V2's attention. Over another
        # axis than the last, in the layout where that axis is innermost: over a middle axis of
        # plain data it is reference code too (YOLOv8's box distributions, 16 bins on axis 1 of
        # 1x16x4x8400: 37 ms of a 55 ms model; ResNeSt's radix splits).
        src_md = kernel.md(x.shape, "plain", x.dtype)
        if axis != len(x.shape) - 1 and all(isinstance(d, int) for d in x.shape):
            src_md = kernel.strided_md(x.shape, _innermost(x.shape, axis), x.dtype)
        source = kernel.plain_source(x, src_md)
    else:
        source, src_md = f"{x.name}_mem", kernel.md_of(x)
    kernel.direct("DNNL_ARG_SRC", source)
    kernel.result(out)
    kernel.after[0:0] = _rows_masked_whole(kernel, call, x, kernel.exec_args[-1][1])
    attr, dst_md = "NULL", src_md
    if quantize is not None:
        attr, dst_md = kernel.post_ops([], [], len(out.shape)), kernel.like_md(x, out.dtype)
        kernel.scales(attr, "DNNL_ARG_DST", scales_of(call, quantize), 0, zero_point=False)
    create = (
        f"dnnl_softmax_forward_primitive_desc_create(&pd, byoc_engine, dnnl_forward_inference, dnnl_softmax_accurate, "
        f"{src_md}, {dst_md}, {axis}, {attr})"
    )
    code = kernel.code(create, attrs=(attr,) if quantize is not None else ())
    if quantize is not None or axis != len(x.shape) - 1 or not names_of(x.shape) or {x.dtype, out.dtype} != {"float32"}:
        return code
    return chosen_when_made(f"{call.name}in_loops", _softmax_in_loops(call, x, out), code,
                   f"!byoc_settled && byoc_small_rows({kernel.md_of(x)}, {SMALL_ROWS}) > 0")


def _innermost(shape: tuple[int, ...], axis: int) -> list[int]:
    """Dense strides of `shape` with `axis` innermost and the other axes in their order."""
    strides, step = [0] * len(shape), shape[axis]
    strides[axis] = 1
    for other in reversed([a for a in range(len(shape)) if a != axis]):
        strides[other] = step
        step *= shape[other]
    return strides


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


def group_norm(call: KernelCall) -> KernelCode:
    """Group normalisation, channels on axis 1: a layer norm of each group's values (x's rows
    seen as batch x groups by channels / groups x spatial), then the scale and shift per channel
    as one binary primitive with the shift a post-op. oneDNN 3.2 has no group normalisation
    (3.3 does); torch.export writes GroupNorm as this op (MobileViT v2: 21 of them, each a cut
    between regions before)."""
    node = call.nodes[0]
    x, gamma, beta, out = call.arg(node, 0), call.arg(node, 1), call.arg(node, 2), call.outputs[0]
    attrs = node["attrs"]
    groups = int(attrs["num_groups"])
    rows, width = x.shape[0] * groups, math.prod(x.shape[1:]) // groups
    norm = Kernel(call, "norm")
    rows_md = norm.md((rows, width), "plain")
    norm.direct("DNNL_ARG_SRC", norm.rows_view(x, rows_md))
    create = (f"dnnl_layer_normalization_forward_primitive_desc_create(&pd, byoc_engine, dnnl_forward_inference, {rows_md}, "
              f"{rows_md}, NULL, {c_float(attrs['epsilon'])}, 0, NULL)")
    scale, shift = bool(attrs["scale"]), bool(attrs["center"])
    if not (scale or shift):
        norm.direct("DNNL_ARG_DST", norm.result_view(out, rows_md))
        return norm.code(create)
    normalized = f"{call.name}_normalized"
    norm.state.append(f"static dnnl_memory_t {normalized} = NULL;")
    norm.setup.append(norm.check(f"dnnl_memory_create(&{normalized}, {rows_md}, byoc_engine, DNNL_MEMORY_ALLOCATE)", "normalized values"))
    norm.direct("DNNL_ARG_DST", normalized)
    affine = Kernel(call, "affine")
    rank = len(out.shape)
    channel_shape = (1, out.shape[1]) + (1,) * (rank - 2)
    out_md, channel_md = affine.md(out.shape, "plain"), affine.md(channel_shape, "plain")
    grid = f"{call.name}_grid"  # the normalized values seen with x's shape
    affine.state.append(f"static dnnl_memory_t {grid} = NULL;")
    affine.setup += ["{", "  void* data = NULL;", "  " + affine.check(f"dnnl_memory_get_data_handle({normalized}, &data)", "normalized values"),
                     "  " + affine.check(f"dnnl_memory_create(&{grid}, {out_md}, byoc_engine, data)", "normalized values"), "}"]
    post = [{"op": "relax.add", "operand": (affine.view(beta, channel_shape), channel_md)}] if scale and shift else []
    attr = affine.post_ops(post, [], rank)
    affine.direct("DNNL_ARG_SRC_0", grid)
    affine.direct("DNNL_ARG_SRC_1", affine.view(gamma if scale else beta, channel_shape))
    affine.result(out, md=out_md)
    algorithm = "dnnl_binary_mul" if scale else "dnnl_binary_add"
    return in_sequence([norm.code(create), affine.code(
        f"dnnl_binary_primitive_desc_create(&pd, byoc_engine, {algorithm}, {out_md}, {channel_md}, {out_md}, {attr})", (attr,))])


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
        half_md = kernel.strided_md(x.shape[:-1] + (half,), dense_strides(x.shape), x.dtype)
        name = kernel.k
        kernel.state.append(f"static dnnl_memory_t {name}_read = NULL, {name}_write = NULL; static dnnl_primitive_t {name}_copy = NULL;")
        kernel.setup += [kernel.check(f"dnnl_memory_create(&{name}_{side}, {half_md}, byoc_engine, DNNL_MEMORY_NONE)", "half view")
                         for side in ("read", "write")]
        kernel.setup += reorder_with_attributes(kernel, f"{name}_copy", half_md, half_md, [("scales", "DNNL_ARG_SRC")], "scaled half",
                                                 mask=(1 << (len(x.shape) - 2)) | (1 << (len(x.shape) - 1)))
        scale = kernel.array("scale", np.ascontiguousarray(scales), "float32")
        kernel.point(f"{name}_read", source, read_at * np.dtype(x.dtype).itemsize)
        kernel.point(f"{name}_write", f"{k}_rotated", write_at * np.dtype(x.dtype).itemsize)
        kernel.before += executed(kernel, f"{name}_copy", [("DNNL_ARG_FROM", f"{name}_read"), ("DNNL_ARG_TO", f"{name}_write"),
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
