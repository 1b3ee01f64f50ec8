"""Which ONNX ops the frontend imports, and how, decided before anything is converted.

An op is imported by byoc's own converter (`onnx_ops`), by TVM's, or, when neither has one or
TVM's implements another op of that name, by expanding it into its ONNX function body
(`onnx_functions`). A model with any other op is refused up front, naming every such node and
why, rather than failing halfway through a conversion.
"""

from __future__ import annotations

import onnx
from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

from byoc.frontend.onnx_functions import expand_functions
from byoc.frontend.onnx_ops import CONVERTERS

_STANDARD_DOMAINS = ("", "ai.onnx")
# Handled by TVM's importer itself rather than through its converter table.
_BUILT_IN = frozenset({"Constant", "If"})
# Ops whose TVM converter implements something else under the same name.
OTHER_OP = {
    "Attention": "TVM's converter implements com.microsoft.Attention, not the ONNX op",
}



def _refused_form(node: onnx.NodeProto) -> str | None:
    """Why a form of an op that has a converter is still not imported, or None."""
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
    for node in _nodes(expand(model).graph):
        name = node.name or (node.output[0] if node.output else node.op_type)
        if node.domain not in _STANDARD_DOMAINS:
            refused.append((name, node.op_type, f"ops of domain {node.domain!r} are not supported"))
        elif (why := _refused_form(node)) is not None:
            refused.append((name, node.op_type, why))
        elif not _has_converter(node):
            why = OTHER_OP.get(node.op_type, "the ONNX frontend has no converter for it, and ONNX defines it by no function "
                                             "without control flow")
            refused.append((name, node.op_type, why))
    return refused
