"""Constant folding on the ONNX graph, before import, with onnx's reference evaluator.

TVM's converters take shapes, axes and sizes only as constants, but models (and ONNX function
bodies) compute them: Shape, Gather, Concat, Cast on integers. byoc compiles for static
shapes, so every Shape is a constant, and so is every node whose inputs all are; such nodes are
evaluated here by `onnx.reference` (onnx's own implementation of every op) and become
initializers. It also turns the `ConstantOfShape` weights of onnx's light graphs into
initializers in milliseconds, where TVM's FoldConstant compiled a kernel for each (31 s for
DenseNet-121).

Folding makes shapes known that make more nodes foldable: a Reshape to a computed shape has a
static result only once that shape is folded, and the Shape of that result folds only then. A
legacy (TorchScript) GPT-2 export chains this through every layer, so a pass that re-ran
shape inference on the whole graph after each round of folding needed 86 rounds (3.1 s) for 12
layers. Here one sweep in graph order infers each node's outputs again, from its inputs alone,
where folding has changed what is known: one sweep reaches the fixed point, and a second one,
which confirms it, folds nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from byoc.frontend.onnx.graph_inputs import subgraph_reads

# Ops whose results are not a function of their inputs alone.
_NOT_FOLDED = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli",
                         "If", "Loop", "Scan", "SequenceEmpty", "SequenceConstruct", "Optional"})
# A folded tensor larger than this stays a computation: folding trades memory for nothing.
_MAX_FOLDED_ELEMENTS = 1 << 24
_SMALL = 1024  # initializers up to this many elements are shown to shape inference with their values
_SUBGRAPH = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
# DequantizeLinear is folded after import, in numpy (byoc.frontend.fold_constants), where it is
# not a quantized weight that stays int8 (byoc.frontend.int8_weights): onnx's reference evaluator
# has no DequantizeLinear before opset 19.
_AFTER_IMPORT = frozenset({"DequantizeLinear"})


def _static(value_type: onnx.TypeProto | None) -> list[int] | None:
    """The shape of a tensor type, where every dimension is known."""
    if value_type is None or not value_type.HasField("tensor_type"):
        return None
    tensor = value_type.tensor_type
    if not tensor.HasField("shape") or not all(d.HasField("dim_value") for d in tensor.shape.dim):
        return None
    return [d.dim_value for d in tensor.shape.dim]


def _type_of(array: np.ndarray) -> onnx.TypeProto:
    return onnx.helper.make_tensor_type_proto(onnx.helper.np_dtype_to_tensor_dtype(array.dtype), array.shape)


def _inferred_types(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> dict[str, onnx.TypeProto]:
    """Every value's type as onnx's shape inference finds it on the whole graph.

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
                if isinstance(size, str):  # a named dynamic dimension
                    dims.add().dim_param = size
                else:
                    dims.add().dim_value = int(size)
        inputs.append(copy)
    light = onnx.helper.make_graph(graph.node, graph.name, [*inputs, *typed_inputs], graph.output, small)
    typed = onnx.helper.make_model(light, opset_imports=model.opset_import, ir_version=model.ir_version)
    try:
        inferred = onnx.shape_inference.infer_shapes(typed, strict_mode=False)
    except Exception:  # inference is a help here: a model it cannot type folds less
        return {value.name: value.type for value in inputs}
    return {value.name: value.type for value in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]}


