"""C emitters for oneDNN primitives: one per kernel kind, each a call sequence of the oneDNN C
API (v3). Primitives, and weights reordered into the layout the primitive chose, are created once
at initialisation; a call only sets data handles and executes."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from byoc.codegen_c.dims import SymbolicDim, names_of, read_shape
from byoc.codegen_c.library import CBuffer, KernelCall, KernelCode
from byoc.vendors.dnnl.library import dims_decl, rank
from byoc.vendors.dnnl.quantization import (
    DNNL_TYPES,
    KernelQuantization,
    Scales,
    dequantized,
    dequantized_source,
    kernel_quantization,
    result_quantize,
    scales_of,
)

_ELTWISE = {
    "relax.nn.relu": ("dnnl_eltwise_relu", "0.f", "0.f"),
    "relax.sigmoid": ("dnnl_eltwise_logistic", "0.f", "0.f"),
    "relax.tanh": ("dnnl_eltwise_tanh", "0.f", "0.f"),
    "relax.exp": ("dnnl_eltwise_exp", "0.f", "0.f"),
    "relax.sqrt": ("dnnl_eltwise_sqrt", "0.f", "0.f"),
    "relax.rsqrt": ("dnnl_eltwise_pow", "1.f", "-0.5f"),  # 1 * x^-0.5: torch's RMSNorm as torch.export writes it
    "relax.nn.gelu": ("dnnl_eltwise_gelu_erf", "0.f", "0.f"),
    "relax.nn.gelu_tanh": ("dnnl_eltwise_gelu_tanh", "0.f", "0.f"),
    "relax.negative": ("dnnl_eltwise_linear", "-1.f", "0.f"),  # rotary embeddings' -x2 (Llama's rotate_half)
}
ELTWISE_OPS = (*_ELTWISE, "relax.clip")
# GELU composites (the forms exporters write, see the backend's patterns), each fused as one
# element-wise op or post-op: pattern name -> oneDNN algorithm.
GELU_FORMS = {"gelu": "dnnl_eltwise_gelu_erf", "gelu_erf_half_last": "dnnl_eltwise_gelu_erf", "gelu_tanh": "dnnl_eltwise_gelu_tanh"}
# Reshapes: views of their input's data where it is plain (`reshape`); transposes too, where
# their readers take any layout (`permute_dims`).
RESHAPES = ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten")
VIEWS = (*RESHAPES, "relax.permute_dims")
_BINARY = {"relax.add": "dnnl_binary_add", "relax.subtract": "dnnl_binary_sub", "relax.multiply": "dnnl_binary_mul", "relax.divide": "dnnl_binary_div"}


def _float(value: float) -> str:
    """A C float literal of `value`, which may be an int: TVM's ONNX importer writes the clip of
    HardSigmoid with integer bounds, and `0f` is no C literal."""
    value = float(value)
    if math.isinf(value):
        return "INFINITY" if value > 0 else "-INFINITY"
    return f"{value!r}f"


def _c_text(text: str) -> str:
    """`text` escaped for a C string literal."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def eltwise_args(call: KernelCall, node: dict) -> tuple[str, str, str]:
    """(algorithm, alpha, beta) of an element-wise node: one of `ELTWISE_OPS`, x ** c, or a
    scalar constant c as first operand (c / x, c - x)."""
    if "algorithm" in node:  # a GELU composite fused after a matmul, a rescaling around a quantized residual
        return node["algorithm"], node.get("alpha", "0.f"), node.get("beta", "0.f")
    op = node["op"]
    if op == "relax.clip":
        low, high = (node["args"][i]["prim"] for i in (1, 2))
        return "dnnl_eltwise_clip_v2", _float(low), _float(high)
    if op == "relax.power":
        return "dnnl_eltwise_pow", "1.f", _float(_scalar(call, node, 1))
    if op == "relax.divide":
        return "dnnl_eltwise_pow", _float(_scalar(call, node, 0)), "-1.f"
    if op == "relax.subtract":
        return "dnnl_eltwise_linear", "-1.f", _float(_scalar(call, node, 0))
    return _ELTWISE[op]


def _scalar(call: KernelCall, node: dict, index: int) -> float:
    return float(call.constants[call.arg(node, index).name].reshape(()))


