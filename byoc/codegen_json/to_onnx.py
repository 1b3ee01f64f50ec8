"""JSON graph -> ONNX model: the Relax ops a region may hold when a vendor takes ONNX, and their
ONNX spelling. Shared by the vendors whose libraries import ONNX: ONNX Runtime (one inference
session per region) and TensorRT (its ONNX parser builds the engine's network).

One declaration per Relax op (`TRANSLATIONS`): the ONNX op it becomes, its emitter, and what ONNX
cannot express of it (a check returning the reason, or None). Every check also holds the op's
tensors to the type constraints of the ONNX op's schema, so an int64 `exp` or int32 GatherND
indices stay on the host with the reason rather than failing in the vendor's importer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import defs, helper, numpy_helper
from tvm import relax

from byoc.codegen_json.graph import tensor_refs, value_spec
from byoc.errors import CodegenError
from byoc.ir.types import dtype_name, tensor_types

OPSET = 17  # the default: what TensorRT 8.5's ONNX parser reads
LATEST_OPSET = 20  # what torch.onnx writes; ONNX Gelu arrived in 20, axes as an input of every Reduce op in 18

Node = Mapping[str, Any]
Check = Callable[[relax.Call], "str | None"]


class _Writer:
    def __init__(self, graph: Mapping[str, Any], opset: int) -> None:
        self.graph = graph
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.counter = 0

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}__{self.counter}"

    def constant(self, value: np.ndarray, hint: str) -> str:
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.require(value, requirements="C"), name))
        return name

    def ints(self, values, hint: str) -> str:
        return self.constant(np.array(values, dtype=np.int64), hint)

    def tensor(self, ref: Mapping[str, Any]) -> str:
        if "input" in ref:
            return f"input{ref['input']}"
        if "const" in ref:
            return ref["const"]
        return f"n{ref['node']}_{ref.get('index', 0)}"

    def add(self, op_type: str, inputs: list[str], outputs: list[str], name: str, **attrs) -> None:
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=self.fresh(name), **attrs))

    def chain(self, node: Node, steps: list[tuple[str, list[str | None]]], outs: list[str]) -> None:
        """Several ONNX nodes for one Relax op, (op_type, inputs) each: an input None is the
        previous step's output; the last step writes `outs`."""
        previous = None
        for index, (op_type, inputs) in enumerate(steps):
            result = outs if index == len(steps) - 1 else [self.fresh(f"{node['name']}_{op_type}")]
            self.add(op_type, [previous if i is None else i for i in inputs], result, node["name"])
            previous = result[0]

    def scalar(self, value: float, node: Node, hint: str = "scalar") -> str:
        return self.constant(np.array(value, dtype=node["outputs"][0]["dtype"]), hint)


Emitter = Callable[[_Writer, Node, list[str], list[str]], None]


def _same_op(onnx_op: str, **attrs) -> Emitter:
    def emit(w: _Writer, node, args, outs):
        w.add(onnx_op, args, outs, node["name"], **attrs)

    return emit


def _attr_op(onnx_op: str, **names: str) -> Emitter:
    """The op with attributes taken from the Relax attrs: onnx name -> relax name."""

    def emit(w: _Writer, node, args, outs):
        w.add(onnx_op, args, outs, node["name"], **{o: node["attrs"][r] for o, r in names.items()})

    return emit


def _conv(onnx_op: str) -> Emitter:
    def emit(w: _Writer, node, args, outs):
        a = node["attrs"]
        extra = {"output_padding": a["output_padding"]} if "output_padding" in a else {}
        w.add(onnx_op, args[:2], outs, node["name"], strides=a["strides"], pads=a["padding"], dilations=a["dilation"],
              group=a["groups"], **extra)

    return emit


def _pool(op_type: str) -> Emitter:
    def emit(w: _Writer, node, args, outs):
        a = node["attrs"]
        extra = {"count_include_pad": int(a["count_include_pad"])} if op_type == "AveragePool" else {"dilations": a["dilation"]}
        if op_type == "AveragePool" and any(d != 1 for d in a["dilation"]):
            if w.opset < 19:
                raise CodegenError(f"node {node['name']!r}: AveragePool takes dilations from opset 19; this graph is written at {w.opset}")
            extra["dilations"] = a["dilation"]
        window = {"kernel_shape": a["pool_size"], "strides": a["strides"], "pads": a["padding"], "ceil_mode": int(a["ceil_mode"])}
        w.add(op_type, args[:1], outs, node["name"], **window, **extra)

    return emit


