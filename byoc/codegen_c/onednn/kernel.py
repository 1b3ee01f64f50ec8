"""The builder of one oneDNN kernel's C: memory descriptors, the primitive descriptor, the layout
conversions it implies, the primitive, its post-ops and scales, and its execution. The emitters
(`byoc.codegen_c.onednn.emitters`) describe each op with it."""

from __future__ import annotations

import math

import numpy as np

from byoc.codegen_c.kernel_call import CBuffer, KernelCall, KernelCode
from byoc.codegen_c.onednn.kernel_scales import DNNL_TYPES, KernelQuantization, Scales
from byoc.codegen_c.onednn.library import dims_decl, rank

ELTWISE = {
    "relax.nn.relu": ("dnnl_eltwise_relu", "0.f", "0.f"),
    "relax.sigmoid": ("dnnl_eltwise_logistic", "0.f", "0.f"),
    "relax.tanh": ("dnnl_eltwise_tanh", "0.f", "0.f"),
    "relax.exp": ("dnnl_eltwise_exp", "0.f", "0.f"),
    "relax.sqrt": ("dnnl_eltwise_sqrt", "0.f", "0.f"),
    "relax.rsqrt": ("dnnl_eltwise_pow", "1.f", "-0.5f"),  # 1 * x^-0.5: torch's RMSNorm as torch.export writes it
    "relax.nn.gelu": ("dnnl_eltwise_gelu_erf", "0.f", "0.f"),
    "relax.nn.gelu_tanh": ("dnnl_eltwise_gelu_tanh", "0.f", "0.f"),
    "relax.negative": ("dnnl_eltwise_linear", "-1.f", "0.f"),  # rotary embeddings' -x2 (Llama's rotate_half)
    "relax.abs": ("dnnl_eltwise_abs", "0.f", "0.f"),  # torch's F.normalize (Swin v2's cosine attention, ConvNeXt V2's GRN)
}
ELTWISE_OPS = (*ELTWISE, "relax.clip")
BINARY = {"relax.add": "dnnl_binary_add", "relax.subtract": "dnnl_binary_sub", "relax.multiply": "dnnl_binary_mul", "relax.divide": "dnnl_binary_div"}


def c_float(value: float) -> str:
    """A C float literal of `value`, which may be an int: TVM's ONNX importer writes the clip of
    HardSigmoid with integer bounds, and `0f` is no C literal."""
    value = float(value)
    if math.isinf(value):
        return "INFINITY" if value > 0 else "-INFINITY"
    return f"{value!r}f"


def c_text(text: str) -> str:
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
        return "dnnl_eltwise_clip_v2", c_float(low), c_float(high)
    if op == "relax.power":
        return "dnnl_eltwise_pow", "1.f", c_float(scalar_of(call, node, 1))
    if op == "relax.divide":
        return "dnnl_eltwise_pow", c_float(scalar_of(call, node, 0)), "-1.f"
    if op == "relax.subtract":
        return "dnnl_eltwise_linear", "-1.f", c_float(scalar_of(call, node, 0))
    return ELTWISE[op]


def scalar_of(call: KernelCall, node: dict, index: int) -> float:
    return float(call.constants[call.arg(node, index).name].reshape(()))


