"""Emitters of ops that move data: concatenations, splits, slices, broadcasts, padding, gathers by a
constant index, reshapes and transposes (views where their readers allow), and reorders."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from byoc.codegen_c.kernel_call import CBuffer, KernelCall, KernelCode
from byoc.codegen_c.onednn.emitters.shared import permutation, permuted_md, read_by_products, transposed_layout
from byoc.codegen_c.onednn.kernel import Kernel, c_float, scalar_of
from byoc.codegen_c.onednn.kernel_scales import scales_of
from byoc.codegen_c.onednn.library import dims_decl


def concat(call: KernelCall) -> KernelCode:
    """A concatenation of its inputs in the layouts their producers left them in; where those
    differ (YOLO's: two plain, one channels-last) and oneDNN has only reference code for them,
    of its inputs in plain layout instead, reordered per call where they are not."""
    kernel = Kernel(call)
    node = call.nodes[0]
    sources = call.arg_buffers[0][0]
    out = call.outputs[0]
    axis = node["attrs"]["axis"] % len(out.shape)
    k = kernel.k
    plain = [kernel.md(s.shape, "plain", s.dtype) for s in sources]
    kernel.setup += [f"const_dnnl_memory_desc_t {k}_srcs[{len(sources)}] = {{{', '.join(kernel.md_of(s) for s in sources)}}};",
                     f"const_dnnl_memory_desc_t {k}_plain[{len(sources)}] = {{{', '.join(plain)}}};"]
    dst_md = kernel.md(out.shape)
    for index, source in enumerate(sources):
        kernel.source(f"DNNL_ARG_MULTIPLE_SRC + {index}", source, "dnnl_query_src_md", index)
    kernel.result(out)

    def create(pd: str, srcs: str) -> str:
        return f"dnnl_concat_primitive_desc_create(&{pd}, byoc_engine, {dst_md}, {len(sources)}, {axis}, {srcs}, NULL)"

    return kernel.code(create("pd", f"{k}_srcs"), retry=(create("retry_pd", f"{k}_plain"),))


def _strided_copies(call: KernelCall, x: CBuffer, parts: list[tuple[CBuffer, tuple[int, ...], list[int], int]]) -> KernelCode:
    """Each part as a reorder from a view of `x`'s plain data: per part, its buffer, the view's
    shape (the part's, or that shape with a unit axis kept), its element strides into `x` (0:
    broadcast; a multiple of the dense stride: every k-th element) and its first element."""
    kernel = Kernel(call)
    kernel.state = []  # no primitive of its own: one reorder per part
    source = kernel.plain_source(x)
    for index, (part, shape, strides, offset) in enumerate(parts):
        if _overlapping_for_onednn(shape, strides):
            _loop_copy(kernel, source, part, shape, strides, offset * np.dtype(x.dtype).itemsize)
            continue
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


def _overlapping_for_onednn(shape: tuple, strides: list) -> bool:
    """Whether oneDNN refuses a view of `shape` at `strides` as overlapping itself: it takes an
    axis to span its size times its stride, so every second column of 7 (4 of them, stride 2)
    spans 8 and passes the next row's start, though its last element is the row's 7th. LeViT
    subsamples so; its whole region fell back to the host."""
    if not all(isinstance(v, int) for v in (*shape, *strides)):
        return False  # symbolic: oneDNN's reorder, as before
    axes = sorted((s, d) for d, s in zip(shape, strides) if d != 1 and s != 0)
    return any(outer < inner * size for (inner, size), (outer, _) in zip(axes, axes[1:]))


def _loop_copy(kernel: Kernel, source: str, part: CBuffer, shape: tuple[int, ...], strides: list[int], offset: int) -> None:
    """A part copied by byoc_strided_copy (see library.PROLOGUE) where oneDNN refuses its view."""
    result = kernel.result_view(part, kernel.md(shape, "plain", part.dtype))
    kernel.before += [
        "{",
        "  char* from = NULL; char* to = NULL;",
        "  " + kernel.check(f"dnnl_memory_get_data_handle({source}, (void**)&from)", "strided window"),
        "  " + kernel.check(f"dnnl_memory_get_data_handle({result}, (void**)&to)", "strided window"),
        "  " + dims_decl("shape", shape),
        "  " + dims_decl("strides", tuple(strides)),
        f"  byoc_strided_copy(to, from + {offset}, {len(shape)}, shape, strides, {np.dtype(part.dtype).itemsize});",
        "}",
    ]


def _window(shape: tuple[int, ...], offsets: tuple[int, ...]) -> tuple[list[int], int]:
    """The strides and first element of a window of a plain tensor of `shape` at `offsets`."""
    dense = dense_strides(shape)
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


def dense_strides(shape: tuple[int, ...]) -> list[int]:
    return [math.prod(shape[a + 1 :]) for a in range(len(shape))]


def strided_slice(call: KernelCall) -> KernelCode:
    """A window of the input taking every step-th element (steps of 1: the halves of each head
    that rotary embeddings swap; 2: Swin's patch merging)."""
    node = call.nodes[0]
    x = call.arg(node, 0)
    axes, begin, _, *steps = ([item["prim"] for item in arg["tuple"]] for arg in node["args"][1:])
    dense = dense_strides(x.shape)
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
    return _strided_copies(call, x, [(out, out.shape, [0 if d != o else s for d, o, s in zip(shape, out.shape, dense_strides(shape))], 0)])


def repeat(call: KernelCall) -> KernelCode:
    """Each element repeated along an axis (the input channels of a convolution with a channel
    multiplier, see byoc.vendors.dnnl.channel_multiplier): the input read with stride 0 along a
    new axis after it."""
    node = call.nodes[0]
    x, out = call.arg(node, 0), call.outputs[0]
    axis = node["attrs"]["axis"] % len(x.shape)
    dense = dense_strides(x.shape)
    view = (*x.shape[: axis + 1], node["attrs"]["repeats"], *x.shape[axis + 1 :])
    return _strided_copies(call, x, [(out, view, [*dense[: axis + 1], 0, *dense[axis + 1 :]], 0)])


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


def permute_dims(call: KernelCall) -> KernelCode:
    """A transpose: a view of the input's data where the input was written in the layout the
    transpose undoes (a product writing attention's heads back in place), or where every reader
    is a product, whose JIT kernel reads an operand in any layout (attention's queries, keys and
    values); else a reorder."""
    node = call.nodes[0]
    order = permutation(node, len(call.arg(node, 0).shape))
    inverse = [order.index(a) for a in range(len(order))]
    products_only = "1" if read_by_products(call, node) else "0"

    def view(kernel: Kernel, x: CBuffer, out: CBuffer, _transposed: str) -> tuple[str, str]:
        seen, plain = permuted_md(kernel, kernel.md_of(x), inverse), kernel.md(out.shape, "plain", out.dtype)
        # Where the transpose moves unit axes only, the data is in plain layout and is described so: with the
        # moved axes' strides kept, oneDNN 3.2's binary misread its broadcast operand (a decoding step's
        # queries times the rotary table, at one new token: values of 1e24).
        same = f"dnnl_memory_desc_equal({seen}, {plain})"
        return f"{products_only} || {same}", f"({same} ? {plain} : {seen})"

    return _relayout(call, lambda kernel, x, out: transposed_layout(kernel, out.shape, order, out.dtype), view=view)


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
