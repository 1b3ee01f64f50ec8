"""Which ONNX ops the frontend imports, and how, decided before anything is converted.

An op is imported by byoc's own converter (`converters`), by TVM's, or, when neither has one or
TVM's implements another op of that name, by expanding it into its ONNX function body
(`functions`). A model with any other op is refused up front, naming every such node and
why, rather than failing halfway through a conversion.
"""

from __future__ import annotations

import onnx
from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

from byoc.frontend.onnx.converters import CONVERTERS
from byoc.frontend.onnx.functions import expand_functions

_STANDARD_DOMAINS = ("", "ai.onnx")
# Handled by TVM's importer itself rather than through its converter table.
_BUILT_IN = frozenset({"Constant", "If"})
# Ops whose TVM converter implements something else under the same name.
OTHER_OP = {
    "Attention": "TVM's converter implements com.microsoft.Attention, not the ONNX op",
}



_INTEGERS = frozenset({onnx.TensorProto.INT8, onnx.TensorProto.INT16, onnx.TensorProto.INT32, onnx.TensorProto.INT64,
                       onnx.TensorProto.UINT8, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64})


_REFUSED_BY_TYPE = frozenset({"Pow", "ReduceMax", "ReduceMin", "TopK"})
# TVM's sort library (TopK on the host) fails at run time on these ("Unsupported input dtype").
_UNSORTABLE = frozenset({onnx.TensorProto.INT16, onnx.TensorProto.UINT16, onnx.TensorProto.UINT32, onnx.TensorProto.UINT64})

# Element types no node may read or write. Sub-byte weights of a dequantization are folded at
# load (`nbits`); anywhere else TVM's host code fails to build on them ("dtype.bits % 8").
# TVM converts float8 wrongly (zero became 2^-7 and NaN 480 on onnx's Cast cases, no error).
_FLOAT8 = ("FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "FLOAT8E8M0")
_SUB_BYTE = ("INT4", "UINT4", "INT2", "UINT2", "FLOAT4E2M1")
_REFUSED_TYPES = {
    **{getattr(onnx.TensorProto, n): f"{n.lower()} tensors are not supported (TVM's float8 conversions give wrong values at zero "
                                      "and NaN)" for n in _FLOAT8 if hasattr(onnx.TensorProto, n)},
    **{getattr(onnx.TensorProto, n): f"{n.lower()} tensors are not supported outside the weights of a DequantizeLinear (TVM's "
                                      "host code takes whole bytes per element)" for n in _SUB_BYTE if hasattr(onnx.TensorProto, n)},
    onnx.TensorProto.STRING: "string tensors are not supported (TVM's tensors hold numbers only)",
}


def _element_types(model: onnx.ModelProto) -> dict[str, int]:
    """Each value's element type, as far as onnx's type inference knows it (empty when it fails:
    the forms refused by type are then left to the converters)."""
    try:
        graph = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # onnx raises several kinds; a model it cannot infer still imports op by op
        return {}
    types = {init.name: init.data_type for init in graph.initializer}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        if value.type.HasField("tensor_type"):
            types[value.name] = value.type.tensor_type.elem_type
    return types


def _declares_refused_type(graph: onnx.GraphProto) -> bool:
    """Whether a refused element type appears where it can be seen without type inference: the
    graph's values and weights, a Cast's target, a subgraph's."""
    values = [*graph.input, *graph.output, *graph.value_info]
    if any(v.type.tensor_type.elem_type in _REFUSED_TYPES for v in values if v.type.HasField("tensor_type")):
        return True
    if any(init.data_type in _REFUSED_TYPES for init in graph.initializer):
        return True
    for node in graph.node:
        if node.op_type == "Cast" and any(a.name == "to" and a.i in _REFUSED_TYPES for a in node.attribute):
            return True
        if any(_declares_refused_type(sub) for a in node.attribute for sub in ([a.g] if a.HasField("g") else list(a.graphs))):
            return True
    return False


def _refused_form(node: onnx.NodeProto, types: dict[str, int]) -> str | None:
    """Why a form of an op that has a converter is still not imported, or None."""
    refused_type = next((_REFUSED_TYPES[t] for t in (types.get(v) for v in [*node.input, *node.output] if v) if t in _REFUSED_TYPES), None)
    if refused_type is not None:
        return refused_type
    first = types.get(node.input[0]) if node.input else None
    if node.op_type == "Pow" and first in _INTEGERS:
        return "integer Pow is not supported (TVM's power takes floating-point operands only)"
    if node.op_type in ("ReduceMax", "ReduceMin") and first == onnx.TensorProto.BOOL:
        return f"{node.op_type} of bool is not supported (TVM's reductions have no bool identity value)"
    if node.op_type in ("QuantizeLinear", "DequantizeLinear") and any(a.name == "block_size" and a.i for a in node.attribute):
        return ("blocked quantization of a tensor computed at run time is not supported (blocked scales are taken on constant "
                "weights, dequantized at import)")
    if node.op_type == "TopK" and first in _UNSORTABLE:
        return (f"TopK of {onnx.TensorProto.DataType.Name(first).lower()} is not supported (TVM's sort library takes float, 8-bit "
                "and 32- or 64-bit signed integer keys)")
    if node.op_type == "MaxPool" and len(node.output) > 1 and node.output[1]:
        return "its Indices output is not supported (TVM's max pooling returns no indices)"
    if node.op_type == "BatchNormalization" and any(a.name == "training_mode" and a.i for a in node.attribute):
        return "training mode (statistics of the batch, running statistics updated) is not supported: byoc compiles for inference"
    return None


def _has_converter(node: onnx.NodeProto) -> bool:
    return node.op_type in CONVERTERS or node.op_type in _BUILT_IN or (node.op_type in _get_convert_map() and node.op_type not in OTHER_OP)


def needs_expansion(node: onnx.NodeProto) -> bool:
    """Whether `node` is imported through its function body rather than a converter."""
    return node.domain in _STANDARD_DOMAINS and not _has_converter(node)


def expand(model: onnx.ModelProto) -> onnx.ModelProto:
    return expand_functions(model, needs_expansion)


def _nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from _nodes(sub)


def unsupported_ops(model: onnx.ModelProto) -> list[tuple[str, str, str]]:
    """(node name, op type, reason) for every node the frontend does not import, its function
    bodies expanded; empty when it imports them all."""
    refused = []
    expanded = expand(model)
    typed = any(node.op_type in _REFUSED_BY_TYPE for node in _nodes(expanded.graph)) or _declares_refused_type(expanded.graph)
    types = _element_types(expanded) if typed else {}  # inference copies the model: only where it decides
    for node in _nodes(expanded.graph):
        name = node.name or (node.output[0] if node.output else node.op_type)
        if node.domain not in _STANDARD_DOMAINS:
            refused.append((name, node.op_type, f"ops of domain {node.domain!r} are not supported"))
        elif (why := _refused_form(node, types)) is not None:
            refused.append((name, node.op_type, why))
        elif not _has_converter(node):
            why = OTHER_OP.get(node.op_type, "the ONNX frontend has no converter for it, and ONNX defines it by no function "
                                             "without control flow")
            refused.append((name, node.op_type, why))
    return refused
