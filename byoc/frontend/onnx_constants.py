"""Constant folding on the ONNX graph, before import, with onnx's reference evaluator.

TVM's converters take shapes, axes and sizes only as constants, but models (and ONNX function
bodies) compute them: Shape, Gather, Concat, Cast on integers. byoc compiles for static
shapes, so every Shape is a constant, and so is every node whose inputs all are; such nodes are
evaluated here by `onnx.reference` (onnx's own implementation of every op) and become
initializers. It also turns the `ConstantOfShape` weights of onnx's light graphs into
initializers in milliseconds, where TVM's FoldConstant compiled a kernel for each (31 s for
DenseNet-121).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from byoc.frontend.onnx_inputs import subgraph_reads

# Ops whose results are not a function of their inputs alone.
_NOT_FOLDED = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli",
                         "If", "Loop", "Scan", "SequenceEmpty", "SequenceConstruct", "Optional"})
# A folded tensor larger than this stays a computation: folding trades memory for nothing.
_MAX_FOLDED_ELEMENTS = 1 << 24
_SMALL = 1024  # initializers up to this many elements are shown to shape inference with their values
# Folding makes shapes known that make more nodes foldable (a Reshape to a computed shape, then
# the Shape of its result): a few passes reach the fixed point of the graphs seen.
_PASSES = 8


def _static_shapes(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    """Every value's inferred shape, where onnx's shape inference finds it static.

    Inference sees large initializers as typed inputs only: it needs their shapes, not their
    data, and copying the model with its weights (550 MB for VGG-19) would cost more than the
    inference itself. Small ones keep their values, which may be shapes.
    """
    graph = model.graph
    small = [init for init in graph.initializer if int(np.prod(init.dims)) <= _SMALL]
    typed_inputs = [onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
                    for init in graph.initializer if int(np.prod(init.dims)) > _SMALL]
    inputs = []
    for value in graph.input:
        copy = onnx.ValueInfoProto()
        copy.CopyFrom(value)
        if value.name in input_shapes:
            dims = copy.type.tensor_type.shape.dim
            del dims[:]
            for size in input_shapes[value.name]:
                dims.add().dim_value = int(size)
        inputs.append(copy)
    light = onnx.helper.make_graph(graph.node, graph.name, [*inputs, *typed_inputs], graph.output, small)
    typed = onnx.helper.make_model(light, opset_imports=model.opset_import, ir_version=model.ir_version)
    try:
        inferred = onnx.shape_inference.infer_shapes(typed, strict_mode=False)
    except Exception:  # inference is a help here: a model it cannot type folds less
        return {}
    shapes = {}
    for value in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]:
        tensor = value.type.tensor_type
        if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            shapes[value.name] = [d.dim_value for d in tensor.shape.dim]
    return shapes


def _evaluate(node: onnx.NodeProto, values: Mapping[str, np.ndarray], opset: Sequence[onnx.OperatorSetIdProto]) -> list[np.ndarray] | None:
    names = [name for name in node.input if name]
    inputs = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(values[n].dtype), values[n].shape) for n in names]
    outputs = [onnx.helper.make_empty_tensor_value_info(n) for n in node.output if n]
    model = onnx.helper.make_model(onnx.helper.make_graph([node], "fold", inputs, outputs), opset_imports=opset)
    try:
        with np.errstate(all="ignore"):
            results = ReferenceEvaluator(model).run(None, {n: values[n] for n in names})
    except Exception:  # an op the reference evaluator cannot run stays in the graph, for TVM
        return None
    arrays = [np.asarray(r) for r in results]
    if any(a.dtype == object or a.size > _MAX_FOLDED_ELEMENTS for a in arrays):
        return None
    return arrays


def fold_onnx_constants(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """A copy of `model` where every node whose inputs are all constant, and every Shape and
    Size of a tensor with a static shape, is replaced by an initializer (repeated while a pass
    folds something)."""
    for _ in range(_PASSES):
        folded = _fold_once(model, input_shapes)
        if folded is model:
            break
        model = folded
    return model


def _fold_once(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    graph = model.graph
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    shapes = _static_shapes(model, input_shapes)
    outputs = {value.name for value in graph.output}
    kept, folded = [], []
    inlined = False
    for node in graph.node:
        result = None
        if node.op_type == "If" and node.input[0] in values and not node.domain:
            # Static control flow: the branch a constant condition takes replaces the If. ONNX
            # names are unique across a graph and its subgraphs, so the branch's keep theirs.
            branch = next(a.g for a in node.attribute if a.name == ("then_branch" if values[node.input[0]].item() else "else_branch"))
            kept.extend(branch.node)
            kept.extend(onnx.helper.make_node("Identity", [inner.name], [outer]) for inner, outer in zip(branch.output, node.output) if outer)
            folded.extend(branch.initializer)
            values.update({init.name: numpy_helper.to_array(init) for init in branch.initializer})
            inlined = True
            continue
        if node.op_type in ("Shape", "Size") and node.input[0] not in values and node.input[0] in shapes and not node.domain:
            dims = np.array(shapes[node.input[0]], dtype=np.int64)
            if node.op_type == "Size":
                result = [np.array(dims.prod(), dtype=np.int64)]
            else:
                start = next((a.i for a in node.attribute if a.name == "start"), 0)
                end = next((a.i for a in node.attribute if a.name == "end"), len(dims))
                result = [dims[slice(start, end)]]
        elif (node.op_type not in _NOT_FOLDED and node.domain in ("", "ai.onnx") and not any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute)
              and all(name in values for name in node.input if name)):
            result = _evaluate(node, values, model.opset_import)
        if result is None or len(result) != len([n for n in node.output if n]):
            kept.append(node)
            continue
        for name, array in zip([n for n in node.output if n], result):
            values[name] = array
            folded.append(numpy_helper.from_array(np.require(array, requirements="C"), name))
    if not folded and not inlined:
        return model
    result = onnx.ModelProto()
    result.CopyFrom(model)
    del result.graph.node[:]
    result.graph.node.extend(kept)
    read = {name for node in kept for name in [*node.input, *subgraph_reads(node)]} | outputs
    result.graph.initializer.extend(init for init in folded if init.name in read)
    live = [init for init in result.graph.initializer if init.name in read]
    del result.graph.initializer[:]
    result.graph.initializer.extend(live)
    return result