def _reduce(onnx_op: str, axes_input_since: int = 18) -> Emitter:
    def emit(w: _Writer, node, args, outs):
        a = node["attrs"]
        axes = a["axis"]
        if axes is None:
            w.add(onnx_op, args[:1], outs, node["name"], keepdims=int(a["keepdims"]))
        elif w.opset >= axes_input_since:
            w.add(onnx_op, [args[0], w.ints(axes, "axes")], outs, node["name"], keepdims=int(a["keepdims"]))
        else:
            w.add(onnx_op, args[:1], outs, node["name"], axes=axes, keepdims=int(a["keepdims"]))

    return emit


def _clip(w: _Writer, node, args, outs):
    low, high = (w.scalar(node["args"][i]["prim"], node, "bound") for i in (1, 2))
    w.add("Clip", [args[0], low, high], outs, node["name"])


def _reshape(w: _Writer, node, args, outs):
    # Also squeeze, expand_dims and flatten: shapes are static, so the output's shape says it all.
    shape = node["outputs"][0]["shape"]
    w.add("Reshape", [args[0], w.ints(shape, "shape")], outs, node["name"], **({"allowzero": 1} if 0 in shape else {}))


def _transpose(w: _Writer, node, args, outs):
    axes = node["attrs"]["axes"]
    w.add("Transpose", args[:1], outs, node["name"], **({"perm": axes} if axes is not None else {}))


def _split(w: _Writer, node, args, outs):
    axis = node["attrs"]["axis"]
    sizes = w.ints([o["shape"][axis] for o in node["outputs"]], "split")
    w.add("Split", [args[0], sizes], outs, node["name"], axis=axis)


def _layer_norm(w: _Writer, node, args, outs):
    a = node["attrs"]
    rank = len(node["outputs"][0]["shape"])
    w.add("LayerNormalization", args[:3], outs, node["name"], axis=min(axis % rank for axis in a["axes"]), epsilon=a["epsilon"])


def _batch_norm(w: _Writer, node, args, outs):
    # In inference the statistics outputs are the moving statistics, unchanged.
    w.add("BatchNormalization", args[:5], outs[:1], node["name"], epsilon=node["attrs"]["epsilon"])
    for out, statistic in zip(outs[1:], args[3:5]):
        w.add("Identity", [statistic], [out], node["name"])


def _take(w: _Writer, node, args, outs):
    w.add("Gather", args[:2], outs, node["name"], axis=node["attrs"]["axis"] if node["attrs"]["axis"] is not None else 0)


def _cast(w: _Writer, node, args, outs):
    w.add("Cast", args[:1], outs, node["name"], to=helper.np_dtype_to_tensor_dtype(np.dtype(node["attrs"]["dtype"])))


def _strided_slice(w: _Writer, node, args, outs):
    axes, begin, end, *strides = ([item["prim"] for item in arg["tuple"]] for arg in node["args"][1:])
    steps = strides[0] if strides else [1] * len(axes)
    inputs = [w.ints(values, hint) for values, hint in ((begin, "starts"), (end, "ends"), (axes, "axes"), (steps, "steps"))]
    w.add("Slice", [args[0], *inputs], outs, node["name"])


def _flip(w: _Writer, node, args, outs):
    ends = np.iinfo(np.int64).min  # past the start, whatever the axis' length
    inputs = [w.ints(values, hint) for values, hint in (([-1], "starts"), ([ends], "ends"), ([node["attrs"]["axis"]], "axes"), ([-1], "steps"))]
    w.add("Slice", [args[0], *inputs], outs, node["name"])


def _expand(w: _Writer, node, args, outs):
    w.add("Expand", [args[0], w.ints(node["outputs"][0]["shape"], "shape")], outs, node["name"])


def _cumsum(w: _Writer, node, args, outs):
    a = node["attrs"]
    source = args[0]
    if a["dtype"] is not None and a["dtype"] != value_spec(w.graph, node["args"][0])["dtype"]:
        source = w.fresh(f"{node['name']}_cast")
        w.add("Cast", args[:1], [source], node["name"], to=helper.np_dtype_to_tensor_dtype(np.dtype(a["dtype"])))
    w.add("CumSum", [source, w.ints(a["axis"], "axis")], outs, node["name"], exclusive=int(a["exclusive"]))