class _Kernel:
    """Assembles one kernel: memory descriptors, the primitive descriptor, the layout
    conversions it implies, the primitive, and its execution."""

    def __init__(self, call: KernelCall, part: str = "") -> None:
        self.call = call
        self.k = f"{call.name}_{part}" if part else call.name  # `part`: one of several primitives of a kernel
        self.where = f"{call.where()} ({call.nodes[0]['op']})"
        self.state = [f"static dnnl_primitive_t {self.k}_prim = NULL;"]
        self.setup: list[str] = []  # before the primitive descriptor exists
        self.bind: list[str] = []  # after it exists, before the primitive is created
        self.before: list[str] = []
        self.after: list[str] = []
        self.exec_args: list[tuple[str, str]] = []
        self.local_mds: list[str] = []
        self.count = 0

    def _name(self, kind: str) -> str:
        self.count += 1
        return f"{self.k}_{kind}{self.count}"

    def check(self, call: str, what: str) -> str:
        # The kernel's location is written once (`state_code`), not into every check's text:
        # BERT's 644 kernels made 1 MB of C in error messages.
        return f'DNNL_CHECK_AT({call}, {self.k}_where, "{what}");'

    def state_code(self) -> str:
        return "\n".join([f'static const char {self.k}_where[] = "{_c_text(self.where)}";', *self.state])

    # ------------------------------------------------------ memory descriptors
    def md(self, shape: tuple[int, ...], tag: str = "any", dtype: str = "float32") -> str:
        """A local memory descriptor of `shape`: any layout, plain, or a oneDNN format tag ("acdb")."""
        name = self._name("md")
        self.local_mds.append(name)
        self.setup.append(f"dnnl_memory_desc_t {name};")
        self.setup.append("{")
        self.setup.append("  " + dims_decl("shape", shape))
        if tag == "plain":
            self.setup.append("  " + self.check(f"byoc_plain_md(&{name}, {rank(shape)}, shape, {DNNL_TYPES[dtype]})", f"descriptor {shape}"))
        else:
            format_tag = "dnnl_format_tag_any" if tag == "any" else f"dnnl_{tag}"
            create = f"dnnl_memory_desc_create_with_tag(&{name}, {rank(shape)}, shape, {DNNL_TYPES[dtype]}, {format_tag})"
            self.setup.append("  " + self.check(create, f"descriptor {shape}"))
        self.setup.append("}")
        return name

    @staticmethod
    def md_of(buffer: CBuffer) -> str:
        return f"byoc_md({buffer.name}_mem)"

    def like_md(self, buffer: CBuffer, dtype: str) -> str:
        """A local descriptor of `buffer`'s dims and layout with data type `dtype` (`byoc_like_md`)."""
        name = self._name("md")
        self.local_mds.append(name)
        self.setup.append(f"dnnl_memory_desc_t {name};")
        self.setup.append(self.check(f"byoc_like_md(&{name}, {self.md_of(buffer)}, {DNNL_TYPES[dtype]})", f"{dtype} descriptor"))
        return name

    def view(self, buffer: CBuffer, shape: tuple[int, ...]) -> str:
        """A memory over a constant's data with another (plain) shape, e.g. a bias [1, C, 1, 1]
        seen as [C]. Returns the memory's C name."""
        name = self._name("view")
        md = self.md(shape, "plain", buffer.dtype)
        self.state.append(f"static dnnl_memory_t {name} = NULL;")
        self.setup.append(self.check(f"dnnl_memory_create(&{name}, {md}, byoc_engine, {buffer.name})", f"view of {buffer.name}"))
        return name

    # ------------------------------------------------------------- arguments
    def source(self, arg: str, buffer: CBuffer, query: str, index: int = 0) -> None:
        """An input in the layout the primitive chose, reordered per call if it differs."""
        name = self._name("src")
        self.state.append(f"static byoc_conversion {name};")
        wanted = f"dnnl_primitive_desc_query_md(pd, {query}, {index})"
        self.bind.append(self.check(f"byoc_conversion_init(&{name}, {buffer.name}_mem, {wanted})", f"layout of {buffer.name}"))
        self.before.append(self.check(f"byoc_reorder({name}.reorder, {buffer.name}_mem, {name}.memory)", f"reorder of {buffer.name}"))
        self.exec_args.append((arg, f"{name}.memory"))

    def direct(self, arg: str, memory: str) -> None:
        self.exec_args.append((arg, memory))

    def weights(self, arg: str, memory: str, query: str) -> None:
        """Constant weights, reordered once at initialisation into the primitive's layout."""
        name = self._name("weights")
        self.state.append(f"static byoc_conversion {name};")
        self.bind.append(self.check(f"byoc_conversion_init(&{name}, {memory}, dnnl_primitive_desc_query_md(pd, {query}, 0))", "weights layout"))
        self.bind.append(self.check(f"byoc_reorder({name}.reorder, {memory}, {name}.memory)", "weights reorder"))
        self.bind.append(self.check("dnnl_stream_wait(byoc_stream)", "weights reorder"))
        self.exec_args.append((arg, f"{name}.memory"))

    def result(self, buffer: CBuffer, query: str = "dnnl_query_dst_md", md: str | None = None) -> None:
        """The result in the layout the primitive chose (its `query`), or in `md`."""
        name = self._name("dst")
        self.state.append(f"static byoc_conversion {name};")
        size = f"&{buffer.name}_bytes" if buffer.kind == "intermediate" else "NULL"
        produced = md or f"dnnl_primitive_desc_query_md(pd, {query}, 0)"
        self.bind.append(self.check(f"byoc_result_init(&{name}, &{buffer.name}_mem, {size}, {produced})", "result layout"))
        if buffer.kind != "intermediate":
            self.after.append(self.check(f"byoc_reorder({name}.reorder, {name}.memory, {buffer.name}_mem)", f"reorder into {buffer.name}"))
        self.exec_args.append(("DNNL_ARG_DST", f"{name}.memory"))

    def plain_source(self, buffer: CBuffer) -> str:
        """An input in plain layout: its own memory where its producer chose plain, else a copy
        reordered per call. Returns the memory."""
        name = self._name("plain")
        self.state.append(f"static byoc_conversion {name};")
        self.setup.append(self.check(f"byoc_conversion_init(&{name}, {buffer.name}_mem, {self.md(buffer.shape, 'plain', buffer.dtype)})",
                                     f"plain layout of {buffer.name}"))
        self.before.append(self.check(f"byoc_reorder({name}.reorder, {buffer.name}_mem, {name}.memory)", f"reorder of {buffer.name}"))
        return f"{name}.memory"

    def point(self, view: str, memory: str, offset: int = 0) -> None:
        """Per call, point memory `view` at the data of `memory` (bound per call), `offset`
        bytes in."""
        at = f"(char*)data + {offset}" if offset else "data"
        self.before += [
            "{",
            "  void* data = NULL;",
            "  " + self.check(f"dnnl_memory_get_data_handle({memory}, &data)", f"data of {memory}"),
            "  " + self.check(f"dnnl_memory_set_data_handle({view}, {at})", f"view {view}"),
            "}",
        ]

    def rows_view(self, buffer: CBuffer, view_md: str, offset: int = 0) -> str:
        """An input in plain layout, read through a view of its data described by `view_md` (its
        rows as a matrix; a strided window), starting `offset` bytes in. Returns the view's memory."""
        source = self.plain_source(buffer)
        name = self._name("rows")
        self.state.append(f"static dnnl_memory_t {name} = NULL;")
        self.setup.append(self.check(f"dnnl_memory_create(&{name}, {view_md}, byoc_engine, DNNL_MEMORY_NONE)", "input view"))
        self.point(name, source, offset)
        return name

    def strided_md(self, shape: tuple[int, ...], strides: list[int], dtype: str) -> str:
        """A local descriptor of `shape` with element `strides` (0: broadcast; a multiple of the
        dense stride: every k-th element)."""
        name = self._name("md")
        self.local_mds.append(name)
        self.setup += [f"dnnl_memory_desc_t {name};", "{", "  " + dims_decl("shape", shape),
                       "  " + dims_decl("strides", tuple(strides)),
                       "  " + self.check(f"dnnl_memory_desc_create_with_strides(&{name}, {rank(shape)}, shape, {DNNL_TYPES[dtype]}, "
                                         "strides)", "strided view"), "}"]
        return name

    def result_view(self, buffer: CBuffer, view_md: str) -> str:
        """The output in plain layout, written through a view of its data described by
        `view_md` (another shape of the same bytes: a reshape, a transpose, kept dimensions, a
        window). Returns the view's memory."""
        name = self._name("result")
        self.state += [f"static dnnl_memory_t {name}_view = NULL;", f"static byoc_conversion {name};"]
        size = f"&{buffer.name}_bytes" if buffer.kind == "intermediate" else "NULL"
        out_md = self.md(buffer.shape, "plain", buffer.dtype)
        self.setup.append(self.check(f"byoc_result_init(&{name}, &{buffer.name}_mem, {size}, {out_md})", "result layout"))
        self.setup.append(self.check(f"dnnl_memory_create(&{name}_view, {view_md}, byoc_engine, DNNL_MEMORY_NONE)", "output view"))
        self.point(f"{name}_view", f"{name}.memory")
        if buffer.kind != "intermediate":
            self.after.append(self.check(f"byoc_reorder({name}.reorder, {name}.memory, {buffer.name}_mem)", "reorder into output"))
        return f"{name}_view"

    def post_ops(self, nodes: list[dict], residual_arg: list[tuple[CBuffer, int]], rank: int, input_tag: str = "") -> str:
        """An attribute with element-wise and binary post-ops (a residual add, a constant scale
        broadcast over the `rank`-dimensional result, or one an emitter makes: its `algorithm` and
        its `operand`, a memory and its descriptor); returns its name. With `input_tag`, an
        operand that is a region input of the result's shape is reordered per call into that
        layout ("any": the one the primitive asks for)."""
        operands: dict[int, tuple[str, str]] = {}  # post-op index -> (memory, descriptor), made outside the block below
        for buffer, index in residual_arg:
            operands[index] = f"{buffer.name}_mem", self.md_of(buffer)
            if input_tag and buffer.kind == "input" and len(buffer.shape) == rank:
                name = self._name("operand")
                md = self.md(buffer.shape, input_tag)
                wanted = md if input_tag != "any" else \
                    f"dnnl_primitive_desc_query_md(pd, dnnl_query_exec_arg_md, DNNL_ARG_ATTR_MULTIPLE_POST_OP({index}) | DNNL_ARG_SRC_1)"
                self.state.append(f"static byoc_conversion {name};")
                self.bind.append(self.check(f"byoc_conversion_init(&{name}, {buffer.name}_mem, {wanted})", f"layout of {buffer.name}"))
                self.before.append(self.check(f"byoc_reorder({name}.reorder, {buffer.name}_mem, {name}.memory)", f"reorder of {buffer.name}"))
                operands[index] = f"{name}.memory", md
            if len(buffer.shape) < rank:
                shape = (1,) * (rank - len(buffer.shape)) + buffer.shape
                operands[index] = self.view(buffer, shape), self.md(shape, "plain")
        attr = self._name("attr")
        self.setup.append(f"dnnl_primitive_attr_t {attr};")
        self.setup.append(self.check(f"dnnl_primitive_attr_create(&{attr})", "attribute"))
        if nodes:
            self.setup.append("{")
            self.setup.append("  dnnl_post_ops_t ops;")
            self.setup.append("  " + self.check("dnnl_post_ops_create(&ops)", "post-ops"))
            for index, node in enumerate(nodes):
                if node["op"] in _BINARY or "operand" in node:  # an op of the graph, or one an emitter makes (memory, descriptor)
                    memory, md = node.get("operand") or operands[index]
                    algorithm = node.get("algorithm") or _BINARY[node["op"]]
                    self.setup.append("  " + self.check(f"dnnl_post_ops_append_binary(ops, {algorithm}, {md})", "binary post-op"))
                    self.exec_args.append((f"DNNL_ARG_ATTR_MULTIPLE_POST_OP({index}) | DNNL_ARG_SRC_1", memory))
                else:
                    algorithm, alpha, beta = eltwise_args(self.call, node)
                    self.setup.append("  " + self.check(f"dnnl_post_ops_append_eltwise(ops, {algorithm}, {alpha}, {beta})", "element-wise post-op"))
            self.setup.append("  " + self.check(f"dnnl_primitive_attr_set_post_ops({attr}, ops)", "post-ops"))
            self.setup.append("  dnnl_post_ops_destroy(ops);")
            self.setup.append("}")
        return attr

    # ---------------------------------------------------------- quantization
    def array(self, what: str, values: np.ndarray, dtype: str, md: str | None = None) -> str:
        """A memory over values fixed at code generation (scales, zero points), one-dimensional
        unless `md` describes it; returns its name."""
        name = self._name(what)
        ctype, literal = ("float", _float) if dtype == "float32" else ("int32_t", lambda v: str(int(v)))
        self.state.append(f"static {ctype} {name}_data[{values.size}] = {{{', '.join(literal(v) for v in values.reshape(-1))}}};")
        self.state.append(f"static dnnl_memory_t {name} = NULL;")
        md = md or self.md((values.size,), "plain", dtype)
        self.setup.append(self.check(f"dnnl_memory_create(&{name}, {md}, byoc_engine, {name}_data)", what))
        return name

    def scales(self, attr: str, arg: str, scales: Scales, mask: int, zero_point: bool = True) -> None:
        """The scale (and, with `zero_point`, a zero point other than 0) of argument `arg`
        ("DNNL_ARG_SRC"), set on `attr` with `mask` (0: one value; a bit per dimension the
        values run along)."""
        self.setup.append(self.check(f"dnnl_primitive_attr_set_scales_mask({attr}, {arg}, {mask})", "scales"))
        memory = f"{scales.scale_buffer.name}_mem" if scales.scale_buffer is not None else self.array("scale", scales.scale, "float32")
        self.exec_args.append((f"DNNL_ARG_ATTR_SCALES | {arg}", memory))
        if zero_point and scales.has_zero_point:
            self.setup.append(self.check(f"dnnl_primitive_attr_set_zero_points_mask({attr}, {arg}, 0)", "zero points"))
            self.exec_args.append((f"DNNL_ARG_ATTR_ZERO_POINTS | {arg}", self.array("zero", scales.zero_point[:1], "int32")))

    def quantization(self, attr: str, q: KernelQuantization, weight_mask: int) -> None:
        """The scales of an int8 kernel's source, weights and result, set on `attr`."""
        self.scales(attr, "DNNL_ARG_SRC", q.source_scales, 0)
        if q.weight_scales is not None:
            self.scales(attr, "DNNL_ARG_WEIGHTS", q.weight_scales, weight_mask if q.weight_scales.per_channel else 0)
        if q.output_scales is not None:
            self.scales(attr, "DNNL_ARG_DST", q.output_scales, 0)

    # ------------------------------------------------------------------ code
    def code_without_primitive(self) -> KernelCode:
        """The code of a kernel that runs primitives it makes itself (copies), none of `code`'s."""
        init = ["{", *("  " + line for line in self.setup), *(f"  dnnl_memory_desc_destroy({md});" for md in self.local_mds), "}"]
        return KernelCode(state=self.state_code(), init="\n".join(init), run="\n".join([*self.before, *self.after]))

    def code(self, create: str, attrs: tuple[str, ...] = (), retry: tuple[str, ...] = (), first: str | None = None,
             unless: str | None = None) -> KernelCode:
        """`first` creates the descriptor in given layouts (operands as their producers left
        them: no reorder), kept unless it fails or `create` gives a faster kind (AVX2 has no
        brgemm matmul: there both are oneDNN's GEMM, and the given layouts save the reorders).
        `retry` creates it again (into `retry_pd`) with other layouts, in order, for as long as
        the one in hand is not a direct JIT kernel, keeping a faster kind. Where the C condition
        `unless` holds after the setup, no primitive is made (its run must not execute it)."""
        init = ["{", "  dnnl_primitive_desc_t pd = NULL;"]
        init += ["  " + line for line in self.setup]
        if unless is not None:
            init.append(f"  if (!({unless})) {{")
        check = self.check(create, "primitive descriptor (unsupported shape or attributes)")
        if first is None:
            init.append("  " + check)
        else:
            init += [f"  if ({first} != dnnl_success) {{", "    pd = NULL;", "    " + check, "  } else if (byoc_impl_rank(pd) > 0) {",
                     *_keep_faster(create.replace("(&pd,", "(&retry_pd,", 1)), "  }"]
        for again in retry:
            init += ["  if (byoc_impl_rank(pd) > 0) {", *_keep_faster(again), "  }"]
        init += ["  " + line for line in self.bind]
        init.append("  " + self.check(f"byoc_primitive(&{self.k}_prim, pd)", "primitive creation"))
        if unless is not None:
            init.append("  }")
        init += [f"  dnnl_memory_desc_destroy({md});" for md in self.local_mds]
        init += [f"  dnnl_primitive_attr_destroy({attr});" for attr in attrs]
        init.append("}")
        args = ", ".join(f"{{{arg}, {memory}}}" for arg, memory in self.exec_args)
        run = [*self.before, "{", f"  dnnl_exec_arg_t args[{len(self.exec_args)}] = {{{args}}};"]
        run.append("  " + self.check(f"byoc_execute({self.k}_prim, {len(self.exec_args)}, args)", "execution"))
        run += ["}", *self.after]
        return KernelCode(state=self.state_code(), init="\n".join(init), run="\n".join(run))


