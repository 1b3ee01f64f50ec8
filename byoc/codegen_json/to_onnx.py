"""JSON graph -> ONNX model: byoc's hand-off to vendors whose libraries import ONNX (ONNX
Runtime: one inference session per region; TensorRT: its ONNX parser builds the engine's network;
plugin vendors that build their engines from ONNX). See docs/onnx-handoff.md.

A vendor claims ops with `onnx_checks(opset)` and builds its engine from
`graph_to_onnx(graph, constants, opset)`; `onnx_op_table(opset)` lists what is written, when, and
at which opsets. One declaration per Relax op (`TRANSLATIONS`): the ONNX op it becomes, its
emitter, what ONNX cannot express of it (a `Limit`: a check returning the reason, with its rule in
words) and the opset a form of it needs (`Since`). Every check also holds the op's tensors to the
type constraints of the ONNX op's schema, so an int64 `exp` or int32 GatherND indices stay on the
host with the reason rather than failing in the vendor's importer.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import tvm
from onnx import defs, helper, numpy_helper
from tvm import relax

from byoc.codegen_json.references import tensor_refs, value_spec
from byoc.codegen_json.symbolic_dims import fold
from byoc.codegen_json.to_relax import graph_to_relax
from byoc.errors import CodegenError
from byoc.ir.quantization import dequantize_array
from byoc.ir.types import dtype_name, static_shape, tensor_types

OPSET = 17  # the default: what TensorRT 8.5's ONNX parser reads
LATEST_OPSET = 20  # what torch.onnx writes; ONNX Gelu arrived in 20, axes as an input of every Reduce op in 18
OPSETS = range(OPSET, LATEST_OPSET + 1)  # the opsets written; the tests write 17 and 20

Node = Mapping[str, Any]
Check = Callable[[relax.Call], "str | None"]


# Symbolic dimensions' operations on int64 tensors (dimensions are positive: Div truncates as //).
_DIM_OPS: dict[type, tuple[str, dict]] = {ast.Add: ("Add", {}), ast.Sub: ("Sub", {}), ast.Mult: ("Mul", {}),
                                          ast.FloorDiv: ("Div", {}), ast.Mod: ("Mod", {"fmod": 0})}


class _Writer:
    def __init__(self, graph: Mapping[str, Any], opset: int) -> None:
        self.graph = graph
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.counter = 0
        self.where = f"region {graph['symbol']} ({graph['backend']})"
        self._dims: dict[str, str] = {}  # symbolic dimension -> the tensor holding its value
        self._shapes: dict[tuple, str] = {}  # symbolic values -> the tensor holding them

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}__{self.counter}"

    def constant(self, value: np.ndarray, hint: str) -> str:
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.require(value, requirements="C"), name))
        return name

    def ints(self, values, hint: str) -> str:
        """An int64 tensor of `values`: a constant, or computed from the inputs' shapes where
        some are symbolic dimensions (see byoc.codegen_json.symbolic_dims)."""
        if isinstance(values, (list, tuple)) and any(isinstance(v, str) for v in values):
            return self._symbolic_ints(list(values), hint)
        if isinstance(values, str):
            raise CodegenError(f"{self.where}: {hint} {values!r} is a symbolic dimension where a constant is needed")
        return self.constant(np.array(values, dtype=np.int64), hint)

    def _symbolic_ints(self, values: list[int | str], hint: str) -> str:
        """The values computed once per graph (each layer's reshapes share their target)."""
        key = tuple(values)
        if key not in self._shapes:
            self._shapes[key] = self._computed_ints(values, hint)
        return self._shapes[key]

    def _computed_ints(self, values: list[int | str], hint: str) -> str:
        pieces: list[str] = []
        static: list[int] = []
        for value in values:
            if isinstance(value, str):
                if static:
                    pieces.append(self.constant(np.array(static, np.int64), hint))
                    static = []
                pieces.append(self.dim(value))
            else:
                static.append(value)
        if static:
            pieces.append(self.constant(np.array(static, np.int64), hint))
        if len(pieces) == 1:
            return pieces[0]
        name = self.fresh(hint)
        self.add("Concat", pieces, [name], hint, axis=0)
        return name

    def dim(self, text: str) -> str:
        """A symbolic dimension's value as an int64 tensor of one element, computed once per
        graph: a name is read off the first input that has it as a dimension (`Shape` of that
        axis), an expression is computed from those."""
        if text in self._dims:
            return self._dims[text]

        def name(key: str) -> str:
            if key in self._dims:
                return self._dims[key]
            for position, spec in enumerate(self.graph["inputs"]):
                if key in spec["shape"]:
                    axis = spec["shape"].index(key)
                    out = self._dims[key] = self.fresh(f"dim_{key}")
                    self.add("Shape", [f"input{position}"], [out], f"dim_{key}", start=axis, end=axis + 1)
                    return out
            raise CodegenError(f"{self.where}: dimension {key!r} is no input's dimension, so the region cannot compute it")

        def binary(op: type, a: str, b: str) -> str:
            out = self.fresh("dim")
            self.add(_DIM_OPS[op][0], [a, b], [out], "dim", **_DIM_OPS[op][1])
            return out

        self._dims[text] = fold(text, name, lambda value: self.constant(np.array([value], np.int64), "dim"), binary)
        return self._dims[text]

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

    def prim(self, ref: Mapping[str, Any], dtype: str, hint: str) -> str:
        """A value argument (`{"prim": ...}`) as a scalar tensor of `dtype`: a constant, or a
        symbolic dimension computed as `dim` does."""
        if not isinstance(ref["prim"], str):
            return self.constant(np.array(ref["prim"], dtype=dtype), hint)
        scalar = self.fresh(hint)
        self.add("Squeeze", [self.dim(ref["prim"])], [scalar], hint)
        if np.dtype(dtype) == np.int64:
            return scalar
        cast = self.fresh(hint)
        self.add("Cast", [scalar], [cast], hint, to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
        return cast

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


def _onnx_window(data: Sequence[int], out: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
                 dilation: Sequence[int], padding: Sequence[int], ceil: bool) -> tuple[list[int], bool] | None:
    """ONNX `pads` and `ceil_mode` for a Relax pooling over spatial sizes `data` to `out`, or None
    where ONNX cannot express it.

    In ceil mode Relax drops a last window that would start in the end padding, as PyTorch does;
    ONNX's shape rule before opset 22 keeps it, so onnx's checker refuses the model and an
    importer that follows the rule makes one more window (onnxruntime's kernel drops it, whatever
    the declared shape). Such a pooling is written in floor mode, with each end padding cut to
    where the last window ends: every window then lies inside the padded input, so averages divide
    as Relax's do. Where another axis keeps a last window that reaches past its end padding,
    neither mode expresses both.
    """
    if not ceil:
        return list(padding), False
    rank = len(kernel)
    begin, end = padding[:rank], padding[rank:]
    spans = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    onnx_sizes = [-(-(n + b + e - span) // s) + 1 for n, b, e, span, s in zip(data, begin, end, spans, strides)]
    if onnx_sizes == list(out):
        return list(padding), True
    cut = [max(0, (o - 1) * s + span - n - b) for o, s, span, n, b in zip(out, strides, spans, data, begin)]
    return ([*begin, *cut], False) if all(c <= e for c, e in zip(cut, end)) else None


def _pool(op_type: str) -> Emitter:
    def emit(w: _Writer, node, args, outs):
        a = node["attrs"]
        rank = len(a["pool_size"])
        data = value_spec(w.graph, node["args"][0])["shape"][-rank:]
        window = _onnx_window(data, node["outputs"][0]["shape"][-rank:], a["pool_size"], a["strides"], a["dilation"],
                              a["padding"], a["ceil_mode"])
        assert window is not None, "graph_to_onnx checks each node before it is written"
        pads, ceil = window
        if op_type == "MaxPool":
            extra = {"dilations": a["dilation"]}
        else:  # AveragePool takes dilations from opset 19 (its `Since`): an undilated one writes none
            extra = {"count_include_pad": int(a["count_include_pad"])}
            if any(d != 1 for d in a["dilation"]):
                extra["dilations"] = a["dilation"]
        w.add(op_type, args[:1], outs, node["name"], kernel_shape=a["pool_size"], strides=a["strides"], pads=pads,
              ceil_mode=int(ceil), **extra)

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


def _variance(w: _Writer, node, args, outs):
    # The mean of the squared deviations from the mean (ONNX has no variance op).
    mean, deviation, squared = (w.fresh(f"{node['name']}_{part}") for part in ("mean", "deviation", "squared"))
    reduce_mean = _reduce("ReduceMean")
    reduce_mean(w, {**node, "attrs": {**node["attrs"], "keepdims": True}}, args, [mean])
    w.add("Sub", [args[0], mean], [deviation], node["name"])
    w.add("Mul", [deviation, deviation], [squared], node["name"])
    reduce_mean(w, node, [squared], outs)


def _clip(w: _Writer, node, args, outs):
    low, high = (w.scalar(node["args"][i]["prim"], node, "bound") for i in (1, 2))
    w.add("Clip", [args[0], low, high], outs, node["name"])


def _reshape(w: _Writer, node, args, outs):
    # Also squeeze, expand_dims and flatten: the output's shape says it all. A symbolic one is
    # written with 0 (the input's dimension) and -1 (what the size leaves) where they say it, so
    # that no shape is computed at run time (transformers' head reshapes).
    shape = node["outputs"][0]["shape"]
    if any(isinstance(d, str) for d in shape) and 0 not in shape:
        data = value_spec(w.graph, node["args"][0])["shape"]
        shape = [0 if isinstance(d, str) and i < len(data) and data[i] == d else d for i, d in enumerate(shape)]
        if sum(isinstance(d, str) for d in shape) == 1:
            shape = [-1 if isinstance(d, str) else d for d in shape]
    w.add("Reshape", [args[0], w.ints(shape, "shape")], outs, node["name"], **({"allowzero": 1} if 0 in node["outputs"][0]["shape"] else {}))


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


def _arange(w: _Writer, node, args, outs):
    dtype = node["outputs"][0]["dtype"]
    bounds = [w.prim(ref, dtype, hint) for ref, hint in zip(node["args"], ("start", "limit", "delta"))]
    w.add("Range", bounds, outs, node["name"])


def _flip(w: _Writer, node, args, outs):
    ends = np.iinfo(np.int64).min  # past the start, whatever the axis' length
    inputs = [w.ints(values, hint) for values, hint in (([-1], "starts"), ([ends], "ends"), ([node["attrs"]["axis"]], "axes"), ([-1], "steps"))]
    w.add("Slice", [args[0], *inputs], outs, node["name"])


def _expand_target(w: _Writer, shape: Sequence, data: Sequence) -> str:
    # A symbolic dimension the input already has is written 1 (Expand keeps the input's).
    offset = len(shape) - len(data)
    return w.ints([1 if isinstance(d, str) and i >= offset and data[i - offset] == d else d for i, d in enumerate(shape)], "shape")


def _expand(w: _Writer, node, args, outs):
    shape = node["outputs"][0]["shape"]
    w.add("Expand", [args[0], _expand_target(w, shape, value_spec(w.graph, node["args"][0])["shape"])], outs, node["name"])


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}  # Relax -> ONNX


def _pad(w: _Writer, node, args, outs):
    a = node["attrs"]
    widths = list(a["pad_width"])  # (before, after) per axis; ONNX lists every before, then every after
    inputs = [args[0], w.ints(widths[0::2] + widths[1::2], "pads")]
    if a["pad_mode"] == "constant":
        inputs.append(w.constant(np.array(a["pad_value"], dtype=node["outputs"][0]["dtype"]), "pad_value"))
    w.add("Pad", inputs, outs, node["name"], mode=_PAD_MODES[a["pad_mode"]])


def _index_tensor(w: _Writer, node, args, outs):
    # x[i0, i1, ...] on the leading axes (PyTorch's advanced indexing, as in transformers'
    # attention masks): GatherND of the indices broadcast to one shape and stacked on a new last axis.
    specs = [value_spec(w.graph, ref) for ref in tensor_refs(node["args"][1])]
    out = node["outputs"][0]["shape"]
    kept = len(value_spec(w.graph, node["args"][0])["shape"]) - len(specs)  # the data's axes not indexed
    common = list(out[: len(out) - kept])
    stacked, last_axis = [], w.ints([-1], "axes")
    for spec, index in zip(specs, args[1:]):
        if list(spec["shape"]) != common:
            broadcast = w.fresh(f"{node['name']}_broadcast")
            w.add("Expand", [index, _expand_target(w, common, spec["shape"])], [broadcast], node["name"])
            index = broadcast
        column = w.fresh(f"{node['name']}_column")
        w.add("Unsqueeze", [index, last_axis], [column], node["name"])
        stacked.append(column)
    indices = w.fresh(f"{node['name']}_indices")
    w.add("Concat", stacked, [indices], node["name"], axis=-1)
    w.add("GatherND", [args[0], indices], outs, node["name"])


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


def _gelu_steps(approximate: str, x: str, c: Callable[[float], str]) -> list[tuple[str, list[str | None]]]:
    """GELU before opset 20: the forms onnxruntime's GeluFusion and FastGeluFusion recognise."""
    if approximate == "tanh":
        return [("Pow", [x, c(3.0)]), ("Mul", [None, c(0.044715)]), ("Add", [x, None]), ("Mul", [None, c(np.sqrt(2.0 / np.pi))]),
                ("Tanh", [None]), ("Add", [None, c(1.0)]), ("Mul", [x, None]), ("Mul", [None, c(0.5)])]
    return [("Div", [x, c(np.sqrt(2.0))]), ("Erf", [None]), ("Add", [None, c(1.0)]), ("Mul", [x, None]), ("Mul", [None, c(0.5)])]


def _gelu(approximate: str) -> Emitter:
    def emit(w: _Writer, node, args, outs):
        if w.opset >= 20:
            w.add("Gelu", args[:1], outs, node["name"], **({"approximate": "tanh"} if approximate == "tanh" else {}))
        else:
            w.chain(node, _gelu_steps(approximate, args[0], lambda value: w.scalar(value, node)), outs)

    return emit


def _gelu_writes(approximate: str) -> Callable[[int], tuple[str, ...]]:
    chain = tuple(dict.fromkeys(op for op, _ in _gelu_steps(approximate, "x", str)))
    return lambda opset: ("Gelu",) if opset >= 20 else chain


def _silu(w: _Writer, node, args, outs):
    w.chain(node, [("Sigmoid", args[:1]), ("Mul", [args[0], None])], outs)


def _rsqrt(w: _Writer, node, args, outs):
    w.chain(node, [("Sqrt", args[:1]), ("Reciprocal", [None])], outs)


def _square(w: _Writer, node, args, outs):
    w.add("Mul", [args[0], args[0]], outs, node["name"])


def _isfinite(w: _Writer, node, args, outs):
    infinite, nan, either = (w.fresh(f"{node['name']}_{hint}") for hint in ("IsInf", "IsNaN", "Or"))
    w.add("IsInf", args[:1], [infinite], node["name"])
    w.add("IsNaN", args[:1], [nan], node["name"])
    w.add("Or", [infinite, nan], [either], node["name"])
    w.add("Not", [either], outs, node["name"])


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
@dataclass(frozen=True)
class Limit:
    """What ONNX cannot express of an op: `reason(call)` says why a call is refused (None: it is
    not), `rule` says in words which calls pass (the op table prints it)."""

    rule: str
    reason: Check

    def __call__(self, call: relax.Call) -> str | None:
        return self.reason(call)


def _limit(rule: str) -> Callable[[Check], Limit]:
    return lambda reason: Limit(rule, reason)


@_limit("out_dtype unset or the input's")
def _same_dtype(call) -> str | None:
    out_dtype = getattr(call.attrs, "out_dtype", None)
    if out_dtype is None or str(out_dtype) in ("", "void", dtype_name(call.args[0].ty)):
        return None
    return f"out_dtype {out_dtype}; ONNX {call.op.name.rsplit('.', 1)[-1]} keeps the input's dtype"


_LAYOUTS = {1: ("NCW", "OIW", "IOW"), 2: ("NCHW", "OIHW", "IOHW"), 3: ("NCDHW", "OIDHW", "IODHW")}


def _layout_reason(call, data: str, kernel: str) -> str | None:
    attrs = call.attrs
    layout = getattr(attrs, "data_layout", None) or attrs.layout
    kernel_layout = getattr(attrs, "kernel_layout", kernel)  # pools have none
    out_layout = getattr(attrs, "out_layout", None) or layout
    if (layout, kernel_layout, out_layout) != (data, kernel, data):
        return f"layout {layout}/{kernel_layout} to {out_layout}; ONNX takes {data}/{kernel} to {data}"
    return _same_dtype(call)


def _conv_layout(rank: int, transposed: bool = False) -> Limit:
    data, kernel = _LAYOUTS[rank][0], _LAYOUTS[rank][2 if transposed else 1]
    return Limit(f"layout {data}/{kernel} to {data}; {_same_dtype.rule}", lambda call: _layout_reason(call, data, kernel))


def _ints(values) -> list[int]:
    return [int(v) for v in values]


def _pool_limit(rank: int) -> Limit:
    data, kernel = _LAYOUTS[rank][:2]

    def check(call) -> str | None:
        reason = _layout_reason(call, data, kernel)
        if reason is not None:
            return reason
        a = call.attrs
        spatial = [static_shape(e.ty)[-rank:] for e in (call.args[0], call)]
        if _onnx_window(*spatial, _ints(a.pool_size), _ints(a.strides), _ints(a.dilation), _ints(a.padding), bool(a.ceil_mode)) is None:
            return ("ceil_mode where one axis drops its last window (Relax, as PyTorch) and another's last window "
                    "reaches past its end padding; ONNX before opset 22 expresses neither in one pooling")
        return None

    return Limit(f"layout {data} to {data}; in ceil mode, no axis dropping its last window while another's reaches "
                 "past its end padding", check)


@_limit("trailing axes, with center and scale")
def _trailing_axes(call) -> str | None:
    rank = call.args[0].ty.ndim
    axes = sorted(int(a) % rank for a in call.attrs.axes)
    if axes != list(range(axes[0], rank)):
        return "ONNX LayerNormalization normalises trailing axes"
    return None if call.attrs.center and call.attrs.scale else "layer_norm without center or scale"


@_limit("inference mode, with center and scale, over axis 1")
def _inference_batch_norm(call) -> str | None:
    attrs = call.attrs
    if attrs.training:
        return "batch_norm in training mode"
    if not (attrs.center and attrs.scale):
        return "batch_norm without center or scale"
    return None if int(attrs.axis) % call.args[0].ty.ndim == 1 else "ONNX BatchNormalization normalises axis 1"


@_limit(f"mode {', '.join(_PAD_MODES)}")
def _pad_mode(call) -> str | None:
    mode = call.attrs.pad_mode
    return None if mode in _PAD_MODES else f"pad mode {mode!r}; written are {', '.join(_PAD_MODES)}"


@_limit("int64 indices")
def _int64_indices(call) -> str | None:
    dtypes = {dtype_name(t) for t in tensor_types(call.args[1].ty)}
    return None if dtypes == {"int64"} else f"indices of dtype {', '.join(sorted(dtypes))}; ONNX GatherND takes int64"


@_limit("mode fast, clip or wrap")
def _gather(call) -> str | None:
    return None if call.attrs.mode in ("fast", "clip", "wrap") else f"take mode {call.attrs.mode}"


@_limit("one axis given (not over the flattened tensor)")
def _axis_given(call) -> str | None:
    return None if call.attrs.axis is not None else f"{call.op.name} over the flattened tensor; ONNX takes one axis"


@_limit("axes unset (all) or at least one")
def _some_axes(call) -> str | None:
    axes = call.attrs.axis
    return "a reduction over no axes" if axes is not None and len(axes) == 0 else None


@_limit("integer dtypes only")
def _integers(call) -> str | None:
    dtype = dtype_name(call.args[0].ty)
    return None if "int" in dtype else f"floor_mod of {dtype}; ONNX Mod floors only integers (fmod=0)"


_REDUCTION_WORDS = ", ".join(_REDUCTIONS)


@_limit(f"reduction {_REDUCTION_WORDS}")
def _known_reduction(call) -> str | None:
    reduction = call.attrs.reduction
    return None if reduction in _REDUCTIONS else f"reduction {reduction!r}; ONNX takes {_REDUCTION_WORDS}"


@dataclass(frozen=True)
class Since:
    """The opset ONNX takes an op from, or one form of it (`form` in words, `applies` telling a
    call of that form)."""

    opset: int
    form: str = ""
    applies: Callable[[relax.Call], bool] = lambda call: True

    def reason(self, onnx_op: str, opset: int) -> str:
        if not self.form:
            return f"ONNX {onnx_op} arrived in opset {self.opset}; the region is written at {opset}"
        return f"ONNX {onnx_op} takes this form from opset {self.opset}; the region is written at {opset}"


def _dilated(call) -> bool:
    return any(int(d) != 1 for d in call.attrs.dilation)


@dataclass(frozen=True)
class Translation:
    """How a Relax op is written in ONNX: `onnx_op` is the op whose schema's type constraints its
    tensors must meet (the main one where the emitter writes several), `check` what ONNX cannot
    express beyond types, `since` the opset it or a form of it needs, `writes` the ONNX ops the
    emitter writes at an opset where that is more than `onnx_op`."""

    onnx_op: str
    emit: Emitter
    check: Limit | None = None
    since: Since | None = None
    writes: Callable[[int], tuple[str, ...]] | None = None

    def onnx_ops(self, opset: int) -> tuple[str, ...]:
        return self.writes(opset) if self.writes is not None else (self.onnx_op,)


def _same(onnx_op: str, **attrs) -> Translation:
    return Translation(onnx_op, _same_op(onnx_op, **attrs))


def _writes(*ops: str) -> Callable[[int], tuple[str, ...]]:
    return lambda opset: ops


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
    "relax.rsqrt": Translation("Sqrt", _rsqrt, writes=_writes("Sqrt", "Reciprocal")),
    "relax.square": Translation("Mul", _square),
    "relax.not_equal": Translation("Equal", _not_equal, writes=_writes("Equal", "Not")),
    "relax.isfinite": Translation("IsInf", _isfinite, writes=_writes("IsInf", "IsNaN", "Or", "Not")),
    "relax.nn.silu": Translation("Sigmoid", _silu, writes=_writes("Sigmoid", "Mul")),
    "relax.nn.gelu": Translation("Gelu", _gelu("none"), writes=_gelu_writes("none")),
    "relax.nn.gelu_tanh": Translation("Gelu", _gelu("tanh"), writes=_gelu_writes("tanh")),
    "relax.nn.leakyrelu": Translation("LeakyRelu", _attr_op("LeakyRelu", alpha="alpha")),
    "relax.nn.prelu": Translation("PRelu", _prelu, writes=_writes("Reshape", "PRelu")),
    "relax.nn.softmax": Translation("Softmax", _attr_op("Softmax", axis="axis")),
    "relax.nn.log_softmax": Translation("LogSoftmax", _attr_op("LogSoftmax", axis="axis")),
    "relax.nn.layer_norm": Translation("LayerNormalization", _layer_norm, _trailing_axes),
    "relax.nn.batch_norm": Translation("BatchNormalization", _batch_norm, _inference_batch_norm,
                                       writes=_writes("BatchNormalization", "Identity")),
    **{f"relax.nn.conv{r}d": Translation("Conv", _conv("Conv"), _conv_layout(r)) for r in (1, 2, 3)},
    **{f"relax.nn.conv{r}d_transpose": Translation("ConvTranspose", _conv("ConvTranspose"), _conv_layout(r, True)) for r in (1, 2)},
    **{f"relax.nn.max_pool{r}d": Translation("MaxPool", _pool("MaxPool"), _pool_limit(r)) for r in (1, 2, 3)},
    **{f"relax.nn.avg_pool{r}d": Translation("AveragePool", _pool("AveragePool"), _pool_limit(r), Since(19, "dilated", _dilated))
       for r in (1, 2, 3)},
    "relax.clip": Translation("Clip", _clip),
    **{f"relax.{op}": Translation(f"Reduce{op.title()}", _reduce(f"Reduce{op.title()}"), _some_axes)
       for op in ("mean", "max", "min", "prod")},
    "relax.variance": Translation("ReduceMean", _variance, _some_axes, writes=_writes("ReduceMean", "Sub", "Mul")),
    "relax.sum": Translation("ReduceSum", _reduce("ReduceSum", axes_input_since=13), _some_axes),
    "relax.argmax": Translation("ArgMax", _attr_op("ArgMax", axis="axis", keepdims="keepdims"), _axis_given),
    "relax.argmin": Translation("ArgMin", _attr_op("ArgMin", axis="axis", keepdims="keepdims"), _axis_given),
    "relax.cumsum": Translation("CumSum", _cumsum, _axis_given, writes=_writes("CumSum", "Cast")),
    **{f"relax.{op}": Translation("Reshape", _reshape) for op in ("reshape", "expand_dims", "squeeze", "flatten")},
    "relax.permute_dims": Translation("Transpose", _transpose),
    "relax.concat": Translation("Concat", _attr_op("Concat", axis="axis")),
    "relax.split": Translation("Split", _split),
    "relax.strided_slice": Translation("Slice", _strided_slice),
    "relax.broadcast_to": Translation("Expand", _expand),
    "relax.take": Translation("Gather", _take, _gather),
    "relax.gather_elements": Translation("GatherElements", _attr_op("GatherElements", axis="axis")),
    "relax.gather_nd": Translation("GatherND", _attr_op("GatherND", batch_dims="batch_dims")),
    "relax.index_tensor": Translation("GatherND", _index_tensor, _int64_indices, writes=_writes("Expand", "Unsqueeze", "Concat", "GatherND")),
    "relax.scatter_elements": Translation("ScatterElements", _scatter("ScatterElements"), _known_reduction),
    "relax.scatter_nd": Translation("ScatterND", _scatter("ScatterND"), _known_reduction),
    "relax.flip": Translation("Slice", _flip),
    "relax.nn.pad": Translation("Pad", _pad, _pad_mode),
    # Position ids (arange of the sequence length): constants in a static model, a Range over
    # the region's own dimension in a symbolic one.
    "relax.arange": Translation("Range", _arange),
    **{f"relax.bitwise_{op}": Translation(f"Bitwise{op.title()}", _same_op(f"Bitwise{op.title()}"), since=Since(18))
       for op in ("and", "or", "xor", "not")},
    "relax.triu": Translation("Trilu", _trilu(1)),
    "relax.tril": Translation("Trilu", _trilu(0)),
    "relax.astype": Translation("Cast", _cast),
    # A quantized model's own quantization, as the model wrote it: onnxruntime fuses
    # DequantizeLinear -> op -> QuantizeLinear into its int8 kernels.
    "relax.quantize": Translation("QuantizeLinear", _attr_op("QuantizeLinear", axis="axis")),
    "relax.dequantize": Translation("DequantizeLinear", _attr_op("DequantizeLinear", axis="axis")),
}


def _onnx_type(dtype: str) -> str:
    return f"tensor({onnx.TensorProto.DataType.Name(helper.np_dtype_to_tensor_dtype(np.dtype(dtype))).lower()})"


@functools.cache
def _schema(onnx_op: str) -> defs.OpSchema:
    return defs.get_schema(onnx_op, LATEST_OPSET)


def _allowed(schema: defs.OpSchema) -> dict[str, set[str]]:
    return {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}


def _schema_types(onnx_op: str) -> Check:
    """The tensors of a call against the type constraints of the ONNX op's inputs and outputs,
    by position (a variadic last input takes the rest)."""
    schema = _schema(onnx_op)
    allowed = _allowed(schema)

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


def _supported(opset: int) -> int:
    if opset not in OPSETS:
        raise CodegenError(f"ONNX opset {opset}: byoc's hand-off writes opsets {OPSET} to {LATEST_OPSET}")
    return opset


def _checked(translation: Translation, opset: int) -> Check:
    checks = [_schema_types(translation.onnx_op), *([translation.check] if translation.check else [])]
    since = translation.since
    if since is not None and opset < since.opset:
        checks.append(lambda call: since.reason(translation.onnx_op, opset) if since.applies(call) else None)

    def check(call) -> str | None:
        return next((reason for one in checks if (reason := one(call)) is not None), None)

    return check


@functools.cache
def _checks(opset: int) -> Mapping[str, Check]:
    return {op: _checked(t, opset) for op, t in TRANSLATIONS.items()}


def onnx_checks(opset: int = OPSET) -> dict[str, Check]:
    """Each translation's check (why not, or None) for regions written at `opset`: a vendor that
    takes ONNX claims each op with its check, as `backend.supports(op, check=...)`, adding its
    own limits before or after it."""
    return dict(_checks(_supported(opset)))


# The views the vendors read: emitters, checks for the default opset and, for vendors whose
# ONNX importer gates ops by version, the ONNX op each Relax op becomes.
EMITTERS: dict[str, Emitter] = {op: t.emit for op, t in TRANSLATIONS.items()}
ONNX_CHECKS: dict[str, Check] = onnx_checks(OPSET)
ONNX_OPS: dict[str, str] = {op: t.onnx_op for op, t in TRANSLATIONS.items()}


# ---------------------------------------------------------------- the op table: the data sheet of the hand-off
# The dtypes the table names (byoc's dtypes that ONNX has); "any" where the ONNX op takes them all.
_TABLE_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64")


@dataclass(frozen=True)
class OpEntry:
    """One Relax op of the hand-off at one opset: the ONNX ops written for it, the condition its
    check holds a call to (in words, beyond the dtypes), the dtypes of its data tensor that the
    ONNX op's type constraints allow, and the first and last opset it is written at."""

    relax_op: str
    onnx_ops: tuple[str, ...]
    condition: str
    dtypes: tuple[str, ...]
    opsets: tuple[int, int]


def _data_dtypes(onnx_op: str) -> tuple[str, ...]:
    # The data tensor: the first input whose type parameter allows more than one type (Where's
    # X after its bool condition), else the first.
    schema = _schema(onnx_op)
    allowed = _allowed(schema)
    types = [allowed.get(p.type_str, {p.type_str}) for p in schema.inputs]
    chosen = next((t for t in types if len(t) > 1), types[0])
    return tuple(d for d in _TABLE_DTYPES if _onnx_type(d) in chosen)


def _condition(translation: Translation) -> str:
    since = translation.since
    words = [translation.check.rule] if translation.check is not None else []
    if since is not None and since.form:
        words.append(f"{since.form}: from opset {since.opset}")
    return "; ".join(words) or "any call"


def onnx_op_table(opset: int = LATEST_OPSET) -> list[OpEntry]:
    """Every Relax op `graph_to_onnx` writes at `opset` (the ops `onnx_checks(opset)` covers), by
    name: what it becomes and when."""
    _supported(opset)
    return [OpEntry(op, t.onnx_ops(opset), _condition(t), _data_dtypes(t.onnx_op), (_first_opset(t), LATEST_OPSET))
            for op, t in sorted(TRANSLATIONS.items())]


def _first_opset(translation: Translation) -> int:
    since = translation.since
    return since.opset if since is not None and not since.form else OPSET


def op_table_markdown() -> str:
    """The op table as Markdown over every opset written, as docs/onnx-handoff.md shows it."""
    tables = {opset: onnx_op_table(opset) for opset in OPSETS}
    lines = ["| Relax op | ONNX ops | written when | dtypes | opsets |", "| --- | --- | --- | --- | --- |"]
    for position, entry in enumerate(tables[LATEST_OPSET]):
        by_ops: dict[tuple[str, ...], list[int]] = {}
        for opset in range(entry.opsets[0], entry.opsets[1] + 1):
            by_ops.setdefault(tables[opset][position].onnx_ops, []).append(opset)
        ops = "; ".join(", ".join(written) + (f" ({_span(opsets)})" if len(by_ops) > 1 else "") for written, opsets in by_ops.items())
        dtypes = "any" if entry.dtypes == _TABLE_DTYPES else ", ".join(entry.dtypes)
        lines.append(f"| `{entry.relax_op}` | {ops} | {entry.condition} | {dtypes} | {_span(list(range(entry.opsets[0], entry.opsets[1] + 1)))} |")
    return "\n".join(lines) + "\n"


def _span(opsets: list[int]) -> str:
    return str(opsets[0]) if len(opsets) == 1 else f"{opsets[0]}-{opsets[-1]}"


# ---------------------------------------------------------------- the hand-off
def _value_info(name: str, spec: Mapping[str, Any]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(spec["dtype"])), spec["shape"])


def _constants_as_inputs(graph: Mapping[str, Any]) -> dict[str, Any]:
    """The graph with its constants read as extra inputs of the same types. The checks read types,
    not values, so no weight is copied into TVM (and relax.const would narrow an int64 or float64
    array without a dtype to 32 bits)."""
    position = {name: len(graph["inputs"]) + i for i, name in enumerate(graph["constants"])}

    def ref(r: Mapping[str, Any]) -> Mapping[str, Any]:
        if "const" in r:
            return {"input": position[r["const"]]}
        return {"tuple": [ref(item) for item in r["tuple"]]} if "tuple" in r else r

    return {**graph, "constants": {},
            "inputs": [*graph["inputs"], *({"name": name, **spec} for name, spec in graph["constants"].items())],
            "nodes": [{**node, "args": [ref(arg) for arg in node["args"]]} for node in graph["nodes"]],
            "outputs": [ref(output) for output in graph["outputs"]]}


def _refuse_what_cannot_be_written(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], opset: int) -> None:
    """Every node's op has a translation and passes its check at `opset`, else a CodegenError
    naming the region, the op, the node and why: a vendor that claimed an op without the check
    gets the reason here rather than an invalid model from its importer."""
    where = f"region {graph['symbol']} ({graph['backend']})"
    for node in graph["nodes"]:
        if node["op"] not in TRANSLATIONS:
            raise CodegenError(
                f"{where}: {node['op']} (node {node['name']!r}) has no ONNX translation in byoc's hand-off; ops it "
                f"writes: see byoc.codegen_json.onnx_op_table(); claim only ops whose check in onnx_checks({opset}) passes")
    missing = [name for name in graph["constants"] if name not in constants]
    if missing:
        raise CodegenError(f"{where}: constants {missing} are not among the constants given")
    # The checks read Relax calls: the graph rebuilt, one binding per node, in order.
    bindings = graph_to_relax(_constants_as_inputs(graph), {}).body.blocks[0].bindings
    calls = [b.value for b in bindings if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]
    checks = _checks(opset)
    for node, call in zip(graph["nodes"], calls):
        reason = checks[node["op"]](call)
        if reason is not None:
            raise CodegenError(
                f"{where}: {node['op']} (node {node['name']!r}) cannot be written at ONNX opset {opset}: {reason}; "
                f"claim only ops whose check in onnx_checks({opset}) passes")