def _prelu(w: _Writer, node, args, outs):
    # ONNX broadcasts the slope from the right: (C,) becomes (C, 1, ..., 1) up to the last axis.
    rank = len(node["outputs"][0]["shape"])
    channels = value_spec(w.graph, node["args"][1])["shape"][0]
    slope_shape = [channels] + [1] * (rank - 1 - node["attrs"]["axis"] % rank)
    w.chain(node, [("Reshape", [args[1], w.ints(slope_shape, "slope_shape")]), ("PRelu", [args[0], None])], outs)


def _trilu(upper: int) -> Emitter:
    def emit(w: _Writer, node, args, outs):
        w.add("Trilu", [args[0], w.ints(node["args"][1]["prim"], "k")], outs, node["name"], upper=upper)

    return emit


def _gelu(approximate: str) -> Emitter:
    def emit(w: _Writer, node, args, outs):
        x = args[0]
        if w.opset >= 20:
            w.add("Gelu", [x], outs, node["name"], **({"approximate": "tanh"} if approximate == "tanh" else {}))
            return
        # Before opset 20: the forms onnxruntime's GeluFusion and FastGeluFusion recognise.
        c = lambda value: w.scalar(value, node)  # noqa: E731
        if approximate == "tanh":
            steps = [("Pow", [x, c(3.0)]), ("Mul", [None, c(0.044715)]), ("Add", [x, None]),
                     ("Mul", [None, c(np.sqrt(2.0 / np.pi))]), ("Tanh", [None]), ("Add", [None, c(1.0)]),
                     ("Mul", [x, None]), ("Mul", [None, c(0.5)])]
        else:
            steps = [("Div", [x, c(np.sqrt(2.0))]), ("Erf", [None]), ("Add", [None, c(1.0)]),
                     ("Mul", [x, None]), ("Mul", [None, c(0.5)])]
        w.chain(node, steps, outs)

    return emit


def _silu(w: _Writer, node, args, outs):
    w.chain(node, [("Sigmoid", args[:1]), ("Mul", [args[0], None])], outs)


def _rsqrt(w: _Writer, node, args, outs):
    w.chain(node, [("Sqrt", args[:1]), ("Reciprocal", [None])], outs)


def _square(w: _Writer, node, args, outs):
    w.add("Mul", [args[0], args[0]], outs, node["name"])


def _not_equal(w: _Writer, node, args, outs):
    w.chain(node, [("Equal", args), ("Not", [None])], outs)


def _scatter(onnx_op: str) -> Emitter:
    def emit(w: _Writer, node, args, outs):
        a = node["attrs"]
        extra = {"axis": a["axis"]} if "axis" in a else {}
        w.add(onnx_op, args[:3], outs, node["name"], reduction=_REDUCTIONS[a["reduction"]], **extra)

    return emit


_REDUCTIONS = {"update": "none", "add": "add", "mul": "mul", "min": "min", "max": "max"}


# ---------------------------------------------------------------- checks: what ONNX cannot express
_LAYOUTS = {1: ("NCW", "OIW", "IOW"), 2: ("NCHW", "OIHW", "IOHW"), 3: ("NCDHW", "OIDHW", "IODHW")}


def _layout(rank: int, transposed: bool = False) -> Check:
    data, kernel = _LAYOUTS[rank][0], _LAYOUTS[rank][2 if transposed else 1]

    def check(call) -> str | None:
        attrs = call.attrs
        layout = getattr(attrs, "data_layout", None) or attrs.layout
        kernel_layout = getattr(attrs, "kernel_layout", kernel)
        out_layout = getattr(attrs, "out_layout", None) or layout
        if (layout, kernel_layout, out_layout) != (data, kernel, data):
            return f"layout {layout}/{kernel_layout} to {out_layout}; ONNX takes {data}/{kernel} to {data}"
        return _same_dtype(call)

    return check