def _keep_faster(again: str) -> list[str]:
    """C that creates the descriptor again into `retry_pd` (`again`) and keeps the faster kind."""
    return ["    dnnl_primitive_desc_t retry_pd = NULL;", f"    dnnl_status_t retry_status = {again};",
            "    byoc_prefer_faster(&pd, retry_status, retry_pd);"]


def _in_sequence(codes: list[KernelCode]) -> KernelCode:
    """The kernels of several primitives as one, run in the order given."""
    return KernelCode(**{part: "\n".join(getattr(code, part) for code in codes) for part in ("state", "init", "run")})


def _outside_operand(call: KernelCall, node: dict) -> CBuffer:
    """The operand of a binary node in a fused kernel that comes from outside the kernel."""
    return next(call.arg(node, i) for i in (1, 0) if call.arg(node, i) in call.inputs)


def _post_op(algorithm: str, alpha: float = 0.0, beta: float = 0.0) -> dict:
    """An element-wise post-op that is no node of the graph (see `eltwise_args`)."""
    return {"op": "eltwise", "algorithm": algorithm, "alpha": _float(alpha), "beta": _float(beta)}


def _zero_point_offset(scales: Scales) -> float:
    """What a zero point adds to dequantized values: -scale * zero_point (one of each)."""
    return -float(scales.scale[0]) * float(scales.zero_point[0])