class _Types:
    """Value types known so far, refined node by node as folding makes more of them known."""

    def __init__(self, model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> None:
        self.known = _inferred_types(model, input_shapes)
        self.opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
        self.opset_imports = list(model.opset_import)

    def shape(self, name: str) -> list[int] | None:
        return _static(self.known.get(name))

    def set_constant(self, name: str, array: np.ndarray) -> None:
        self.known[name] = _type_of(array)

    def infer(self, node: onnx.NodeProto, values: Mapping[str, np.ndarray]) -> None:
        """Infer `node`'s output types from its inputs' types and small constant values, where
        whole-graph inference left one unknown. Only the node's own inputs are handed over:
        the rest of the graph's types would make each call, and the sweep, quadratic."""
        outputs = [name for name in node.output if name]
        if all(self.shape(name) is not None for name in outputs) or any(a.type in _SUBGRAPH for a in node.attribute):
            return  # a subgraph's nodes read outer values whose types are not handed over
        names = [name for name in node.input if name]
        if any(name not in self.known for name in names):
            return
        domain = "" if node.domain == "ai.onnx" else node.domain
        try:
            schema = onnx.defs.get_schema(node.op_type, self.opsets.get(domain, 1), domain)
            data = {n: numpy_helper.from_array(values[n], n) for n in names if n in values and values[n].size <= _SMALL}
            inferred = onnx.shape_inference.infer_node_outputs(schema, node, {n: self.known[n] for n in names}, data,
                                                               opset_imports=self.opset_imports)
        except Exception:  # no schema (a custom domain), or inference refuses: the type stays unknown
            return
        for name, value_type in inferred.items():
            if name not in self.known or _static(value_type) is not None:
                self.known[name] = value_type


def _evaluate(node: onnx.NodeProto, values: Mapping[str, np.ndarray], opset: Sequence[onnx.OperatorSetIdProto]) -> list[np.ndarray] | None:
    names = [name for name in node.input if name]
    if node.op_type == "Constant" and [a.name for a in node.attribute] == ["value"]:
        arrays = [numpy_helper.to_array(node.attribute[0].t)]  # the common form, without building a model
    else:
        inputs = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(values[n].dtype), values[n].shape)
                  for n in names]
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
    Size of a tensor with a static shape, is replaced by an initializer, repeated until a
    sweep folds nothing more. Each sweep that changes the model folds a node or inlines an If,
    so the number of sweeps is bounded by the model's size; in practice it is two."""
    while True:
        folded = _fold_once(model, input_shapes)
        if folded is model:
            return model
        model = folded


def _fold_once(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    graph = model.graph
    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    types = _Types(model, input_shapes)
    for name, array in values.items():
        types.set_constant(name, array)
    outputs = {value.name for value in graph.output}
    kept, folded = [], []
    inlined = False
    pending = deque(graph.node)
    while pending:
        node = pending.popleft()
        result = None
        if node.op_type == "If" and node.input[0] in values and not node.domain:
            # Static control flow: the branch a constant condition takes replaces the If, and is
            # swept next. ONNX names are unique across a graph and its subgraphs, so the
            # branch's keep theirs.
            branch = next(a.g for a in node.attribute if a.name == ("then_branch" if values[node.input[0]].item() else "else_branch"))
            identities = [onnx.helper.make_node("Identity", [inner.name], [outer]) for inner, outer in zip(branch.output, node.output) if outer]
            pending.extendleft(reversed([*branch.node, *identities]))
            folded.extend(branch.initializer)
            for init in branch.initializer:
                values[init.name] = numpy_helper.to_array(init)
                types.set_constant(init.name, values[init.name])
            inlined = True
            continue
        dims = types.shape(node.input[0]) if node.op_type in ("Shape", "Size") and not node.domain else None
        if dims is not None and node.input[0] not in values:
            shape = np.array(dims, dtype=np.int64)
            if node.op_type == "Size":
                result = [np.array(shape.prod(), dtype=np.int64)]
            else:
                start = next((a.i for a in node.attribute if a.name == "start"), 0)
                end = next((a.i for a in node.attribute if a.name == "end"), len(shape))
                result = [shape[slice(start, end)]]
        elif (node.op_type not in _NOT_FOLDED and node.op_type not in _AFTER_IMPORT and node.domain in ("", "ai.onnx")
              and not any(a.type in _SUBGRAPH for a in node.attribute)
              and all(name in values for name in node.input if name)):
            result = _evaluate(node, values, model.opset_import)
        if result is None or len(result) != len([n for n in node.output if n]):
            kept.append(node)
            types.infer(node, values)
            continue
        for name, array in zip([n for n in node.output if n], result):
            values[name] = array
            types.set_constant(name, array)
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