def _trailing_axes(call) -> str | None:
    rank = call.args[0].ty.ndim
    axes = sorted(int(a) % rank for a in call.attrs.axes)
    if axes != list(range(axes[0], rank)):
        return "ONNX LayerNormalization normalises trailing axes"
    return None if call.attrs.center and call.attrs.scale else "layer_norm without center or scale"


def _inference_batch_norm(call) -> str | None:
    attrs = call.attrs
    if attrs.training:
        return "batch_norm in training mode"
    if not (attrs.center and attrs.scale):
        return "batch_norm without center or scale"
    return None if int(attrs.axis) % call.args[0].ty.ndim == 1 else "ONNX BatchNormalization normalises axis 1"


def _gather(call) -> str | None:
    return None if call.attrs.mode in ("fast", "clip", "wrap") else f"take mode {call.attrs.mode}"


def _axis_given(call) -> str | None:
    return None if call.attrs.axis is not None else f"{call.op.name} over the flattened tensor; ONNX takes one axis"


def _some_axes(call) -> str | None:
    axes = call.attrs.axis
    return "a reduction over no axes" if axes is not None and len(axes) == 0 else None


def _integers(call) -> str | None:
    dtype = dtype_name(call.args[0].ty)
    return None if "int" in dtype else f"floor_mod of {dtype}; ONNX Mod floors only integers (fmod=0)"


def _same_dtype(call) -> str | None:
    out_dtype = getattr(call.attrs, "out_dtype", None)
    if out_dtype is None or str(out_dtype) in ("", "void", dtype_name(call.args[0].ty)):
        return None
    return f"out_dtype {out_dtype}; ONNX {call.op.name.rsplit('.', 1)[-1]} keeps the input's dtype"


def _dilated_since_19(call) -> int:
    return 19 if any(int(d) != 1 for d in call.attrs.dilation) else OPSET


def _since_18(call) -> int:
    return 18


def _known_reduction(call) -> str | None:
    reduction = call.attrs.reduction
    return None if reduction in _REDUCTIONS else f"reduction {reduction!r}; ONNX takes {', '.join(_REDUCTIONS)}"


@dataclass(frozen=True)
class Translation:
    """How a Relax op is written in ONNX: `onnx_op` is the op whose schema's type constraints its
    tensors must meet (the main one where the emitter writes several), `check` what ONNX cannot
    express beyond types, `opset` the opset a call needs where some forms need a newer one."""

    onnx_op: str
    emit: Emitter
    check: Check | None = None
    opset: Callable[[relax.Call], int] | None = None


def _same(onnx_op: str, **attrs) -> Translation:
    return Translation(onnx_op, _same_op(onnx_op, **attrs))


_ELEMENTWISE = {
    "relax.add": "Add", "relax.subtract": "Sub", "relax.multiply": "Mul", "relax.divide": "Div", "relax.power": "Pow",
    "relax.maximum": "Max", "relax.minimum": "Min", "relax.nn.relu": "Relu", "relax.sigmoid": "Sigmoid",
    "relax.tanh": "Tanh", "relax.exp": "Exp", "relax.log": "Log", "relax.erf": "Erf", "relax.sqrt": "Sqrt",
    "relax.abs": "Abs", "relax.negative": "Neg", "relax.sign": "Sign", "relax.floor": "Floor", "relax.ceil": "Ceil",
    "relax.round": "Round", "relax.sin": "Sin", "relax.cos": "Cos", "relax.tan": "Tan", "relax.asin": "Asin",
    "relax.acos": "Acos", "relax.atan": "Atan", "relax.sinh": "Sinh", "relax.cosh": "Cosh", "relax.asinh": "Asinh",
    "relax.acosh": "Acosh", "relax.atanh": "Atanh", "relax.isnan": "IsNaN", "relax.isinf": "IsInf",
    "relax.less": "Less", "relax.greater": "Greater", "relax.equal": "Equal", "relax.less_equal": "LessOrEqual",
    "relax.greater_equal": "GreaterOrEqual", "relax.logical_and": "And", "relax.logical_or": "Or",
    "relax.logical_xor": "Xor", "relax.logical_not": "Not", "relax.where": "Where",
}

