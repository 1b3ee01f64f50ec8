"""What the oneDNN emitters share: a fused kernel's bias and post-ops read off its nodes, the layout
policy, kernels chosen when they are made (`chosen`), element-wise loops of byoc's own, reorders run
with scales given at run time, and transposed layouts."""

from __future__ import annotations

from byoc.codegen_c.kernel_call import CBuffer, KernelCall, KernelCode
from byoc.codegen_c.onednn.kernel import BINARY, Kernel, post_op, zero_point_offset
from byoc.codegen_c.onednn.kernel_scales import Scales, dequantized, scales_of
from byoc.codegen_c.onednn.settings import onednn_settings
from byoc.codegen_c.symbolic_shapes import read_shape

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


def fused_tail(call: KernelCall, root: dict, takes_bias=lambda bias: True) -> tuple[CBuffer | None, list[dict], list[tuple[CBuffer, int]]]:
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


def follow_layouts(call: KernelCall) -> bool:
    """Whether a convolution takes its input in the layout its producer chose ("follow"), or
    lets oneDNN choose the layout it runs fastest in, at the cost of a reorder where the two
    differ ("choose").

    Measured on a 2-core AVX2 machine: with "choose", deep 3x3 convolutions pick brgconv on
    NHWC (ResNet-18: 19.3 ms of convolutions plus 0.36 ms of reorders, against 21.9 ms with
    "follow"); depthwise-separable networks run best in the blocked layout of the first
    convolution (MobileNetV2: 4.1 ms against 4.8 ms). "auto" follows in regions that hold a
    grouped convolution and chooses elsewhere.
    """
    policy = onednn_settings(call.settings).layout
    if policy != "auto":
        return policy == "follow"
    return any(n["op"] == "relax.nn.conv2d" and n["attrs"]["groups"] > 1 for n in call.graph.get("nodes", ()))


# Attention's scores over a decoder's cache have a new size at every step, and oneDNN's binary
# (the mask) and softmax primitives are made for one size: 30-37 us each to make (GPT-2 tiny's
# first layer, every new length), where its whole step runs in 100. Up to this many values, in a
# dense row-major layout and before the sizes settle (`byoc_settled`), the mask's sum and the
# softmax run as loops of byoc's own (`byoc_broadcast_rows`, `byoc_softmax_rows`): at most about
# 15 us at this size, nothing to make.
SMALL_ROWS = 4096


SMALL_ROWS = 4096
LOOP_BINARY = {"relax.add": 0, "relax.subtract": 1, "relax.multiply": 2, "relax.divide": 3}


def chosen_when_made(flag: str, first: KernelCode, otherwise: KernelCode, condition: str, reads_settled: bool = True) -> KernelCode:
    """`first` where the C `condition` holds when the kernel is made (for the dimensions then),
    else `otherwise`; which one is kept in `flag`. The condition reads `byoc_settled`, or may
    (`reads_settled`)."""
    return KernelCode(state="\n".join([otherwise.state, first.state, f"static int {flag} = 0;"]),
                      init="\n".join([f"{flag} = {condition};", f"if ({flag}) {{", first.init, "} else {", otherwise.init, "}"]),
                      run="\n".join([f"if ({flag}) {{", first.run, "} else {", otherwise.run, "}"]), reads_settled=reads_settled)


def in_loops(kernel: Kernel, result: str, operand: CBuffer, op: str) -> KernelCode:
    """`result op= operand` in place by `byoc_broadcast_rows`, no primitive made."""
    loops = Kernel(kernel.call, "loops")
    loops.state = []
    loops.before.append(f"byoc_broadcast_rows({result}, {operand.name}_mem, {LOOP_BINARY[op]}, 1);")
    return loops.code_without_primitive()