class Kernel:
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

    def name_of(self, kind: str) -> str:
        """A C name of this kernel's, new at each call."""
        self.count += 1
        return f"{self.k}_{kind}{self.count}"

    def local_md(self, kind: str = "md") -> str:
        """A memory descriptor declared at the start of the setup's code, destroyed at its end;
        returns its C name (the caller creates it)."""
        name = self.name_of(kind)
        self.local_mds.append(name)
        self.setup.append(f"dnnl_memory_desc_t {name};")
        return name

    def check(self, call: str, what: str) -> str:
        # The kernel's location is written once (`state_code`), not into every check's text:
        # BERT's 644 kernels made 1 MB of C in error messages.
        return f'DNNL_CHECK_AT({call}, {self.k}_where, "{what}");'

    def state_code(self) -> str:
        return "\n".join([f'static const char {self.k}_where[] = "{c_text(self.where)}";', *self.state])

    # ------------------------------------------------------ memory descriptors
    def md(self, shape: tuple[int, ...], tag: str = "any", dtype: str = "float32") -> str:
        """A local memory descriptor of `shape`: any layout, plain, or a oneDNN format tag ("acdb")."""
        name = self.local_md()
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
        name = self.local_md()
        self.setup.append(self.check(f"byoc_like_md(&{name}, {self.md_of(buffer)}, {DNNL_TYPES[dtype]})", f"{dtype} descriptor"))
        return name

    def view(self, buffer: CBuffer, shape: tuple[int, ...]) -> str:
        """A memory over a constant's data with another (plain) shape, e.g. a bias [1, C, 1, 1]
        seen as [C]. Returns the memory's C name."""
        name = self.name_of("view")
        md = self.md(shape, "plain", buffer.dtype)
        self.state.append(f"static dnnl_memory_t {name} = NULL;")
        self.setup.append(self.check(f"dnnl_memory_create(&{name}, {md}, byoc_engine, {buffer.name})", f"view of {buffer.name}"))
        return name

    # ------------------------------------------------------------- arguments
    def source(self, arg: str, buffer: CBuffer, query: str, index: int = 0) -> None:
        """An input in the layout the primitive chose, reordered per call if it differs."""
        name = self.name_of("src")
        self.state.append(f"static byoc_conversion {name};")
        wanted = f"dnnl_primitive_desc_query_md(pd, {query}, {index})"
        self.bind.append(self.check(f"byoc_conversion_init(&{name}, {buffer.name}_mem, {wanted})", f"layout of {buffer.name}"))
        self.before.append(self.check(f"byoc_reorder({name}.reorder, {buffer.name}_mem, {name}.memory)", f"reorder of {buffer.name}"))
        self.exec_args.append((arg, f"{name}.memory"))

    def direct(self, arg: str, memory: str) -> None:
        self.exec_args.append((arg, memory))

    def weights(self, arg: str, memory: str, query: str) -> None:
        """Constant weights, reordered once at initialisation into the primitive's layout, and
        kept when the kernel is made again in that layout (`byoc_weights_init`)."""
        name = self.name_of("weights")
        self.state.append(f"static byoc_weights {name};")
        self.bind.append(self.check(f"byoc_weights_init(&{name}, {memory}, dnnl_primitive_desc_query_md(pd, {query}, 0))", "weights reorder"))
        self.exec_args.append((arg, f"{name}.memory"))

    def result(self, buffer: CBuffer, query: str = "dnnl_query_dst_md", md: str | None = None) -> None:
        """The result in the layout the primitive chose (its `query`), or in `md`."""
        name = self.name_of("dst")
        self.state.append(f"static byoc_conversion {name};")
        size = f"&{buffer.name}_bytes" if buffer.kind == "intermediate" else "NULL"
        produced = md or f"dnnl_primitive_desc_query_md(pd, {query}, 0)"
        self.bind.append(self.check(f"byoc_result_init(&{name}, &{buffer.name}_mem, {size}, {produced})", "result layout"))
        if buffer.kind != "intermediate":
            self.after.append(self.check(f"byoc_reorder({name}.reorder, {name}.memory, {buffer.name}_mem)", f"reorder into {buffer.name}"))
        self.exec_args.append(("DNNL_ARG_DST", f"{name}.memory"))

    def plain_source(self, buffer: CBuffer, md: str | None = None) -> str:
        """An input in plain layout (or the layout of descriptor `md`): its own memory where its
        producer chose that layout, else a copy reordered per call. Returns the memory."""
        name = self.name_of("plain")
        self.state.append(f"static byoc_conversion {name};")
        layout = md or self.md(buffer.shape, "plain", buffer.dtype)
        self.setup.append(self.check(f"byoc_conversion_init(&{name}, {buffer.name}_mem, {layout})", f"plain layout of {buffer.name}"))
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
        name = self.name_of("rows")
        self.state.append(f"static dnnl_memory_t {name} = NULL;")
        self.setup.append(self.check(f"dnnl_memory_create(&{name}, {view_md}, byoc_engine, DNNL_MEMORY_NONE)", "input view"))
        self.point(name, source, offset)
        return name

    def strided_md(self, shape: tuple[int, ...], strides: list[int], dtype: str) -> str:
        """A local descriptor of `shape` with element `strides` (0: broadcast; a multiple of the
        dense stride: every k-th element)."""
        name = self.local_md()
        self.setup += ["{", "  " + dims_decl("shape", shape),
                       "  " + dims_decl("strides", tuple(strides)),
                       "  " + self.check(f"dnnl_memory_desc_create_with_strides(&{name}, {rank(shape)}, shape, {DNNL_TYPES[dtype]}, "
                                         "strides)", "strided view"), "}"]
        return name

    def result_view(self, buffer: CBuffer, view_md: str) -> str:
        """The output in plain layout, written through a view of its data described by
        `view_md` (another shape of the same bytes: a reshape, a transpose, kept dimensions, a
        window). Returns the view's memory."""
        name = self.name_of("result")
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
        layout ("any": the one the primitive asks for); so is one made in the region, whose
        producer may have chosen another (a quantize from a blocked float32 layout writes plain
        int8: an int8 convolution with a residual add in plain NCHW against its NHWC result ran
        in oneDNN's reference code, 3.4 ms instead of 0.02). Where the layouts agree, the
        conversion is none."""
        operands: dict[int, tuple[str, str]] = {}  # post-op index -> (memory, descriptor), made outside the block below
        for buffer, index in residual_arg:
            operands[index] = f"{buffer.name}_mem", self.md_of(buffer)
            if input_tag and buffer.kind in ("input", "intermediate") and len(buffer.shape) == rank:
                name = self.name_of("operand")
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
        attr = self.name_of("attr")
        self.setup.append(f"dnnl_primitive_attr_t {attr};")
        self.setup.append(self.check(f"dnnl_primitive_attr_create(&{attr})", "attribute"))
        if nodes:
            self.setup.append("{")
            self.setup.append("  dnnl_post_ops_t ops;")
            self.setup.append("  " + self.check("dnnl_post_ops_create(&ops)", "post-ops"))
            for index, node in enumerate(nodes):
                if node["op"] in BINARY or "operand" in node:  # an op of the graph, or one an emitter makes (memory, descriptor)
                    memory, md = node.get("operand") or operands[index]
                    algorithm = node.get("algorithm") or BINARY[node["op"]]
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
        name = self.name_of(what)
        ctype, literal = ("float", c_float) if dtype == "float32" else ("int32_t", lambda v: str(int(v)))
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


def in_sequence(codes: list[KernelCode]) -> KernelCode:
    """The kernels of several primitives as one, run in the order given."""
    return KernelCode(**{part: "\n".join(getattr(code, part) for code in codes) for part in ("state", "init", "run")},
                      reads_settled=any(code.reads_settled for code in codes))


def post_op(algorithm: str, alpha: float = 0.0, beta: float = 0.0) -> dict:
    """An element-wise post-op that is no node of the graph (see `eltwise_args`)."""
    return {"op": "eltwise", "algorithm": algorithm, "alpha": c_float(alpha), "beta": c_float(beta)}


def zero_point_offset(scales: Scales) -> float:
    """What a zero point adds to dequantized values: -scale * zero_point (one of each)."""
    return -float(scales.scale[0]) * float(scales.zero_point[0])


def quantizing(result: Scales, offset: float = 0.0) -> dict:
    """The linear post-op that adds `offset` and quantizes with `result`'s scale and zero point
    (the conversion to int8 after it rounds and saturates, as QuantizeLinear does)."""
    inverse = 1.0 / float(result.scale[0])
    return post_op("dnnl_eltwise_linear", inverse, float(result.zero_point[0]) + offset * inverse)
