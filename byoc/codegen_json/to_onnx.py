"""JSON graph -> ONNX model: the Relax ops a region may hold when a vendor takes ONNX, and their
ONNX spelling. Shared by the vendors whose libraries import ONNX: ONNX Runtime (one inference
session per region) and TensorRT (its ONNX parser builds the engine's network)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from byoc.codegen_json.graph import tensor_refs, value_spec

OPSET = 17
IR_VERSION = 8  # onnxruntime 1.31 reads IR versions up to 13

_ELEMENTWISE = {
    "relax.add": "Add",
    "relax.subtract": "Sub",
    "relax.multiply": "Mul",
    "relax.divide": "Div",
    "relax.matmul": "MatMul",
    "relax.nn.relu": "Relu",
    "relax.sigmoid": "Sigmoid",
    "relax.tanh": "Tanh",
    "relax.exp": "Exp",
    "relax.erf": "Erf",
    "relax.sqrt": "Sqrt",
    "relax.less": "Less",
    "relax.greater": "Greater",
    "relax.equal": "Equal",
    "relax.where": "Where",
}


class _Writer:
    def __init__(self, graph: Mapping[str, Any]) -> None:
        self.graph = graph
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.names: dict[tuple, str] = {}
        self.counter = 0

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"{hint}__{self.counter}"

    def constant(self, value: np.ndarray, hint: str) -> str:
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.require(value, requirements="C"), name))
        return name

    def tensor(self, ref: Mapping[str, Any]) -> str:
        if "input" in ref:
            return f"input{ref['input']}"
        if "const" in ref:
            return ref["const"]
        return f"n{ref['node']}_{ref.get('index', 0)}"

    def add(self, op_type: str, inputs: list[str], outputs: list[str], name: str, **attrs) -> None:
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=self.fresh(name), **attrs))


def _conv(w: _Writer, node, args, outs):
    a = node["attrs"]
    w.add("Conv", args[:2], outs, node["name"], strides=a["strides"], pads=a["padding"], dilations=a["dilation"], group=a["groups"])


def _pool(op_type: str):
    def emit(w: _Writer, node, args, outs):
        a = node["attrs"]
        extra = {"count_include_pad": int(a["count_include_pad"])} if op_type == "AveragePool" else {"dilations": a["dilation"]}
        window = {"kernel_shape": a["pool_size"], "strides": a["strides"], "pads": a["padding"], "ceil_mode": int(a["ceil_mode"])}
        w.add(op_type, args[:1], outs, node["name"], **window, **extra)

    return emit


def _clip(w: _Writer, node, args, outs):
    low, high = (w.constant(np.array(node["args"][i]["prim"], dtype=node["outputs"][0]["dtype"]), "bound") for i in (1, 2))
    w.add("Clip", [args[0], low, high], outs, node["name"])


def _mean(w: _Writer, node, args, outs):
    a = node["attrs"]
    w.add("ReduceMean", args[:1], outs, node["name"], axes=a["axis"], keepdims=int(a["keepdims"]))


def _reshape(w: _Writer, node, args, outs):
    shape = w.constant(np.array(node["outputs"][0]["shape"], dtype=np.int64), "shape")
    w.add("Reshape", [args[0], shape], outs, node["name"])


def _transpose(w: _Writer, node, args, outs):
    axes = node["attrs"]["axes"]
    w.add("Transpose", args[:1], outs, node["name"], **({"perm": axes} if axes is not None else {}))


def _concat(w: _Writer, node, args, outs):
    w.add("Concat", args, outs, node["name"], axis=node["attrs"]["axis"])


def _split(w: _Writer, node, args, outs):
    axis = node["attrs"]["axis"]
    sizes = w.constant(np.array([o["shape"][axis] for o in node["outputs"]], dtype=np.int64), "split")
    w.add("Split", [args[0], sizes], outs, node["name"], axis=axis)


def _softmax(w: _Writer, node, args, outs):
    w.add("Softmax", args[:1], outs, node["name"], axis=node["attrs"]["axis"])


def _layer_norm(w: _Writer, node, args, outs):
    a = node["attrs"]
    w.add("LayerNormalization", args[:3], outs, node["name"], axis=a["axes"][0], epsilon=a["epsilon"])


def _take(w: _Writer, node, args, outs):
    w.add("Gather", args[:2], outs, node["name"], axis=node["attrs"]["axis"] if node["attrs"]["axis"] is not None else 0)


def _cast(w: _Writer, node, args, outs):
    w.add("Cast", args[:1], outs, node["name"], to=helper.np_dtype_to_tensor_dtype(np.dtype(node["attrs"]["dtype"])))


def _same_op(onnx_op: str) -> Callable:
    def emit(w: _Writer, node, args, outs):
        w.add(onnx_op, args, outs, node["name"])

    return emit


EMITTERS: dict[str, Callable] = {
    "relax.nn.conv2d": _conv,
    "relax.nn.max_pool2d": _pool("MaxPool"),
    "relax.nn.avg_pool2d": _pool("AveragePool"),
    "relax.clip": _clip,
    "relax.mean": _mean,
    "relax.reshape": _reshape,
    "relax.permute_dims": _transpose,
    "relax.concat": _concat,
    "relax.split": _split,
    "relax.nn.softmax": _softmax,
    "relax.nn.layer_norm": _layer_norm,
    "relax.take": _take,
    "relax.astype": _cast,
    **{op: _same_op(onnx_op) for op, onnx_op in _ELEMENTWISE.items()},
}


# When a Relax op has an ONNX spelling at all: what the emitters above cannot express. Vendors
# that take ONNX use these as their op rules' checks (each returns why not, or None).
def _nchw(call) -> str | None:
    attrs = call.attrs
    layout = getattr(attrs, "data_layout", None) or attrs.layout
    kernel = getattr(attrs, "kernel_layout", "OIHW")
    return None if (layout, kernel) == ("NCHW", "OIHW") else f"layout {layout}/{kernel}; ONNX takes NCHW/OIHW"


def _last_axis(call) -> str | None:
    rank = call.args[0].ty.ndim
    return None if [int(a) % rank for a in call.attrs.axes] == [rank - 1] else "ONNX LayerNormalization normalises trailing axes"


def _gather(call) -> str | None:
    return None if call.attrs.mode in ("fast", "clip", "wrap") else f"take mode {call.attrs.mode}"


ONNX_CHECKS: dict[str, Callable] = {
    "relax.nn.conv2d": _nchw,
    "relax.nn.max_pool2d": _nchw,
    "relax.nn.avg_pool2d": _nchw,
    "relax.nn.layer_norm": _last_axis,
    "relax.take": _gather,
}


# The ONNX op each Relax op becomes, for vendors whose ONNX importer gates ops by version.
ONNX_OPS: dict[str, str] = {
    "relax.nn.conv2d": "Conv",
    "relax.nn.max_pool2d": "MaxPool",
    "relax.nn.avg_pool2d": "AveragePool",
    "relax.clip": "Clip",
    "relax.mean": "ReduceMean",
    "relax.reshape": "Reshape",
    "relax.permute_dims": "Transpose",
    "relax.concat": "Concat",
    "relax.split": "Split",
    "relax.nn.softmax": "Softmax",
    "relax.nn.layer_norm": "LayerNormalization",
    "relax.take": "Gather",
    "relax.astype": "Cast",
    **_ELEMENTWISE,
}


def _value_info(name: str, spec: Mapping[str, Any]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(spec["dtype"])), spec["shape"])


def graph_to_onnx(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    writer = _Writer(graph)
    for node in graph["nodes"]:
        args = [writer.tensor(ref) for arg in node["args"] for ref in tensor_refs(arg)]
        outs = [f"n{node['id']}_{i}" for i in range(len(node["outputs"]))]
        EMITTERS[node["op"]](writer, node, args, outs)
    outputs = []
    for position, ref in enumerate(graph["outputs"]):
        name = f"output{position}"
        writer.add("Identity", [writer.tensor(ref)], [name], "output")
        outputs.append(name)
    output_specs = [value_spec(graph, ref) for ref in graph["outputs"]]
    onnx_graph = helper.make_graph(
        writer.nodes,
        graph["symbol"],
        [_value_info(f"input{i}", spec) for i, spec in enumerate(graph["inputs"])],
        [_value_info(name, spec) for name, spec in zip(outputs, output_specs)],
        [*(numpy_helper.from_array(np.require(constants[name], requirements="C"), name) for name in graph["constants"]), *writer.initializers],
    )
    model = helper.make_model(onnx_graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="byoc")
    model.ir_version = IR_VERSION
    return model

