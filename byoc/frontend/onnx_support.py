"""Which ONNX ops the frontend imports, decided before anything is converted.

An op is handled when TVM's ONNX frontend has a converter for it (or byoc handles it itself);
a model with any other op is refused up front, naming every such node and why, rather than
failing halfway through a conversion.
"""

from __future__ import annotations

import onnx
from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map

_STANDARD_DOMAINS = ("", "ai.onnx")
# Handled by TVM's importer itself rather than through its converter table.
_BUILT_IN = frozenset({"Constant", "If"})


def _nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from _nodes(sub)


def unsupported_ops(model: onnx.ModelProto) -> list[tuple[str, str, str]]:
    """(node name, op type, reason) for every node the frontend does not import; empty when
    it imports them all."""
    converters = _get_convert_map()
    refused = []
    for node in _nodes(model.graph):
        name = node.name or (node.output[0] if node.output else node.op_type)
        if node.domain not in _STANDARD_DOMAINS:
            refused.append((name, node.op_type, f"ops of domain {node.domain!r} are not supported"))
        elif node.op_type not in converters and node.op_type not in _BUILT_IN:
            refused.append((name, node.op_type, "the ONNX frontend has no converter for it"))
    return refused