def _quantizing(result: Scales, offset: float = 0.0) -> dict:
    """The linear post-op that adds `offset` and quantizes with `result`'s scale and zero point
    (the conversion to int8 after it rounds and saturates, as QuantizeLinear does)."""
    inverse = 1.0 / float(result.scale[0])
    return _post_op("dnnl_eltwise_linear", inverse, float(result.zero_point[0]) + offset * inverse)


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
        if node["op"] in ("relax.quantize", "relax.dequantize"):  # quantization, not a post-op (see dnnl.quantization)
            continue
        residual = _quantized_residual(call, node)
        if residual is not None:
            # + (b - zb) * sb on the float result, b int8: a binary post-op adds b as it is,
            # so the result is scaled by 1 / sb around it.
            b, scales = residual
            scale = float(scales.scale[0])
            post.append(_post_op("dnnl_eltwise_linear", 1.0 / scale))
            operands.append((b, len(post)))
            post.append(node)
            post.append(_post_op("dnnl_eltwise_linear", scale, _zero_point_offset(scales)))
            continue
        form = call.pattern.removeprefix("dense_bias_") if call.pattern else None
        if form in GELU_FORMS and bias is not None:
            post.append({"op": form, "algorithm": GELU_FORMS[form]})  # the rest of the composite is the GELU
            break
        if node["op"] in _BINARY:
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
    kernel = _Kernel(call)
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


def _conv_geometry(kernel: _Kernel, attrs: dict, spatial: int) -> str:
    """A convolution's strides, dilations and padding as dims arrays; returns them as the
    descriptor's arguments."""
    names = [f"{kernel.k}_{part}" for part in ("strides", "dilates", "pad_l", "pad_r")]
    values = [attrs["strides"], [d - 1 for d in attrs["dilation"]], attrs["padding"][:spatial], attrs["padding"][spatial:]]
    kernel.setup += [dims_decl(name, tuple(value)) for name, value in zip(names, values)]
    return ", ".join(names)