def reorder_with_attributes(kernel: Kernel, primitive: str, source_md: str, target_md: str, given: list[tuple[str, str]], what: str,
                             mask: int = 0) -> list[str]:
    """Initialisation of reorder `primitive` from `source_md` to `target_md` whose scales or zero
    points (`given`: ("scales", "DNNL_ARG_DST"), ...; one value each, or one per index of the
    dimensions in `mask`) are given per call."""
    lines = ["dnnl_primitive_attr_t attr;", "dnnl_primitive_desc_t reorder = NULL;", kernel.check("dnnl_primitive_attr_create(&attr)", "attribute")]
    lines += [kernel.check(f"dnnl_primitive_attr_set_{kind}_mask(attr, {arg}, {mask})", kind.replace("_", " ")) for kind, arg in given]
    lines += [kernel.check(f"dnnl_reorder_primitive_desc_create(&reorder, {source_md}, byoc_engine, {target_md}, byoc_engine, attr)", what),
              kernel.check(f"byoc_primitive(&{primitive}, reorder)", what), "dnnl_primitive_attr_destroy(attr);"]
    return ["{", *("  " + line for line in lines), "}"]


def executed(kernel: Kernel, primitive: str, args: list[tuple[str, str]], what: str) -> list[str]:
    """The lines that run `primitive` once with `args` ((argument, memory) pairs): a reorder
    whose scales or zero points are given per call (`reorder_with_attributes`)."""
    listed = ", ".join(f"{{{arg}, {memory}}}" for arg, memory in args)
    return ["{", f"  dnnl_exec_arg_t args[{len(args)}] = {{{listed}}};",
            "  " + kernel.check(f"byoc_execute({primitive}, {len(args)}, args)", what), "}"]


def permutation(node: dict, rank: int) -> list[int]:
    """Axis j of a transpose's result is axis order[j] of its input."""
    axes = node["attrs"]["axes"]
    return list(range(rank))[::-1] if axes is None else [int(a) for a in axes]


def permuted_md(kernel: Kernel, md: str, order: list[int]) -> str:
    """A local descriptor: `md` with its axes moved, axis i to position order[i]."""
    name = kernel.local_md("perm")
    kernel.setup += [f"int {name}_axes[{len(order)}] = {{{', '.join(str(a) for a in order)}}};",
                     kernel.check(f"dnnl_memory_desc_permute_axes(&{name}, {md}, {name}_axes)", "transpose view")]
    return name


def transposed_layout(kernel: Kernel, shape: tuple[int, ...], order: list[int], dtype: str) -> str:
    """The descriptor, with a transpose's input dims, of where each input element lands in its
    result of `shape` (plain): the result's plain layout with axis j moved to order[j]."""
    return permuted_md(kernel, kernel.md(shape, "plain", dtype), order)


def read_by_products(call: KernelCall, node: dict) -> bool:
    """Whether every reader of `node`'s result is a matrix product, or an operand's scaling fused
    into one (`_unscaled`): these take an operand in the layout it comes in."""
    def product(reader: dict) -> bool:
        composite = reader.get("composite")
        return reader["op"] == "relax.matmul" or reader["op"] == "relax.multiply" and composite is not None and any(
            r["op"] == "relax.matmul" and (r.get("composite") or {}).get("id") == composite["id"] for r in call.readers_of(reader))

    readers = call.readers_of(node)
    return bool(readers) and all(product(r) for r in readers)


def transposed_result(kernel: Kernel, call: KernelCall) -> str | None:
    """For a product whose only reader is a transpose (attention's heads back in place): the
    descriptor that writes the product where the transpose would put it, so that the transpose
    is a view. None otherwise."""
    out = call.outputs[0]
    readers = call.readers_of(call.nodes[-1])
    if out.kind != "intermediate" or len(readers) != 1 or readers[0]["op"] != "relax.permute_dims" or readers[0].get("composite"):
        return None
    transposed = read_shape(readers[0]["outputs"][0]["shape"])
    return transposed_layout(kernel, transposed, permutation(readers[0], len(out.shape)), out.dtype)
