"""Names for the nodes a file leaves unnamed.

ONNX does not ask nodes for names: exporters write them, graphs built by hand with
`onnx.helper` often do not. byoc names nodes in its reports and errors, and tells nodes apart by
name while importing (a Tile whose repeats are a shape value), so a node without a name gets one
here: its op type and its position among the graph's nodes, `Relu_3` (with a suffix where the
file uses that name already). Before, an error read "Node  cannot handle ShapeExpr inputs", and
a report listed every unnamed Add as `Add`.
"""

from __future__ import annotations

import onnx


def named_nodes(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` itself where every node of its graph has a name; else a copy where each has."""
    if all(node.name for node in model.graph.node):
        return model
    named = onnx.ModelProto()
    named.CopyFrom(model)
    taken = {node.name for node in named.graph.node if node.name}
    for index, node in enumerate(named.graph.node):
        if node.name:
            continue
        name, suffix = f"{node.op_type}_{index}", 1
        while name in taken:
            name, suffix = f"{node.op_type}_{index}_{suffix}", suffix + 1
        node.name = name
        taken.add(name)
    return named
