"""Nodes in the order their inputs are made.

ONNX asks a graph's nodes to be topologically sorted, and onnx's checker refuses a graph that is
not; onnxruntime sorts graphs itself and runs them. Tools write such graphs: onnxruntime's own
`convert_float_to_float16(keep_io_types=True)` appends the casts of the graph's inputs after the
nodes that read them. byoc sorts them as onnxruntime does, so the file runs in both.
"""

from __future__ import annotations

import heapq

import onnx

from byoc.frontend.onnx.graph_inputs import subgraph_reads


def topologically_sorted(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` itself where its nodes are in order; else a copy with them reordered, as close to
    the file's order as their inputs allow. A cycle, or a name no node makes, is left for the
    checker to name."""
    graph = model.graph
    made_by = {name: index for index, node in enumerate(graph.node) for name in node.output if name}
    # a node reads its inputs, and what its subgraphs (If and Loop bodies) read from outside them
    needs = [{made_by[name] for name in (*node.input, *subgraph_reads(node)) if name in made_by and made_by[name] != index}
             for index, node in enumerate(graph.node)]
    if all(all(producer < index for producer in needed) for index, needed in enumerate(needs)):
        return model
    # Kahn's algorithm, taking the ready node that comes first in the file.
    users: dict[int, list[int]] = {}
    for index, needed in enumerate(needs):
        for producer in needed:
            users.setdefault(producer, []).append(index)
    missing = [len(needed) for needed in needs]
    ready = [index for index, count in enumerate(missing) if count == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        index = heapq.heappop(ready)
        order.append(index)
        for user in users.get(index, ()):
            missing[user] -= 1
            if missing[user] == 0:
                heapq.heappush(ready, user)
    if len(order) < len(graph.node):
        return model  # a cycle
    result = onnx.ModelProto()
    result.CopyFrom(model)
    del result.graph.node[:]
    result.graph.node.extend(graph.node[index] for index in order)
    return result
