"""The ONNX writer of a region's JSON graph (`Writer`: nodes, initializers, symbolic dimensions as
int64 tensors) and an emitter per Relax op, each writing the ONNX nodes the op becomes."""

from __future__ import annotations

import ast
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper
from tvm import relax

from byoc.codegen_json.references import tensor_refs, value_spec
from byoc.codegen_json.symbolic_dims import fold
from byoc.errors import CodegenError

OPSET = 17  # the default: what TensorRT 8.5's ONNX parser reads
LATEST_OPSET = 20  # what torch.onnx writes; ONNX Gelu arrived in 20, axes as an input of every Reduce op in 18
OPSETS = range(OPSET, LATEST_OPSET + 1)  # the opsets written; the tests write 17 and 20

Node = Mapping[str, Any]
Check = Callable[[relax.Call], "str | None"]


# Symbolic dimensions' operations on int64 tensors (dimensions are positive: Div truncates as //).
_DIM_OPS: dict[type, tuple[str, dict]] = {ast.Add: ("Add", {}), ast.Sub: ("Sub", {}), ast.Mult: ("Mul", {}),
                                          ast.FloorDiv: ("Div", {}), ast.Mod: ("Mod", {"fmod": 0})}


class Writer:
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


Emitter = Callable[[Writer, Node, list[str], list[str]], None]


def same_op(onnx_op: str, **attrs) -> Emitter:
    def emit(w: Writer, node, args, outs):
        w.add(onnx_op, args, outs, node["name"], **attrs)

    return emit


def attr_op(onnx_op: str, **names: str) -> Emitter:
    """The op with attributes taken from the Relax attrs: onnx name -> relax name."""

    def emit(w: Writer, node, args, outs):
        w.add(onnx_op, args, outs, node["name"], **{o: node["attrs"][r] for o, r in names.items()})

    return emit


def emit_conv(onnx_op: str) -> Emitter:
    def emit(w: Writer, node, args, outs):
        a = node["attrs"]
        extra = {"output_padding": a["output_padding"]} if "output_padding" in a else {}
        w.add(onnx_op, args[:2], outs, node["name"], strides=a["strides"], pads=a["padding"], dilations=a["dilation"],
              group=a["groups"], **extra)

    return emit