def _readers(nodes: list[onnx.NodeProto]) -> dict[str, list[onnx.NodeProto]]:
    """The nodes that read each tensor, by name."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def _producers(nodes: list[onnx.NodeProto]) -> dict[str, onnx.NodeProto]:
    """The node that writes each tensor, by name."""
    return {out: node for node in nodes for out in node.output}


def _bias_into_conv(writer: _Writer, constants: Mapping[str, np.ndarray], outputs: set[str], channels: Mapping[str, int]) -> None:
    """A Conv whose only reader adds a constant per output channel (Relax writes a convolution's
    bias as an add) takes it as its bias input. onnxruntime fuses the add itself only into a Conv
    whose weights are an initializer; a quantized model's weights are a DequantizeLinear, and its
    QDQ fusion into int8 kernels wants the bias in the Conv: ResNet-50's quantized convolutions ran
    in float otherwise (73 ms; 10 with the bias in place)."""
    readers = _readers(writer.nodes)
    dropped = set()
    for conv in writer.nodes:
        if conv.op_type != "Conv" or len(conv.input) != 2 or conv.output[0] in outputs or len(readers.get(conv.output[0], [])) != 1:
            continue
        add = readers[conv.output[0]][0]
        if add.op_type != "Add" or len(add.input) != 2:
            continue
        bias = next((name for name in add.input if name != conv.output[0] and name in constants), None)
        shape = np.shape(constants[bias]) if bias is not None else ()
        # one value per output channel, laid out as the convolution's result ([1, C, 1, 1])
        if bias is None or len(shape) < 3 or shape[1] != channels.get(conv.output[0]) or np.prod(shape) != shape[1]:
            continue
        conv.input.append(writer.constant(np.asarray(constants[bias]).reshape(-1), f"{conv.name}_bias"))
        conv.output[0] = add.output[0]
        dropped.add(id(add))
    writer.nodes[:] = [node for node in writer.nodes if id(node) not in dropped]


def _dequantized_matmul_as_gemm(writer: _Writer, constants: Mapping[str, np.ndarray], outputs: set[str], matrices: set[str]) -> None:
    """MatMul(A, DequantizeLinear(int8 [K, N] constant, per column)) of a 2-D A, as the Gemm a
    quantized model writes: Gemm(A, DequantizeLinear([N, K] transposed, per row), transB=1), with
    the constant bias its only reader adds as C (int32 where A is dequantized). onnxruntime fuses
    that into its int8 QGemm, and dequantizes the weights per row; per column, on the last axis,
    its DequantizeLinear took 4.7 ms a run for MobileNetV2's [1280, 1000] classifier (1.6 ms the
    whole model from the file)."""
    readers = _readers(writer.nodes)
    producer = _producers(writer.nodes)
    replaced: dict[int, list[onnx.NodeProto]] = {}  # a MatMul -> the nodes that take its place
    dropped: set[int] = set()
    for matmul in writer.nodes:
        if matmul.op_type != "MatMul" or matmul.output[0] not in matrices:
            continue
        dequantize = producer.get(matmul.input[1])
        if dequantize is None or dequantize.op_type != "DequantizeLinear" or dequantize.input[0] not in constants:
            continue
        data = np.asarray(constants[dequantize.input[0]])
        scale = np.asarray(constants.get(dequantize.input[1], np.empty(0)))
        axis = next((a.i for a in dequantize.attribute if a.name == "axis"), 1)
        if data.ndim != 2 or (scale.size > 1 and axis % 2 != 1) or len(dequantize.input) < 2:
            continue
        transposed = writer.constant(np.ascontiguousarray(data.T), f"{dequantize.name}_transposed")
        weights = writer.fresh(f"{dequantize.name}_rows")
        nodes = [helper.make_node("DequantizeLinear", [transposed, *dequantize.input[1:]], [weights],
                                  name=writer.fresh(dequantize.name), **({"axis": 0} if scale.size > 1 else {}))]
        inputs, result = [matmul.input[0], weights], matmul.output[0]
        add = readers.get(result, [None])[0] if len(readers.get(result, [])) == 1 and result not in outputs else None
        bias = next((n for n in add.input if n != result and n in constants), None) if add is not None and add.op_type == "Add" else None
        source = producer.get(matmul.input[0])
        if bias is not None and np.size(constants[bias]) == data.shape[1] and np.ndim(constants[bias]) <= 2 \
                and source is not None and source.op_type == "DequantizeLinear" and np.size(constants.get(source.input[1], ())) == 1:
            # int32 at the input's scale times the weights', as onnxruntime's tool writes it (its
            # QGemm fusion takes no float bias): the model's own int32 values, read back exactly
            step = (np.float32(constants[source.input[1]]) * scale.astype(np.float32)).reshape(-1)
            values = np.round(np.asarray(constants[bias], np.float64).reshape(-1) / step).astype(np.int32)
            quantized = [writer.constant(values, f"{matmul.name}_bias"), writer.constant(np.broadcast_to(step, values.shape).copy(), "scale"),
                         writer.constant(np.zeros(values.shape, np.int32), "zero")]
            inputs.append(writer.fresh(f"{matmul.name}_bias"))
            nodes.append(helper.make_node("DequantizeLinear", quantized, [inputs[-1]], name=writer.fresh(matmul.name), axis=0))
            result = add.output[0]
            dropped.add(id(add))
        # in the MatMul's place: its inputs come before it, and the add's readers after the add
        replaced[id(matmul)] = [*nodes, helper.make_node("Gemm", inputs, [result], name=writer.fresh(matmul.name), transB=1)]
        if len(readers.get(dequantize.output[0], [])) == 1 and dequantize.output[0] not in outputs:
            dropped.add(id(dequantize))
    writer.nodes[:] = [new for node in writer.nodes if id(node) not in dropped for new in replaced.get(id(node), [node])]


# The ONNX ops byoc.ir.quantization.INT8_MOVES are written as.
_INT8_MOVES = ("Reshape", "Transpose", "Slice", "Unsqueeze", "Squeeze", "Flatten", "Expand")


def _constant_values(writer: _Writer, constants: Mapping[str, np.ndarray]) -> Callable[[str], np.ndarray | None]:
    """The value of a constant by name, the region's or an initializer the translation wrote (read
    into numpy when asked for: a weight the translation transposes is one); None for any other name."""
    initializers = {i.name: i for i in writer.initializers}

    def value(name: str) -> np.ndarray | None:
        if name in constants:
            return constants[name]
        return numpy_helper.to_array(initializers[name]) if name in initializers else None

    return value


def _layout_between_quantize_and_dequantize(writer: _Writer, constants: Mapping[str, np.ndarray], graph_outputs: set[str]) -> None:
    """QuantizeLinear -> moves (Reshape, Transpose, Slice, ...: one or a chain) -> DequantizeLinear
    (of one scale and zero point), as partitioning leaves a quantized model's moves on its int8
    data, written back as the model had them: DequantizeLinear -> the moves -> QuantizeLinear, the
    same values exactly.
    onnxruntime makes int8 activations uint8 (its fast format on x86) only for a QuantizeLinear
    that a DequantizeLinear reads directly; with a move between, its QGemm and QLinearConv
    fusions did not happen (MobileNetV2's classifier ran in float; a Llama's grouped-query
    attention, a slice, new axis, broadcast and reshape, took its run from 6.2 to 11.0 ms)."""
    readers = _readers(writer.nodes)
    producer = _producers(writer.nodes)
    value = _constant_values(writer, constants)

    def same(a: list[str], b: list[str]) -> bool:  # one scale and zero point: by name, or by value
        if a == b:
            return True
        pairs = [(value(x), value(y)) for x, y in zip(a, b)]
        return len(a) == len(b) and all(x is not None and y is not None and np.array_equal(x, y) for x, y in pairs)

    replaced: dict[int, list[onnx.NodeProto]] = {}
    for first in writer.nodes:
        quantize = producer.get(first.input[0]) if first.op_type in _INT8_MOVES else None
        if quantize is None or quantize.op_type != "QuantizeLinear" or id(first) in replaced:
            continue
        chain = [first]
        while chain[-1].output[0] not in graph_outputs and len(after := readers.get(chain[-1].output[0], [])) == 1 \
                and after[0].op_type in _INT8_MOVES:
            chain.append(after[0])
        after = readers.get(chain[-1].output[0], [])
        if not after or any(d.op_type != "DequantizeLinear" or not same(list(d.input[1:]), list(quantize.input[1:])) for d in after):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in quantize.attribute}
        current = writer.fresh(f"{first.name}_dequantized")
        nodes = [helper.make_node("DequantizeLinear", [first.input[0], *quantize.input[1:]], [current], name=writer.fresh(first.name), **attrs)]
        for move in chain:
            moved = writer.fresh(f"{move.name}_float")
            nodes.append(helper.make_node(move.op_type, [current, *move.input[1:]], [moved], name=move.name,
                                          **{a.name: helper.get_attribute_value(a) for a in move.attribute}))
            current = moved
        nodes.append(helper.make_node("QuantizeLinear", [current, *quantize.input[1:]], list(chain[-1].output), name=writer.fresh(chain[-1].name),
                                      **attrs))
        # in the last move's place, where every move's other inputs (shapes, starts) are written
        replaced.update({id(move): [] for move in chain[:-1]})
        replaced[id(chain[-1])] = nodes
    writer.nodes[:] = [new for node in writer.nodes for new in replaced.get(id(node), [node])]


class _DynamicQuantization:
    """ONNX DynamicQuantizeLinear as TVM expands it, found back in the ONNX the translation wrote
    (ReduceMax, ReduceMin, Max, Min, Sub, Div, Div, Sub, Clip, Round, Cast into a QuantizeLinear)."""

    def __init__(self, writer: _Writer, constants: Mapping[str, np.ndarray]) -> None:
        self.producer = _producers(writer.nodes)
        self.value = _constant_values(writer, constants)

    def _node(self, name: str, op_type: str) -> onnx.NodeProto | None:
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def _is(self, name: str, value: float) -> bool:
        array = self.value(name)
        return array is not None and np.size(array) == 1 and float(np.asarray(array).reshape(-1)[0]) == value

    def _bound(self, name: str, op_type: str, reduce: str, x: str) -> list[onnx.NodeProto] | None:
        """Max(0, ReduceMax(x)) or Min(0, ReduceMin(x)), over every element."""
        outer = self._node(name, op_type)
        if outer is None or len(outer.input) != 2:
            return None
        zero, inner = (outer.input[0], outer.input[1]) if self._is(outer.input[0], 0.0) else (outer.input[1], outer.input[0])
        reduction = self._node(inner, reduce)
        if not self._is(zero, 0.0) or reduction is None or list(reduction.input) != [x]:
            return None
        return [outer, reduction]

    def chain(self, quantize: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        """The nodes that compute `quantize`'s scale and zero point from its input as
        DynamicQuantizeLinear does, or None."""
        if len(quantize.input) != 3:
            return None
        x, scale, zero = quantize.input
        divide, cast = self._node(scale, "Div"), self._node(zero, "Cast")
        spread = self._node(divide.input[0], "Sub") if divide is not None and self._is(divide.input[1], 255.0) else None
        high = self._bound(spread.input[0], "Max", "ReduceMax", x) if spread is not None else None
        low = self._bound(spread.input[1], "Min", "ReduceMin", x) if spread is not None else None
        rounded = self._node(cast.input[0], "Round") if cast is not None else None
        clip = self._node(rounded.input[0], "Clip") if rounded is not None else None
        if high is None or low is None or clip is None or len(clip.input) != 3 or not (self._is(clip.input[1], 0.0) and self._is(clip.input[2], 255.0)):
            return None
        negated = self._node(clip.input[0], "Sub")
        level = self._node(negated.input[1], "Div") if negated is not None and self._is(negated.input[0], 0.0) else None
        if level is None or list(level.input) != [spread.input[1], scale]:
            return None
        return [divide, spread, *high, *low, cast, rounded, clip, negated, level]


def _dequantized_weights(dequantize: onnx.NodeProto, value: Callable[[str], np.ndarray | None]) -> np.ndarray:
    """The float values of DequantizeLinear(constant int8 weights, constant scale, zero point)."""
    axis = next((helper.get_attribute_value(a) for a in dequantize.attribute if a.name == "axis"), 1)  # ONNX's default
    return dequantize_array(*(value(name) for name in dequantize.input), axis)


def _dynamic_quantization_as_the_model_had_it(writer: _Writer, constants: Mapping[str, np.ndarray], outputs: set[str]) -> None:
    """DynamicQuantizeLinear as TVM expands it, and each DequantizeLinear of its result times
    DequantizeLinear(int8 constant weights), written as `quantize_dynamic` writes them:
    DynamicQuantizeLinear, then MatMulInteger -> Cast -> Mul by the product of the two scales.
    onnxruntime fuses that into its DynamicQuantizeMatMul kernel; the expanded form ran in float
    (a quantize_dynamic BERT: 115 ms against onnxruntime's 38 on the file). A convolution keeps its
    float form, its weights dequantized once."""
    found = _DynamicQuantization(writer, constants)
    readers = _readers(writer.nodes)
    replaced: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    first: dict[str, list[str]] = {}  # input -> the outputs of its first DynamicQuantizeLinear
    alias: dict[str, str] = {}  # an output of a later one of the same input -> the first's
    for quantize in writer.nodes:
        chain = found.chain(quantize) if quantize.op_type == "QuantizeLinear" else None
        if chain is None:
            continue
        x, scale, zero = quantize.input
        inside = {id(node) for node in chain} | {id(quantize)}
        dequantizes = [r for r in readers.get(quantize.output[0], []) if r.op_type == "DequantizeLinear" and list(r.input) == [quantize.output[0], scale, zero]]
        allowed = inside | {id(d) for d in dequantizes}
        if any(out in outputs or any(id(r) not in allowed for r in readers.get(out, [])) for node in chain for out in node.output) \
                or quantize.output[0] in outputs:
            continue
        dropped |= {id(node) for node in chain}
        # import writes one quantization per product (byoc.frontend.onnx.qoperator); the file
        # had one per input, read by all its products (a BERT layer's Q, K and V)
        if x in first:
            alias.update(zip([quantize.output[0], scale, zero], first[x]))
            dropped.add(id(quantize))
        else:
            first[x] = [quantize.output[0], scale, zero]
            replaced[id(quantize)] = [helper.make_node("DynamicQuantizeLinear", [x], first[x], name=quantize.name)]
        for dequantize in dequantizes:
            after = readers.get(dequantize.output[0], [])
            found_product = len(after) == 1 and after[0].op_type in ("MatMul", "Conv") and after[0].input[0] == dequantize.output[0]
            product_node = after[0] if found_product else None
            weights = found.producer.get(product_node.input[1]) if product_node is not None else None
            if weights is None or weights.op_type != "DequantizeLinear" or len(weights.input) != 3 \
                    or weights.input[0] not in constants or np.asarray(constants[weights.input[0]]).dtype != np.int8 \
                    or (product_node.op_type == "MatMul" and np.ndim(constants[weights.input[0]]) != 2) \
                    or any(found.value(name) is None for name in weights.input[1:]) or dequantize.output[0] in outputs:
                continue
            name = product_node.name
            if product_node.op_type == "Conv":
                # onnxruntime's ConvInteger is slower than its float convolution (ResNet-18: 62 ms
                # on the file against 13.5 with this hand-off): the weights are dequantized here,
                # once, and the input as the model does it; the product is the same to float rounding.
                product_node.input[1] = writer.constant(_dequantized_weights(weights, found.value), f"{name}_weights")
                if len(readers.get(weights.output[0], [])) == 1:
                    dropped.add(id(weights))
                continue
            product, integers, floats = (writer.fresh(f"{name}_{part}") for part in ("scales", "int32", "float"))
            replaced[id(product_node)] = [
                helper.make_node("Mul", [scale, weights.input[1]], [product], name=writer.fresh(name)),
                helper.make_node("MatMulInteger", [quantize.output[0], weights.input[0], zero, weights.input[2]], [integers], name=name),
                helper.make_node("Cast", [integers], [floats], name=writer.fresh(name), to=onnx.TensorProto.FLOAT),
                helper.make_node("Mul", [floats, product], list(product_node.output), name=writer.fresh(name)),
            ]
            dropped.add(id(dequantize))
            if len(readers.get(weights.output[0], [])) == 1:
                dropped.add(id(weights))
    writer.nodes[:] = [new for node in writer.nodes if id(node) not in dropped for new in replaced.get(id(node), [node])]
    for node in writer.nodes:
        node.input[:] = [alias.get(name, name) for name in node.input]


def graph_to_onnx(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], opset: int = OPSET) -> onnx.ModelProto:
    """A region's JSON graph as an ONNX model of the default domain at `opset`.

    `graph` is a byoc JSON graph (format "byoc.json-graph", version 1: `region_to_json`'s output,
    after the vendor's processing passes), every shape static. `constants` holds an array for each
    name in `graph["constants"]`; each becomes an initializer of that name. Opsets 17 (`OPSET`,
    the default: TensorRT's parser) to 20 (`LATEST_OPSET`: onnxruntime) are written; the IR
    version is the least the opset needs.

    Names: the graph inputs are `input0`, `input1`, ... in the JSON graph's input order, the
    outputs `output0`, `output1`, ... in its output order, with the JSON graph's shapes and dtypes;
    the model's graph is named after the region's symbol, each ONNX node after the JSON node it
    comes from (`<node name>__<k>`).

    Raises CodegenError, naming the region, the Relax op and the node, for an opset outside 17 to
    20, an op without a translation (see `onnx_op_table`), an op whose check in
    `onnx_checks(opset)` fails (with the check's reason), or a constant missing from `constants`;
    JsonGraphError for a node that is not a valid Relax call.
    """
    _supported(opset)
    _refuse_what_cannot_be_written(graph, constants, opset)
    writer = _Writer(graph, opset)
    for node in graph["nodes"]:
        args = [writer.tensor(ref) for arg in node["args"] for ref in tensor_refs(arg)]
        outs = [f"n{node['id']}_{i}" for i in range(len(node["outputs"]))]
        EMITTERS[node["op"]](writer, node, args, outs)
    convolutions = {f"n{node['id']}_0": node["outputs"][0]["shape"][1] for node in graph["nodes"] if node["op"].startswith("relax.nn.conv")}
    graph_outputs = {writer.tensor(ref) for ref in graph["outputs"]}
    _bias_into_conv(writer, constants, graph_outputs, convolutions)
    matrices = {f"n{node['id']}_0" for node in graph["nodes"]
                if node["op"] == "relax.matmul" and len(value_spec(graph, node["args"][0])["shape"]) == 2}
    _dynamic_quantization_as_the_model_had_it(writer, constants, graph_outputs)
    _dequantized_matmul_as_gemm(writer, constants, graph_outputs, matrices)
    _layout_between_quantize_and_dequantize(writer, constants, graph_outputs)
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
    read = {name for onnx_node in writer.nodes for name in onnx_node.input}
    onnx_graph = helper.make_graph(
        writer.nodes,
        graph["symbol"],
        [_value_info(f"input{i}", spec) for i, spec in enumerate(graph["inputs"])],
        [_value_info(name, spec) for name, spec in zip(outputs, output_specs)],
        [*(numpy_helper.from_array(np.require(constants[name], requirements="C"), name) for name in graph["constants"]
           if name in read), *(i for i in writer.initializers if i.name in read)],
    )
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(onnx_graph, opset_imports=opsets, producer_name="byoc")
    model.ir_version = helper.find_min_ir_version_for(opsets)  # 8 for opset 17, 9 for 20
    return model