TRANSLATIONS: dict[str, Translation] = {
    **{op: _same(onnx_op) for op, onnx_op in _ELEMENTWISE.items()},
    "relax.matmul": Translation("MatMul", _same_op("MatMul"), _same_dtype),
    "relax.mod": _same("Mod", fmod=1),  # truncated, as C's fmod: Relax's mod
    "relax.floor_mod": Translation("Mod", _same_op("Mod", fmod=0), _integers),
    "relax.rsqrt": Translation("Sqrt", _rsqrt),
    "relax.square": Translation("Mul", _square),
    "relax.not_equal": Translation("Equal", _not_equal),
    "relax.nn.silu": Translation("Sigmoid", _silu),
    "relax.nn.gelu": Translation("Gelu", _gelu("none")),
    "relax.nn.gelu_tanh": Translation("Gelu", _gelu("tanh")),
    "relax.nn.leakyrelu": Translation("LeakyRelu", _attr_op("LeakyRelu", alpha="alpha")),
    "relax.nn.prelu": Translation("PRelu", _prelu),
    "relax.nn.softmax": Translation("Softmax", _attr_op("Softmax", axis="axis")),
    "relax.nn.log_softmax": Translation("LogSoftmax", _attr_op("LogSoftmax", axis="axis")),
    "relax.nn.layer_norm": Translation("LayerNormalization", _layer_norm, _trailing_axes),
    "relax.nn.batch_norm": Translation("BatchNormalization", _batch_norm, _inference_batch_norm),
    **{f"relax.nn.conv{r}d": Translation("Conv", _conv("Conv"), _layout(r)) for r in (1, 2, 3)},
    **{f"relax.nn.conv{r}d_transpose": Translation("ConvTranspose", _conv("ConvTranspose"), _layout(r, True)) for r in (1, 2)},
    **{f"relax.nn.max_pool{r}d": Translation("MaxPool", _pool("MaxPool"), _layout(r)) for r in (1, 2, 3)},
    **{f"relax.nn.avg_pool{r}d": Translation("AveragePool", _pool("AveragePool"), _layout(r), _dilated_since_19) for r in (1, 2, 3)},
    "relax.clip": Translation("Clip", _clip),
    **{f"relax.{op}": Translation(f"Reduce{op.title()}", _reduce(f"Reduce{op.title()}"), _some_axes)
       for op in ("mean", "max", "min", "prod")},
    "relax.sum": Translation("ReduceSum", _reduce("ReduceSum", axes_input_since=13), _some_axes),
    "relax.argmax": Translation("ArgMax", _attr_op("ArgMax", axis="axis", keepdims="keepdims"), _axis_given),
    "relax.argmin": Translation("ArgMin", _attr_op("ArgMin", axis="axis", keepdims="keepdims"), _axis_given),
    "relax.cumsum": Translation("CumSum", _cumsum, _axis_given),
    **{f"relax.{op}": Translation("Reshape", _reshape) for op in ("reshape", "expand_dims", "squeeze", "flatten")},
    "relax.permute_dims": Translation("Transpose", _transpose),
    "relax.concat": Translation("Concat", _attr_op("Concat", axis="axis")),
    "relax.split": Translation("Split", _split),
    "relax.strided_slice": Translation("Slice", _strided_slice),
    "relax.broadcast_to": Translation("Expand", _expand),
    "relax.take": Translation("Gather", _take, _gather),
    "relax.gather_elements": Translation("GatherElements", _attr_op("GatherElements", axis="axis")),
    "relax.gather_nd": Translation("GatherND", _attr_op("GatherND", batch_dims="batch_dims")),
    "relax.scatter_elements": Translation("ScatterElements", _scatter("ScatterElements"), _known_reduction),
    "relax.scatter_nd": Translation("ScatterND", _scatter("ScatterND"), _known_reduction),
    "relax.flip": Translation("Slice", _flip),
    **{f"relax.bitwise_{op}": Translation(f"Bitwise{op.title()}", _same_op(f"Bitwise{op.title()}"), opset=_since_18)
       for op in ("and", "or", "xor", "not")},
    "relax.triu": Translation("Trilu", _trilu(1)),
    "relax.tril": Translation("Trilu", _trilu(0)),
    "relax.astype": Translation("Cast", _cast),
}


def _onnx_type(dtype: str) -> str:
    return f"tensor({onnx.TensorProto.DataType.Name(helper.np_dtype_to_tensor_dtype(np.dtype(dtype))).lower()})"