def onnx_window(data: Sequence[int], out: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
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


def pool(op_type: str) -> Emitter:
    def emit(w: Writer, node, args, outs):
        a = node["attrs"]
        rank = len(a["pool_size"])
        data = value_spec(w.graph, node["args"][0])["shape"][-rank:]
        window = onnx_window(data, node["outputs"][0]["shape"][-rank:], a["pool_size"], a["strides"], a["dilation"],
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


def emit_reduce(onnx_op: str, axes_input_since: int = 18) -> Emitter:
    def emit(w: Writer, node, args, outs):
        a = node["attrs"]
        axes = a["axis"]
        if axes is None:
            w.add(onnx_op, args[:1], outs, node["name"], keepdims=int(a["keepdims"]))
        elif w.opset >= axes_input_since:
            w.add(onnx_op, [args[0], w.ints(axes, "axes")], outs, node["name"], keepdims=int(a["keepdims"]))
        else:
            w.add(onnx_op, args[:1], outs, node["name"], axes=axes, keepdims=int(a["keepdims"]))

    return emit


def emit_variance(w: Writer, node, args, outs):
    # The mean of the squared deviations from the mean (ONNX has no variance op).
    mean, deviation, squared = (w.fresh(f"{node['name']}_{part}") for part in ("mean", "deviation", "squared"))
    reduce_mean = emit_reduce("ReduceMean")
    reduce_mean(w, {**node, "attrs": {**node["attrs"], "keepdims": True}}, args, [mean])
    w.add("Sub", [args[0], mean], [deviation], node["name"])
    w.add("Mul", [deviation, deviation], [squared], node["name"])
    reduce_mean(w, node, [squared], outs)


def emit_clip(w: Writer, node, args, outs):
    low, high = (w.scalar(node["args"][i]["prim"], node, "bound") for i in (1, 2))
    w.add("Clip", [args[0], low, high], outs, node["name"])


def emit_reshape(w: Writer, node, args, outs):
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


def transpose(w: Writer, node, args, outs):
    axes = node["attrs"]["axes"]
    w.add("Transpose", args[:1], outs, node["name"], **({"perm": axes} if axes is not None else {}))


def emit_split(w: Writer, node, args, outs):
    axis = node["attrs"]["axis"]
    sizes = w.ints([o["shape"][axis] for o in node["outputs"]], "split")
    w.add("Split", [args[0], sizes], outs, node["name"], axis=axis)


def emit_layer_norm(w: Writer, node, args, outs):
    a = node["attrs"]
    rank = len(node["outputs"][0]["shape"])
    w.add("LayerNormalization", args[:3], outs, node["name"], axis=min(axis % rank for axis in a["axes"]), epsilon=a["epsilon"])


def emit_batch_norm(w: Writer, node, args, outs):
    # In inference the statistics outputs are the moving statistics, unchanged.
    w.add("BatchNormalization", args[:5], outs[:1], node["name"], epsilon=node["attrs"]["epsilon"])
    for out, statistic in zip(outs[1:], args[3:5]):
        w.add("Identity", [statistic], [out], node["name"])


def emit_take(w: Writer, node, args, outs):
    w.add("Gather", args[:2], outs, node["name"], axis=node["attrs"]["axis"] if node["attrs"]["axis"] is not None else 0)


def emit_cast(w: Writer, node, args, outs):
    w.add("Cast", args[:1], outs, node["name"], to=helper.np_dtype_to_tensor_dtype(np.dtype(node["attrs"]["dtype"])))


def strided_slice(w: Writer, node, args, outs):
    axes, begin, end, *strides = ([item["prim"] for item in arg["tuple"]] for arg in node["args"][1:])
    steps = strides[0] if strides else [1] * len(axes)
    inputs = [w.ints(values, hint) for values, hint in ((begin, "starts"), (end, "ends"), (axes, "axes"), (steps, "steps"))]
    w.add("Slice", [args[0], *inputs], outs, node["name"])


def emit_arange(w: Writer, node, args, outs):
    dtype = node["outputs"][0]["dtype"]
    bounds = [w.prim(ref, dtype, hint) for ref, hint in zip(node["args"], ("start", "limit", "delta"))]
    w.add("Range", bounds, outs, node["name"])


def flip(w: Writer, node, args, outs):
    ends = np.iinfo(np.int64).min  # past the start, whatever the axis' length
    inputs = [w.ints(values, hint) for values, hint in (([-1], "starts"), ([ends], "ends"), ([node["attrs"]["axis"]], "axes"), ([-1], "steps"))]
    w.add("Slice", [args[0], *inputs], outs, node["name"])


def _expand_target(w: Writer, shape: Sequence, data: Sequence) -> str:
    # A symbolic dimension the input already has is written 1 (Expand keeps the input's).
    offset = len(shape) - len(data)
    return w.ints([1 if isinstance(d, str) and i >= offset and data[i - offset] == d else d for i, d in enumerate(shape)], "shape")


def expand(w: Writer, node, args, outs):
    shape = node["outputs"][0]["shape"]
    w.add("Expand", [args[0], _expand_target(w, shape, value_spec(w.graph, node["args"][0])["shape"])], outs, node["name"])


PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge"}  # Relax -> ONNX
RESIZE_MODES = {"nearest_neighbor": "nearest", "linear": "linear", "cubic": "cubic"}  # Relax -> ONNX
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")  # TVM's importer keeps ONNX's names


def emit_resize(w: Writer, node, args, outs):
    # The output's sizes, given: no scale is computed again from them at run time.
    a = node["attrs"]
    extra: dict[str, Any] = {"nearest_mode": a["rounding_method"]} if a["method"] == "nearest_neighbor" else {}
    if a["method"] == "cubic":
        extra.update(cubic_coeff_a=float(a["cubic_alpha"]), exclude_outside=int(a["cubic_exclude"]))
    w.add("Resize", [args[0], "", "", w.ints(node["outputs"][0]["shape"], "sizes")], outs, node["name"], mode=RESIZE_MODES[a["method"]],
          coordinate_transformation_mode=a["coordinate_transformation_mode"], **extra)


def emit_pad(w: Writer, node, args, outs):
    a = node["attrs"]
    widths = list(a["pad_width"])  # (before, after) per axis; ONNX lists every before, then every after
    inputs = [args[0], w.ints(widths[0::2] + widths[1::2], "pads")]
    if a["pad_mode"] == "constant":
        inputs.append(w.constant(np.array(a["pad_value"], dtype=node["outputs"][0]["dtype"]), "pad_value"))
    w.add("Pad", inputs, outs, node["name"], mode=PAD_MODES[a["pad_mode"]])


def index_tensor(w: Writer, node, args, outs):
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


def cumsum(w: Writer, node, args, outs):
    a = node["attrs"]
    source = args[0]
    if a["dtype"] is not None and a["dtype"] != value_spec(w.graph, node["args"][0])["dtype"]:
        source = w.fresh(f"{node['name']}emit_cast")
        w.add("Cast", args[:1], [source], node["name"], to=helper.np_dtype_to_tensor_dtype(np.dtype(a["dtype"])))
    w.add("CumSum", [source, w.ints(a["axis"], "axis")], outs, node["name"], exclusive=int(a["exclusive"]))


def prelu(w: Writer, node, args, outs):
    # ONNX broadcasts the slope from the right: (C,) becomes (C, 1, ..., 1) up to the last axis.
    rank = len(node["outputs"][0]["shape"])
    channels = value_spec(w.graph, node["args"][1])["shape"][0]
    slope_shape = [channels] + [1] * (rank - 1 - node["attrs"]["axis"] % rank)
    w.chain(node, [("Reshape", [args[1], w.ints(slope_shape, "slope_shape")]), ("PRelu", [args[0], None])], outs)


def trilu(upper: int) -> Emitter:
    def emit(w: Writer, node, args, outs):
        w.add("Trilu", [args[0], w.ints(node["args"][1]["prim"], "k")], outs, node["name"], upper=upper)

    return emit


def _gelu_steps(approximate: str, x: str, c: Callable[[float], str]) -> list[tuple[str, list[str | None]]]:
    """GELU before opset 20: the forms onnxruntime's GeluFusion and FastGeluFusion recognise."""
    if approximate == "tanh":
        return [("Pow", [x, c(3.0)]), ("Mul", [None, c(0.044715)]), ("Add", [x, None]), ("Mul", [None, c(np.sqrt(2.0 / np.pi))]),
                ("Tanh", [None]), ("Add", [None, c(1.0)]), ("Mul", [x, None]), ("Mul", [None, c(0.5)])]
    return [("Div", [x, c(np.sqrt(2.0))]), ("Erf", [None]), ("Add", [None, c(1.0)]), ("Mul", [x, None]), ("Mul", [None, c(0.5)])]


def gelu(approximate: str) -> Emitter:
    def emit(w: Writer, node, args, outs):
        if w.opset >= 20:
            w.add("Gelu", args[:1], outs, node["name"], **({"approximate": "tanh"} if approximate == "tanh" else {}))
        else:
            w.chain(node, _gelu_steps(approximate, args[0], lambda value: w.scalar(value, node)), outs)

    return emit


def gelu_writes(approximate: str) -> Callable[[int], tuple[str, ...]]:
    chain = tuple(dict.fromkeys(op for op, _ in _gelu_steps(approximate, "x", str)))
    return lambda opset: ("Gelu",) if opset >= 20 else chain


def silu(w: Writer, node, args, outs):
    w.chain(node, [("Sigmoid", args[:1]), ("Mul", [args[0], None])], outs)


def rsqrt(w: Writer, node, args, outs):
    w.chain(node, [("Sqrt", args[:1]), ("Reciprocal", [None])], outs)


def square(w: Writer, node, args, outs):
    w.add("Mul", [args[0], args[0]], outs, node["name"])


def isfinite(w: Writer, node, args, outs):
    infinite, nan, either = (w.fresh(f"{node['name']}_{hint}") for hint in ("IsInf", "IsNaN", "Or"))
    w.add("IsInf", args[:1], [infinite], node["name"])
    w.add("IsNaN", args[:1], [nan], node["name"])
    w.add("Or", [infinite, nan], [either], node["name"])
    w.add("Not", [either], outs, node["name"])


def not_equal(w: Writer, node, args, outs):
    w.chain(node, [("Equal", args), ("Not", [None])], outs)


def scatter(onnx_op: str) -> Emitter:
    def emit(w: Writer, node, args, outs):
        a = node["attrs"]
        extra = {"axis": a["axis"]} if "axis" in a else {}
        w.add(onnx_op, args[:3], outs, node["name"], reduction=REDUCTIONS[a["reduction"]], **extra)

    return emit


REDUCTIONS = {"update": "none", "add": "add", "mul": "mul", "min": "min", "max": "max"}