def dynamic_convolution(call: KernelCall) -> KernelCode:
    """A convolution whose float input is quantized at run time (ONNX ConvInteger on
    DynamicQuantizeLinear's result, as `quantize_dynamic` writes it; see dnnl.int8): per call,
    the input's range, scale and zero point as the op defines them (read in the layout the input
    comes in), the input quantized to uint8 channels-last (the int8 kernels' layout) by a reorder
    with them, and one int8 convolution with that scale and zero point, the weights' scales, the
    float bias, and a batch norm and activation after it as post-ops."""
    kernel = _Kernel(call)
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
    kernel = _Kernel(call)
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
        post, residuals = [_post_op("dnnl_eltwise_linear", x_scale * w_scale), *post], [(b, i + 1) for b, i in residuals]
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
        return _post_op("dnnl_eltwise_linear", value)
    if node["op"] == "relax.add":
        return _post_op("dnnl_eltwise_linear", 1.0, value)
    if node["op"] == "relax.subtract":
        return _post_op("dnnl_eltwise_linear", -1.0, value) if first else _post_op("dnnl_eltwise_linear", 1.0, -value)
    if node["op"] == "relax.divide" and not first and value != 0.0:
        return _post_op("dnnl_eltwise_linear", 1.0 / value)
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
    kernel = _Kernel(call, "sized")
    runtime = [sum(1 << i for i, d in enumerate(b.shape) if isinstance(d, SymbolicDim)) for b in (x, w, out)]
    produced = _transposed_result(kernel, call) or kernel.md(out.shape, "plain", out.dtype)
    mds = []
    for what, md, axes in zip(("source", "weights", "result"), (kernel.md_of(x), kernel.md_of(w), produced), runtime):
        name = kernel._name("md")
        kernel.local_mds.append(name)
        kernel.setup += [f"dnnl_memory_desc_t {name};", kernel.check(f"byoc_runtime_md(&{name}, {md}, {axes})", f"{what} of any size")]
        mds.append(name)
    attr = kernel.post_ops(head, [], len(out.shape))
    kernel.direct("DNNL_ARG_SRC", f"{x.name}_mem")
    kernel.direct("DNNL_ARG_WEIGHTS", f"{w.name}_mem")
    kernel.result(out, md=produced)
    codes = [kernel.code(f"dnnl_matmul_primitive_desc_create(&pd, byoc_engine, {mds[0]}, {mds[1]}, NULL, {mds[2]}, {attr})", (attr,))]
    if binary is not None:  # in place on the result (post-ops compute `result op operand`)
        node, operand = binary
        masked = _Kernel(call, "masked")
        result = kernel.exec_args[-1][1]  # the memory the product writes
        attr = masked.post_ops(tail, [], len(out.shape))
        masked.direct("DNNL_ARG_SRC_0", result)
        masked.direct("DNNL_ARG_SRC_1", f"{operand.name}_mem")
        masked.direct("DNNL_ARG_DST", result)
        create = (f"dnnl_binary_primitive_desc_create(&pd, byoc_engine, {node.get('algorithm') or _BINARY[node['op']]}, "
                  f"byoc_md({result}), {masked.md_of(operand)}, byoc_md({result}), {attr})")
        codes.append(masked.code(create, (attr,)))
    sized = _in_sequence(codes)
    macs = math.prod(out.shape) * x.shape[-1]
    flag = f"{call.name}_any_size"
    choose = f"{flag} = {macs} <= {SIZED_PRODUCT_MACS} && byoc_gemm_axis({kernel.md_of(x)}) >= 0 && byoc_gemm_axis({kernel.md_of(w)}) >= 0;"
    return KernelCode(state="\n".join([jit.state, sized.state, f"static int {flag} = 0;"]),
                      init="\n".join([choose, f"if ({flag}) {{", sized.init, "} else {", jit.init, "}"]),
                      run="\n".join([f"if ({flag}) {{", sized.run, "} else {", jit.run, "}"]))


def _unscaled(call: KernelCall, operand: CBuffer) -> tuple[CBuffer, float]:
    """A product's operand before its product with a constant inside the kernel (torch's
    attention scales q and k each), and that constant; else the operand itself and 1."""
    for node, outputs in zip(call.nodes, call.node_outputs):
        if operand in outputs and node["op"] == "relax.multiply":
            index = next(i for i in (0, 1) if call.arg(node, i).kind != "constant")
            return call.arg(node, index), _scalar(call, node, 1 - index)
    return operand, 1.0


def _reorder_with_attributes(kernel: _Kernel, primitive: str, source_md: str, target_md: str, given: list[tuple[str, str]], what: str,
                             mask: int = 0) -> list[str]:
    """Initialisation of reorder `primitive` from `source_md` to `target_md` whose scales or zero
    points (`given`: ("scales", "DNNL_ARG_DST"), ...; one value each, or one per index of the
    dimensions in `mask`) are given per call."""
    lines = ["dnnl_primitive_attr_t attr;", "dnnl_primitive_desc_t reorder = NULL;", kernel.check("dnnl_primitive_attr_create(&attr)", "attribute")]
    lines += [kernel.check(f"dnnl_primitive_attr_set_{kind}_mask(attr, {arg}, {mask})", kind.replace("_", " ")) for kind, arg in given]
    lines += [kernel.check(f"dnnl_reorder_primitive_desc_create(&reorder, {source_md}, byoc_engine, {target_md}, byoc_engine, attr)", what),
              kernel.check(f"byoc_primitive(&{primitive}, reorder)", what), "dnnl_primitive_attr_destroy(attr);"]
    return ["{", *("  " + line for line in lines), "}"]


def _as_int8(kernel: _Kernel, w: CBuffer, md: str) -> str:
    """Per call, uint8 data `w` as int8 `w - 128` (exact), in a memory of `md` that is returned:
    oneDNN 3.2's int8 matrix products take int8 weights only, and the second operand of a product
    of two quantized activations (attention's keys and values) is uint8."""
    name = kernel._name("int8")
    kernel.state += [f"static dnnl_memory_t {name} = NULL, {name}_shift = NULL;", f"static dnnl_primitive_t {name}_reorder = NULL;",
                     f"static int32_t {name}_zero = 128;"]
    kernel.setup += [
        kernel.check(f"dnnl_memory_create(&{name}, {md}, byoc_engine, DNNL_MEMORY_ALLOCATE)", "int8 operand"),
        kernel.check(f"dnnl_memory_create(&{name}_shift, {kernel.md((1,), 'plain', 'int32')}, byoc_engine, &{name}_zero)", "operand shift"),
        *_reorder_with_attributes(kernel, f"{name}_reorder", kernel.md_of(w), md, [("zero_points", "DNNL_ARG_SRC")], "int8 operand"),
    ]
    kernel.before += [
        "{",
        f"  dnnl_exec_arg_t args[3] = {{{{DNNL_ARG_FROM, {w.name}_mem}}, {{DNNL_ARG_TO, {name}}}, "
        f"{{DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, {name}_shift}}}};",
        "  " + kernel.check(f"byoc_execute({name}_reorder, 3, args)", "int8 operand"),
        "}",
    ]
    return name