def _schema_types(onnx_op: str) -> Check:
    """The tensors of a call against the type constraints of the ONNX op's inputs and outputs,
    by position (a variadic last input takes the rest)."""
    schema = defs.get_schema(onnx_op, LATEST_OPSET)
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}

    def constraint(params, index: int):
        if index >= len(params) and not (params and params[-1].option == defs.OpSchema.FormalParameterOption.Variadic):
            return None
        type_str = params[min(index, len(params) - 1)].type_str
        return allowed.get(type_str, {type_str})

    def check(call) -> str | None:
        roles = [("input", [t for arg in call.args for t in tensor_types(arg.ty)], schema.inputs),
                 ("output", tensor_types(call.ty), schema.outputs)]
        for role, types, params in roles:
            for index, ty in enumerate(types):
                accepted = constraint(params, index)
                if accepted is not None and _onnx_type(dtype_name(ty)) not in accepted:
                    return f"{role} {index} has dtype {dtype_name(ty)}, which ONNX {onnx_op} does not take"
        return None

    return check


def _checked(translation: Translation, opset: int) -> Check:
    checks = [_schema_types(translation.onnx_op), *([translation.check] if translation.check else [])]
    if translation.opset is not None:
        checks.append(_written_at(translation, opset))

    def check(call) -> str | None:
        return next((reason for one in checks if (reason := one(call)) is not None), None)

    return check


def _written_at(translation: Translation, opset: int) -> Check:
    def check(call) -> str | None:
        needed = translation.opset(call)
        return None if needed <= opset else f"ONNX {translation.onnx_op} takes this form from opset {needed}; the region is written at {opset}"

    return check


def onnx_checks(opset: int = OPSET) -> dict[str, Check]:
    """Each translation's check (why not, or None) for regions written at `opset`."""
    return {op: _checked(t, opset) for op, t in TRANSLATIONS.items()}


# The views the vendors read: emitters, checks for the default opset and, for vendors whose
# ONNX importer gates ops by version, the ONNX op each Relax op becomes.
EMITTERS: dict[str, Emitter] = {op: t.emit for op, t in TRANSLATIONS.items()}
ONNX_CHECKS: dict[str, Check] = onnx_checks(OPSET)
ONNX_OPS: dict[str, str] = {op: t.onnx_op for op, t in TRANSLATIONS.items()}


def _value_info(name: str, spec: Mapping[str, Any]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(spec["dtype"])), spec["shape"])


def graph_to_onnx(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], opset: int = OPSET) -> onnx.ModelProto:
    """The region as an ONNX model of the default domain at `opset` (17 to 20)."""
    writer = _Writer(graph, opset)
    for node in graph["nodes"]:
        args = [writer.tensor(ref) for arg in node["args"] for ref in tensor_refs(arg)]
        outs = [f"n{node['id']}_{i}" for i in range(len(node["outputs"]))]
        EMITTERS[node["op"]](writer, node, args, outs)
    # A node's result is renamed to the output it is; an output that is a region input, a
    # constant or another output's tensor is an Identity (onnxruntime keeps an Identity whose
    # input other nodes read too: one more copy per run).
    outputs = [f"output{position}" for position in range(len(graph["outputs"]))]
    renamed: dict[str, str] = {}
    for name, ref in zip(outputs, graph["outputs"]):
        tensor = writer.tensor(ref)
        if "node" in ref and tensor not in renamed:
            renamed[tensor] = name
        else:
            writer.add("Identity", [renamed.get(tensor, tensor)], [name], "output")
    for onnx_node in writer.nodes:
        for field in (onnx_node.input, onnx_node.output):
            field[:] = [renamed.get(name, name) for name in field]
    output_specs = [value_spec(graph, ref) for ref in graph["outputs"]]
    onnx_graph = helper.make_graph(
        writer.nodes,
        graph["symbol"],
        [_value_info(f"input{i}", spec) for i, spec in enumerate(graph["inputs"])],
        [_value_info(name, spec) for name, spec in zip(outputs, output_specs)],
        [*(numpy_helper.from_array(np.require(constants[name], requirements="C"), name) for name in graph["constants"]), *writer.initializers],
    )
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(onnx_graph, opset_imports=opsets, producer_name="byoc")
    model.ir_version = helper.find_min_ir_version_for(opsets)  # 8 for opset 17, 9 for 20
    return model
