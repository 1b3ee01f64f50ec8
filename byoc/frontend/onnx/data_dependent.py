"""A model whose shapes depend on its data, cut where they start to.

A detector's post-processing keeps the boxes that pass a score threshold (NonZero), takes the
best k of them where k is how many passed (TopK of a computed k), and suppresses overlaps
(NonMaxSuppression): from there on, every shape depends on the image. TVM's importer and byoc's
compiler take shapes known before the run (or named dimensions within ranges); the import
failed ("Node /ReduceMin cannot handle ShapeExpr inputs"), where onnxruntime runs the file.

Here the graph is cut in two. The head (every node whose inputs' shapes do not depend on the
data: the backbone and heads, nearly all of the work) is compiled as any model is, partitioned
among vendors. The tail (the nodes that make such shapes, and every node after them) runs in
onnxruntime, on the head's outputs, after the compiled model: the report names it and why.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import onnx

from byoc.frontend.onnx.graph_inputs import subgraph_reads

# Ops whose output shape depends on input values, whatever the shapes of their inputs.
DATA_DEPENDENT_SOURCES = frozenset({"NonZero", "NonMaxSuppression", "Unique", "Compress", "Loop", "Scan"})
# Ops whose output shape depends on one input's values (the index): data-dependent unless that
# input is a constant of the file.
_SHAPE_OPERAND = {"TopK": 1, "Reshape": 1, "Expand": 1, "Tile": 1, "ConstantOfShape": 0, "Range": 0, "Slice": 1, "Resize": 2,
                  "Pad": 1, "OneHot": 1, "Upsample": 1, "Squeeze": 1, "Unsqueeze": 1, "ReduceSum": 1, "ReduceMax": 1,
                  "ReduceMin": 1, "ReduceMean": 1, "ReduceProd": 1, "Split": 1}


@dataclass(frozen=True)
class Cut:
    """The two parts of a model whose shapes depend on its data (see above): the head, the
    tail, the node where the tail starts and why."""

    head: onnx.ModelProto
    tail: onnx.ModelProto
    first: str
    why: str
    nodes: int  # how many nodes the tail has


def _constants(model: onnx.ModelProto) -> set[str]:
    return {init.name for init in model.graph.initializer} | {n.output[0] for n in model.graph.node if n.op_type == "Constant"}


def _why(node: onnx.NodeProto, values: set[str]) -> str | None:
    """Why `node` makes a shape that depends on the data (`values`: the tensors whose values
    do), or None."""
    if node.op_type in DATA_DEPENDENT_SOURCES:
        return f"{node.op_type} makes a shape from its input's values"
    operand = _SHAPE_OPERAND.get(node.op_type)
    if operand is None or len(node.input) <= operand or node.input[operand] not in values:
        return None
    return f"{node.op_type} takes a size the data decides"


def cut_data_dependent(model: onnx.ModelProto) -> Cut | None:
    """The head and tail of `model` (a graph in topological order, with static input shapes),
    or None where no shape depends on the data."""
    graph = model.graph
    values = {v.name for v in graph.input} - _constants(model)  # tensors whose values depend on the data
    tail_tensors: set[str] = set()  # tensors whose shapes do
    tail_nodes: list[onnx.NodeProto] = []
    first = why = None
    for node in graph.node:
        reason = _why(node, values)
        if reason is not None or any(i in tail_tensors for i in _reads(node)):
            if reason is not None and first is None:
                first, why = node.name, reason
            tail_nodes.append(node)
            tail_tensors.update(node.output)
            values.update(node.output)
        elif node.op_type not in ("Shape", "Size", "Constant") and any(i in values for i in _reads(node)):
            values.update(node.output)  # a shape of a tensor of known shape is known
    if not tail_nodes:
        return None
    in_tail = {id(n) for n in tail_nodes}
    head_nodes = [n for n in graph.node if id(n) not in in_tail]
    produced = {o for n in head_nodes for o in n.output}
    consumed = {i for n in tail_nodes for i in _reads(n)} | {o.name for o in graph.output}
    # Constant nodes the tail reads are copied into it rather than passed through the head.
    copied = [n for n in head_nodes if n.op_type == "Constant" and n.output[0] in consumed]
    copied_names = {n.output[0] for n in copied}
    # What the tail reads of the head, the model's inputs among it: the head passes them on.
    boundary = [v.name for v in graph.input if v.name in consumed]
    boundary += [name for name in _ordered(produced, head_nodes) if name in consumed and name not in copied_names]
    head = _subgraph(model, head_nodes, list(graph.input), boundary, "head")
    tail = _subgraph(model, [*copied, *tail_nodes], boundary, [o.name for o in graph.output], "tail", head)
    return Cut(head, tail, first, why, len(tail_nodes))


def _reads(node: onnx.NodeProto) -> Iterable[str]:
    """Every tensor `node` reads, those its subgraphs (If's branches) read from outside included."""
    yield from (i for i in node.input if i)
    yield from subgraph_reads(node)


def _ordered(names: set[str], nodes: list[onnx.NodeProto]) -> list[str]:
    return [o for n in nodes for o in n.output if o in names]


def _value_info(model: onnx.ModelProto, head: onnx.ModelProto | None) -> dict[str, onnx.ValueInfoProto]:
    """What the file (or the head's inferred shapes) knows of each tensor's type."""
    known = {v.name: v for v in [*model.graph.value_info, *model.graph.input, *model.graph.output]}
    if head is not None:
        known.update({v.name: v for v in head.graph.output})
    return known


def _subgraph(model: onnx.ModelProto, nodes: list[onnx.NodeProto], inputs: list, outputs: list[str], part: str,
              head: onnx.ModelProto | None = None) -> onnx.ModelProto:
    read = {i for n in nodes for i in _reads(n)}
    initializers = [init for init in model.graph.initializer if init.name in read]
    if part == "head":
        graph = onnx.helper.make_graph(nodes, f"{model.graph.name}_head", list(inputs), [onnx.ValueInfoProto(name=o) for o in outputs],
                                       initializers)
        built = _with(model, graph)
        inferred = onnx.shape_inference.infer_shapes(built, data_prop=True)
        known = {v.name: v for v in [*model.graph.value_info, *inferred.graph.output, *inferred.graph.value_info, *inferred.graph.input]
                 if v.type.tensor_type.elem_type}
        del graph.output[:]
        graph.output.extend(_typed(known, o) for o in outputs)
        return _with(model, graph)
    known = _value_info(model, head)
    graph = onnx.helper.make_graph(nodes, f"{model.graph.name}_tail", [_typed(known, i) for i in inputs],
                                   [_typed(known, o) for o in outputs], initializers)
    return _with(model, graph)


def _typed(known: dict[str, onnx.ValueInfoProto], name: str) -> onnx.ValueInfoProto:
    value = known.get(name)
    if value is None or not value.type.tensor_type.elem_type:
        raise ValueError(f"the type of tensor {name!r} is unknown")
    typed = onnx.ValueInfoProto()
    typed.CopyFrom(value)
    return typed


def _with(model: onnx.ModelProto, graph: onnx.GraphProto) -> onnx.ModelProto:
    made = onnx.helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    made.producer_name = model.producer_name
    return made