def _quantized_at_run_time(kernel: _Kernel, source: str, source_md: str, count: int | str, q_md: str) -> str:
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
        f"  dnnl_exec_arg_t args[4] = {{{{DNNL_ARG_FROM, {source}}}, {{DNNL_ARG_TO, {k}_q}}, "
        f"{{DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST, {k}_scale_mem}}, {{DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, {k}_zero_mem}}}};",
        "  " + kernel.check(f"byoc_execute({k}_quantize, 4, args)", "input quantization"),
        "}",
    ]
    return f"{k}_q"


def _run_time_source_scales(kernel: _Kernel, attr: str) -> None:
    """The product's source scale and zero point, set per call (`_quantized_at_run_time`)."""
    k = kernel.k
    kernel.setup += [kernel.check(f"dnnl_primitive_attr_set_scales_mask({attr}, DNNL_ARG_SRC, 0)", "scales"),
                     kernel.check(f"dnnl_primitive_attr_set_zero_points_mask({attr}, DNNL_ARG_SRC, 0)", "zero points")]
    kernel.exec_args += [("DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC", f"{k}_scale_mem"), ("DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC", f"{k}_zero_mem")]


def dynamic_dense(call: KernelCall) -> KernelCode:
    """A dense layer whose float input is quantized at run time (ONNX DynamicQuantizeLinear, as
    `quantize_dynamic` writes it; see dnnl.int8): per call, the input's range, scale and zero
    point as the op defines them, the input quantized to uint8 by a reorder with them, and the
    product one int8 primitive with that scale and zero point, the weights' scales and the
    float bias: what onnxruntime's DynamicQuantizeMatMul computes."""
    kernel = _Kernel(call)
    node = call.node("relax.matmul")
    x = call.arg(call.node("relax.quantize"), 0)
    weights_node = dequantized(call, call.arg(node, 1))
    w, weight_scales = call.arg(weights_node, 0), scales_of(call, weights_node)
    out = call.outputs[0]
    bias, post, residuals = _fused_tail(call, node)
    count = math.prod(x.shape[:-1])
    x_shape, out_shape = (count, x.shape[-1]), (count, out.shape[-1])
    x_md, q_md = kernel.md(x_shape, "plain", "float32"), kernel.md(x_shape, "plain", "uint8")
    quantized = _quantized_at_run_time(kernel, kernel.rows_view(x, x_md), x_md, count * x.shape[-1], q_md)
    attr = kernel.post_ops(post, residuals, len(out_shape))
    _run_time_source_scales(kernel, attr)
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
    kernel = _Kernel(call)
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
    kernel = _Kernel(call)
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


