"""ONNX function ops, expanded into the nodes that define them.

Many ONNX ops are defined in their schema as a function of other ops (Attention, Celu, Swish,
the window functions, the loss functions, MeanVarianceNormalization, ...). Where TVM has no
converter for such an op, or its converter implements another op of the same name, the node is
replaced by its function body before import: the mechanism ONNX defines for runtimes without a
kernel of their own, and the one onnxruntime uses. Bodies are expanded recursively; a body that
needs input types (a context-dependent function) gets them from onnx's shape inference.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import onnx
from onnx import AttributeProto, FunctionProto, NodeProto

_STANDARD = ("", "ai.onnx")


def _opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in _STANDARD), onnx.defs.onnx_opset_version())


def has_subgraphs(function: FunctionProto) -> bool:
    """Bodies with control flow (Scan, Loop, If) are not expanded: byoc imports no loops."""
    return any(a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS) for n in function.node for a in n.attribute)


def function_of(node: NodeProto, opset: int, input_types: dict[str, onnx.TypeProto]) -> FunctionProto | None:
    """The function body that defines `node` at `opset`, or None when its op has none (or only
    one with control flow)."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    except onnx.defs.SchemaError:
        return None
    plain = [v for v in schema.function_opset_versions if v <= opset]
    contextual = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if plain and (not contextual or max(plain) >= max(contextual)):
        function = FunctionProto()
        function.ParseFromString(schema.get_function_with_opset_version(max(plain)))
        return None if has_subgraphs(function) else function
    if contextual:
        types = [input_types.get(name, onnx.TypeProto()).SerializeToString() for name in node.input]
        try:
            text = schema.get_context_dependent_function_with_opset_version(max(contextual), _with_defaults(node, schema).SerializeToString(), types)
        except Exception:  # the schema cannot build a body for these input types
            return None
        function = FunctionProto()
        function.ParseFromString(text)
        return None if has_subgraphs(function) else function
    return None


def _with_defaults(node: NodeProto, schema: onnx.defs.OpSchema) -> NodeProto:
    """`node` with the schema's default value for each attribute it leaves out, which the body's
    attribute references may name."""
    complete = NodeProto()
    complete.CopyFrom(node)
    given = {a.name for a in node.attribute}
    for name, attr in schema.attributes.items():
        if name not in given and attr.default_value.name:
            complete.attribute.append(attr.default_value)
    return complete


def _instantiate(node: NodeProto, function: FunctionProto, schema: onnx.defs.OpSchema, prefix: str) -> list[NodeProto]:
    """The body of `function` with its formal inputs and outputs renamed to `node`'s, its own
    values to fresh names, and attribute references resolved against `node`'s attributes."""
    complete = _with_defaults(node, schema)
    attributes = {a.name: a for a in complete.attribute}
    names = {formal: actual for formal, actual in zip(function.input, node.input)}
    names.update({formal: actual for formal, actual in zip(function.output, node.output) if actual})

    def rename(name: str) -> str:
        if not name:
            return ""
        return names.get(name, prefix + name)

    body = []
    for inner in function.node:
        copy = NodeProto()
        copy.CopyFrom(inner)
        del copy.input[:], copy.output[:], copy.attribute[:]
        copy.input.extend(rename(n) for n in inner.input)
        copy.output.extend(rename(n) for n in inner.output)
        copy.name = prefix + (inner.name or inner.op_type)
        for attr in inner.attribute:
            if attr.ref_attr_name:
                if attr.ref_attr_name in attributes:
                    resolved = AttributeProto()
                    resolved.CopyFrom(attributes[attr.ref_attr_name])
                    resolved.name = attr.name
                    copy.attribute.append(resolved)
            else:
                copy.attribute.append(attr)
        body.append(copy)
    return body


def expand_functions(model: onnx.ModelProto, wanted: Callable[[NodeProto], bool], depth: int = 8) -> onnx.ModelProto:
    """A copy of `model` where each node that `wanted` selects and whose op has a function body
    is replaced by that body, recursively (`depth` levels at most)."""
    opset = _opset(model)
    if not any(wanted(node) for node in model.graph.node):
        return model
    result = onnx.ModelProto()
    result.CopyFrom(model)
    counter = itertools.count()
    for _ in range(depth):
        types = _value_types(result)
        nodes, changed = [], False
        for node in result.graph.node:
            function = function_of(node, opset, types) if wanted(node) else None
            if function is None:
                nodes.append(node)
                continue
            schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
            prefix = f"{node.name or node.op_type}/{node.op_type}_{next(counter)}/"
            nodes.extend(_instantiate(node, function, schema, prefix))
            _import_opsets(result, function)
            changed = True
        if not changed:
            break
        del result.graph.node[:]
        result.graph.node.extend(nodes)
    return result


def _import_opsets(model: onnx.ModelProto, function: FunctionProto) -> None:
    """Domains the body uses that the model does not import yet."""
    known = {o.domain for o in model.opset_import}
    for opset in function.opset_import:
        if opset.domain not in known and opset.domain not in _STANDARD:
            model.opset_import.append(opset)


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # types help context-dependent bodies only; without them, they are not expanded
        return {}
    graph = inferred.graph
    types = {v.name: v.type for v in [*graph.input, *graph.value_info, *graph.output]}
    for init in graph.initializer:
        types.setdefault(init.name, onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims)))
    return types