def _global_average_pool(kernel: _Kernel, x: CBuffer, out: CBuffer) -> KernelCode:
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
    kernel = _Kernel(call)
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
    c - x with a scalar constant c are element-wise ops. A quantize after it (see dnnl.int8) is a
    linear post-op and an int8 result, which the conversion rounds and saturates."""
    node = call.nodes[0]
    a, b, out = call.arg(node, 0), call.arg(node, 1), call.outputs[0]
    if a.kind == "constant" and a.size == 1 and b.shape == out.shape and node["op"] in ("relax.divide", "relax.subtract"):
        return eltwise(call)
    kernel = _Kernel(call)
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
    algorithm = _BINARY[node["op"]]
    attr, dst_md, quantize = "NULL", kernel.md_of(a), result_quantize(call)
    if quantize is not None:
        result = scales_of(call, quantize)
        attr = kernel.post_ops([_quantizing(result)], [], len(out.shape))
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
    x, value = (call.arg(node, 1), _scalar(call, node, 2)) if x_first else (call.arg(node, 2), _scalar(call, node, 1))
    kernel = _Kernel(call)
    rows_md, row_md = kernel.md((out.size // condition.size, condition.size), "plain"), kernel.md((1, condition.size), "plain")
    high, low = (_selection_bound(kernel, condition, row_md, *((bound, _float(value)) if x_first else (_float(value), bound)))
                 for bound in ("INFINITY", "-INFINITY"))
    kernel.direct("DNNL_ARG_SRC_0", kernel.rows_view(x, rows_md))
    kernel.direct("DNNL_ARG_SRC_1", high)
    kernel.direct("DNNL_ARG_DST", kernel.result_view(out, rows_md))
    attr = kernel.post_ops([{"op": "lower bound", "algorithm": "dnnl_binary_max", "operand": (low, row_md)}], [], 2)
    create = f"dnnl_binary_primitive_desc_create(&pd, byoc_engine, dnnl_binary_min, {rows_md}, {row_md}, {rows_md}, {attr})"
    return kernel.code(create, attrs=(attr,))


def _selection_bound(kernel: _Kernel, condition: CBuffer, md: str, selected: str, otherwise: str) -> str:
    """A float memory described by `md` holding `selected` where the condition holds and
    `otherwise` elsewhere: filled once at initialisation from a constant condition, before each
    call from one the host computed (a padding mask: one row of the scores' size, so cheap)."""
    name = kernel._name("bound")
    kernel.state += [f"static float* {name}_data = NULL;", f"static dnnl_memory_t {name} = NULL;"]
    kernel.setup += [f"{name}_data = (float*)malloc({condition.size} * sizeof(float));",
                     f'if ({name}_data == NULL) BYOC_FAIL("{_c_text(kernel.where)}: out of memory for the selection");']
    fill = f"for (int64_t i = 0; i < {condition.size}; ++i) {name}_data[i] = {condition.name}[i] ? {selected} : {otherwise};"
    (kernel.setup if condition.kind == "constant" else kernel.before).append(fill)
    kernel.setup.append(kernel.check(f"dnnl_memory_create(&{name}, {md}, byoc_engine, {name}_data)", "selection bound"))
    return name


def softmax(call: KernelCall) -> KernelCode:
    """Softmax; in the `softmax_nan_to_zero` composite, NaN (from a row masked whole, where
    oneDNN computes -inf - -inf) then becomes 0, as torch's exported attention asks. A quantize
    after it (zero point 0: see dnnl.int8) is the primitive's result scale and an int8 result."""
    kernel = _Kernel(call)
    node = call.nodes[0]
    x, out = call.arg(node, 0), call.outputs[0]
    axis = node["attrs"]["axis"] % len(x.shape)
    kernel.direct("DNNL_ARG_SRC", f"{x.name}_mem")
    kernel.result(out)
    if call.pattern == "softmax_masked_rows_to_zero":  # exact: rows whose scores are all -inf, and only those
        result, width = kernel.exec_args[-1][1], x.shape[-1]
        kernel.after.insert(0, "\n".join([
            "{",
            "  const float* src = NULL;",
            "  float* data = NULL;",
            "  " + kernel.check(f"dnnl_memory_get_data_handle({x.name}_mem, (void**)&src)", "softmax scores"),
            "  " + kernel.check(f"dnnl_memory_get_data_handle({result}, (void**)&data)", "softmax result"),
            f"  for (size_t row = 0; row < {x.size // width}; ++row) {{",
            "    size_t i = 0;",
            f"    while (i < {width} && isinf(src[row * {width} + i]) && src[row * {width} + i] < 0) ++i;",
            f"    if (i == {width}) memset(data + row * {width}, 0, {width} * sizeof(float));",
            "  }",
            "}",
        ]))
    if call.pattern == "softmax_nan_to_zero":
        result = kernel.exec_args[-1][1]
        kernel.after.insert(0, "\n".join([
            "{",
            "  float* data = NULL;",
            "  " + kernel.check(f"dnnl_memory_get_data_handle({result}, (void**)&data)", "softmax result"),
            f"  size_t count = dnnl_memory_desc_get_size(byoc_md({result})) / sizeof(float);",
            "  for (size_t i = 0; i < count; ++i) if (isnan(data[i])) data[i] = 0.f;",
            "}",
        ]))
    attr, dst_md, quantize = "NULL", kernel.md_of(x), result_quantize(call)
    if quantize is not None:
        attr, dst_md = kernel.post_ops([], [], len(out.shape)), kernel.like_md(x, out.dtype)
        kernel.scales(attr, "DNNL_ARG_DST", scales_of(call, quantize), 0, zero_point=False)
    create = (
        f"dnnl_softmax_forward_primitive_desc_create(&pd, byoc_engine, dnnl_forward_inference, dnnl_softmax_accurate, "
        f"{kernel.md_of(x)}, {dst_md}, {axis}, {attr})"
    )
    return kernel.code(create, attrs=(attr,) if quantize is not None else ())


def concat(call: KernelCall) -> KernelCode:
    kernel = _Kernel(call)
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
    kernel = _Kernel(call)
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
    kernel = _Kernel(call)
    node = call.nodes[0]
    x, out = call.arg(node, 0), call.outputs[0]
    out_md = kernel.md(out.shape, "plain", out.dtype)
    result = kernel.result_view(out, out_md)
    window = kernel._name("window")
    kernel.state.append(f"static dnnl_memory_t {window} = NULL;")
    window_md = kernel._name("md")
    kernel.local_mds.append(window_md)
    kernel.setup += [f"dnnl_memory_desc_t {window_md};", "{", "  " + dims_decl("shape", x.shape),
                     "  " + dims_decl("offsets", tuple(node['attrs']['pad_width'][0::2])),
                     "  " + kernel.check(f"dnnl_memory_desc_create_submemory(&{window_md}, {out_md}, shape, offsets)", "padded window"),
                     "  " + kernel.check(f"dnnl_memory_create(&{window}, {window_md}, byoc_engine, DNNL_MEMORY_NONE)", "padded window"),
                     "}"]
    kernel.point(window, result)
    kernel.before += ["{", "  float* data = NULL;",
                      "  " + kernel.check(f"dnnl_memory_get_data_handle({result}, (void**)&data)", "padded result"),
                      f"  byoc_fill(data, (long){out.size}, {_float(node['attrs']['pad_value'])});", "}"]
    kernel.direct("DNNL_ARG_FROM", f"{x.name}_mem")
    kernel.direct("DNNL_ARG_TO", window)
    return kernel.code(f"dnnl_reorder_primitive_desc_create(&pd, {kernel.md_of(x)}, byoc_engine, {window_md}, byoc_engine, NULL)")


def take(call: KernelCall) -> KernelCode:
    """A constant index along one axis (BERT's pooler takes token 0): a window of the input."""
    node = call.nodes[0]
    x, out = call.arg(node, 0), call.outputs[0]
    axis = node["attrs"]["axis"] % len(x.shape)
    index = int(_scalar(call, node, 1))
    index = index if index >= 0 else x.shape[axis] + index  # from the end; a symbolic length stays an expression
    window = tuple(1 if a == axis else d for a, d in enumerate(x.shape))
    return _strided_copies(call, x, [(out, window, *_window(x.shape, tuple(index if a == axis else 0 for a in range(len(x.shape)))))])


def layer_norm(call: KernelCall) -> KernelCode:
    """Layer normalisation over the last axis, with its scale and shift; or, for the
    `normalized` composite, without them."""
    kernel = _Kernel(call)
    node = call.nodes[0]
    x, out = call.arg(node, 0), call.outputs[0]
    source, quantize = dequantized_source(call), result_quantize(call)
    if source is not None:  # int8 data, read as it is (see epsilon below)
        node, x = call.node("relax.nn.layer_norm"), call.arg(source, 0)
    attr = kernel.post_ops([], [], len(out.shape)) if quantize is not None else "NULL"
    if call.pattern == "normalized":
        epsilon, flags = _scalar(call, call.node("relax.add"), 1), "0"
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
        f"{kernel.like_md(x, out.dtype)}, NULL, {_float(epsilon)}, {flags}, {attr})"
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
    squares, means, norm = (_Kernel(call, part) for part in ("squares", "means", "norm"))
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
    epsilon = _scalar(call, call.node("relax.add"), 1)
    codes.append(norm.code(f"dnnl_layer_normalization_forward_primitive_desc_create(&pd, byoc_engine, dnnl_forward_inference, {norm_md}, "
                           f"{norm_md}, NULL, {_float(epsilon)}, {flags}, NULL)"))
    return _in_sequence(codes)


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
    low, high, total = (_Kernel(call, part) for part in ("low", "high", "sum"))
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
        args = f"{{DNNL_ARG_FROM, {name}_read}}, {{DNNL_ARG_TO, {name}_write}}, {{DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, {scale}}}"
        kernel.before += ["{", f"  dnnl_exec_arg_t args[3] = {{{args}}};", "  " + kernel.check(f"byoc_execute({name}_copy, 3, args)", "scaled half"), "}"]
    full_md = total.md(x.shape, "plain", x.dtype)
    total.direct("DNNL_ARG_SRC_0", source)
    total.direct("DNNL_ARG_SRC_1", total.view(tables["cos"], table_shape))
    attr = total.post_ops([{"op": "binary", "algorithm": "dnnl_binary_add", "operand": (f"{k}_rotated", full_md)}], [], len(x.shape))
    total.result(out)
    codes = [low.code_without_primitive(), high.code_without_primitive(),
             total.code(f"dnnl_binary_primitive_desc_create(&pd, byoc_engine, dnnl_binary_mul, {full_md}, {total.md(table_shape, 'plain')}, "
                        f"{total.md(out.shape, dtype=out.dtype)}, {attr})", (attr,))]
    return _in_sequence(codes)


def _relayout(call: KernelCall, view_setup, view=None) -> KernelCode:
    """A reorder from the input into a view of the output's data (reshape, transpose). With
    `view(kernel, x, out, view_md)` giving a C condition and the descriptor of the output as a
    view of the input's data (None: the output's own), the output is that view wherever the condition
    holds at initialisation, when layouts are known (the library declares such ops views, so the
    input's memory outlives the output)."""
    kernel = _Kernel(call)
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


def _permuted_md(kernel: _Kernel, md: str, order: list[int]) -> str:
    """A local descriptor: `md` with its axes moved, axis i to position order[i]."""
    name = kernel._name("perm")
    kernel.local_mds.append(name)
    kernel.setup += [f"int {name}_axes[{len(order)}] = {{{', '.join(str(a) for a in order)}}};", f"dnnl_memory_desc_t {name};",
                     kernel.check(f"dnnl_memory_desc_permute_axes(&{name}, {md}, {name}_axes)", "transpose view")]
    return name


def _transposed_layout(kernel: _Kernel, shape: tuple[int, ...], order: list[int], dtype: str) -> str:
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

    def view(kernel: _Kernel, x: CBuffer, out: CBuffer, _transposed: str) -> tuple[str, str]:
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


def _transposed_result(kernel: _Kernel, call: KernelCall) -> str | None:
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
    kernel = _Kernel(call)
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


def _requantizing_binary(call: KernelCall, a: tuple[CBuffer, Scales], b: tuple[CBuffer, Scales] | CBuffer | float,
                         activations: list[dict], result: Scales) -> KernelCode:
    """One binary add on int8 data: `a` (int8, its scale a source scale) plus `b` (int8 with its
    scale, a float constant of the region broadcast over `a`, or a number), then `activations`
    (element-wise post-ops), quantized. Binary primitives take no zero points: those of the operands
    are a constant offset, added by a linear post-op before the activations (folded into the
    requantizing one without them), and the result's scale and zero point are a last linear
    post-op; the conversion to int8 rounds and saturates, as QuantizeLinear does."""
    kernel = _Kernel(call)
    source, source_scales = a
    out = call.outputs[0]
    offset = _zero_point_offset(source_scales)
    kernel.source("DNNL_ARG_SRC_0", source, "dnnl_query_src_md")
    if isinstance(b, tuple):
        other, other_scales = b
        offset += _zero_point_offset(other_scales)
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
    steps = [_post_op("dnnl_eltwise_linear", 1.0, offset)] if activations else []
    steps += activations
    steps.append(_quantizing(result, 0.0 if activations else offset))
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
    relu = [_post_op("dnnl_eltwise_relu")] if any(n["op"] == "relax.nn.relu" for n in call.nodes) else []
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
    kernel = _Kernel(call)
    shape = (a.size // operand.size, operand.size)
    rows_md, result_md, row_md, one_md = (kernel.md(s, "plain", t) for s, t in
                                          ((shape, a.dtype), (shape, out.dtype), ((1, shape[1]), "float32"), ((1, 1), "float32")))
    kernel.direct("DNNL_ARG_SRC_0", kernel.rows_view(a, rows_md))
    kernel.direct("DNNL_ARG_SRC_1", kernel.array("zero", np.zeros(1, np.float32), "float32", one_md))
    kernel.direct("DNNL_ARG_DST", kernel.result_view(out, result_md))
    row = kernel.view(operand, (1, shape[1])) if operand.kind == "constant" else kernel.rows_view(operand, row_md)
    steps = [_post_op("dnnl_eltwise_linear", 1.0, _zero_point_offset(scales)),
             *({**step, "operand": (row, row_md)} if step["op"] == "binary" else step for step in steps), _quantizing(result)]
    attr = kernel.post_ops(steps, [], 2)
    kernel.scales(attr, "DNNL_ARG_SRC_0", scales, 0, zero_point=False)
    create = f"dnnl_binary_primitive_desc_create(&pd, byoc_engine, dnnl_binary_add, {rows_md}, {one_md}, {result_md}, {attr})"
    return kernel.code(create, (attr,))


def quantized_with_float(call: KernelCall) -> KernelCode:
    """quantize(dequantize(a) op x), x a float tensor of the result's shape, one value per row, or
    broadcast along the leading axes (or x op dequantize(a) for add, subtract and multiply), as one
    binary primitive on the int8 data `a`: dequantized by its scale and an added offset, x
    applied by a binary post-op, quantized."""
    root = next(n for n in call.nodes if n["op"] in _BINARY)
    index = next(i for i in (0, 1) if dequantized(call, call.arg(root, i)) is not None)
    source, other = dequantized(call, call.arg(root, index)), call.arg(root, 1 - index)
    operand = {"op": "binary", "operand": (f"{other.name}_mem", _Kernel.md_of(other))}
    if root["op"] == "relax.subtract" and index == 1:  # x - dequantize(a): -dequantize(a), then + x
        steps = [_post_op("dnnl_eltwise_linear", -1.0), {**operand, "algorithm": "dnnl_binary_add"}]
    else:
        steps = [{**operand, "algorithm": _BINARY[root["op"]]}]
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
    return _requantizing_binary(call, (call.arg(source, 0), scales_of(call, source)), 0.0, [_post_op("dnnl_eltwise_gelu_erf")],
                                scales_of(call, call.nodes[-1]))


def quantized_eltwise(call: KernelCall) -> KernelCode:
    """quantize(f(dequantize(x))), f an element-wise op (a GELU between two quantized dense
    layers), as one primitive on the int8 data, f a post-op."""
    source = dequantized_source(call)
    op = next(n for n in call.nodes if n["op"] not in ("relax.dequantize", "relax.quantize"))
    algorithm, alpha, beta = eltwise_args(call, op)
    return _requantizing_binary(call, (call.arg(source, 0), scales_of(call, source)), 0.0,
                                [{"op": "eltwise", "algorithm": algorithm, "alpha": alpha, "beta": beta}], scales_of(call, call.nodes[-1]))
