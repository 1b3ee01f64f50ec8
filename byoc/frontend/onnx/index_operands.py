"""Index operands of Gather, GatherElements, GatherND, ScatterND and ScatterElements.

ONNX allows an index in [-n, n-1] along an axis of size n, negatives counted from the end;
anything else is an error (onnxruntime raises). TVM's kernels do not check: an index of n read
the row after the table, 5n read NaN, 1e8 crashed the process. TVM's converters make negatives
positive first with `where(i < 0, i + n, i)`, which also maps an index below -n onto a valid
negative one: onnxruntime, running that in a region, returned the wrong row without a word.
So here:
- a constant index is checked at import and made positive in numpy;
- an index known only at run time reaches the op as given: in byoc's modules the index operand
  of take (in wrap mode, which is ONNX's meaning on the valid range), gather_elements,
  gather_nd, scatter_elements and scatter_nd follows ONNX's rule. byoc's host pipeline checks it
  and counts negatives from the end (`byoc.host.indices`); vendors that run ONNX hand it on, and
  onnxruntime checks it. (TVM's own legalizations of gather_elements, gather_nd and scatter_nd
  do not count negatives from the end: build such modules with `byoc.build`.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import onnx
import tvm
from tvm import relax

from byoc.ir.types import constant_array, is_tensor_constant


def _axis(attrs: dict, rank: int) -> int:
    axis = int(attrs.get("axis", 0))
    return axis + rank if axis < 0 else axis


def checked_constant(indices: np.ndarray, extents: Sequence[int], axes: Sequence[int], per_slot: bool) -> np.ndarray:
    """`indices` with negatives counted from the end; an error naming the first index out of
    [-n, n-1]. With `per_slot`, the last axis holds coordinates, slot j along `axes[j]`."""
    sizes = np.asarray(extents, dtype=np.int64)
    if not per_slot:
        sizes = sizes.reshape(())
    values = indices.astype(np.int64)
    wrong = (values < -sizes) | (values >= sizes)
    if wrong.any():
        position = tuple(int(p) for p in np.argwhere(wrong)[0])
        slot = position[-1] if per_slot else 0
        raise ValueError(f"index {int(values[position])} is out of range for axis {axes[slot]} of size {extents[slot]}; "
                         f"valid indices are {-extents[slot]} to {extents[slot] - 1}")
    return np.where(values < 0, values + sizes, values).astype(indices.dtype)


def _reduction(attrs: dict) -> str:
    value = attrs.get("reduction", b"none")
    value = value.decode() if isinstance(value, bytes) else str(value)
    return "update" if value in ("none", "") else value


# Each op's Relax form, from (data, indices, the node's inputs, its attributes, the indexed axes).
_Build = Callable[[relax.Expr, relax.Expr, Sequence[relax.Expr], dict, list[int]], relax.Expr]
_BUILDS: dict[str, _Build] = {
    "GatherElements": lambda data, indices, inputs, attrs, axes: relax.op.gather_elements(data, indices, axes[0]),
    "GatherND": lambda data, indices, inputs, attrs, axes: relax.op.gather_nd(data, indices, int(attrs.get("batch_dims", 0))),
    "ScatterElements": lambda data, indices, inputs, attrs, axes: relax.op.scatter_elements(
        data, indices, inputs[2], axes[0], _reduction(attrs)),
    "ScatterND": lambda data, indices, inputs, attrs, axes: relax.op.scatter_nd(data, indices, inputs[2], _reduction(attrs)),
}


def _converter(op: str) -> Callable[..., relax.Expr | None]:
    per_slot = op in ("GatherND", "ScatterND")

    def convert(bb, inputs, attrs, opset, tvm_converter) -> relax.Expr | None:
        data, indices = inputs[0], inputs[1]
        if op == "Gather" and attrs.get(SHAPE_ONLY_ATTR) and isinstance(data, relax.ShapeExpr) and is_tensor_constant(indices) \
                and indices.ty.ndim == 1:
            # A shape's dimensions picked by constant indices, read only as a shape (see
            # `mark_shape_only`): onnxruntime's transpose optimizer (run by `quant_pre_process`
            # before quantization) writes Shape(Transpose(x)) as Gather(Shape(x), perm). It stays
            # a shape value, which TVM's converters of Slice, Concat and Reshape follow; TVM's own
            # makes it a tensor, and a Reshape to a tensor is refused where a dimension is symbolic.
            dims = list(data.values)
            picked = checked_constant(constant_array(indices), [len(dims)], [0], False)
            return relax.ShapeExpr([dims[int(i)] for i in picked])
        if not (isinstance(data.ty, relax.TensorType) and isinstance(indices.ty, relax.TensorType)):
            return None  # a shape value: TVM's converter takes a dimension from it
        if op == "Gather" and is_tensor_constant(data) and is_tensor_constant(indices):
            return None  # TVM's converter folds it in numpy, which raises on an index out of range
        if per_slot:
            start = int(attrs.get("batch_dims", 0))
            slots = indices.ty.shape.values[-1] if indices.ty.shape is not None else None
            if not isinstance(slots, tvm.ir.prim.expr.IntImm):
                return None
            axes = list(range(start, start + int(slots)))
        else:
            axes = [_axis(attrs, data.ty.ndim)]
        extents = [data.ty.shape.values[a] for a in axes] if data.ty.shape is not None else []
        # Constant indices into static axes are checked now; into a dynamic axis (the first
        # token of every sequence) they are taken as the op defines them, at run time.
        constant = is_tensor_constant(indices) and all(isinstance(e, tvm.ir.prim.expr.IntImm) for e in extents)
        if constant:  # only the indexed axes need a size (Falcon's GatherND picks among q, k, v of any batch)
            checked = checked_constant(constant_array(indices), [int(e) for e in extents], axes, per_slot)
            indices = relax.const(checked, str(checked.dtype))
        if op == "Gather":  # wrap: ONNX's meaning on the valid range, for every reader of the module
            return relax.op.take(data, indices, axes[0], mode="fast" if constant else "wrap")
        if op == "GatherND" and constant and axes[0] == 0 and math.prod(checked.shape[:-1]) == 1:
            # One constant coordinate (Falcon's `qkv[..., -2, :]`, exported as a transpose and a
            # GatherND): a slice, which vendors take, rather than a gather.
            point = [int(i) for i in checked.reshape(-1)]
            sliced = relax.op.strided_slice(data, axes, point, [i + 1 for i in point])
            return relax.op.reshape(sliced, [*checked.shape[:-1], *data.ty.shape.values[len(point):]])
        return _BUILDS[op](data, indices, inputs, attrs, axes)

    return convert


INDEX_CONVERTERS = {op: _converter(op) for op in ("Gather", *_BUILDS)}

SHAPE_ONLY_ATTR = "byoc_shape_only"
# Readers that take a shape value at this input (TVM's converters accept one there), and those
# that pass one on to their own readers.
_TAKES_SHAPE = {("Reshape", 1), ("Expand", 1), ("ConstantOfShape", 0)}
_PASSES_SHAPE = {"Concat", "Slice", "Gather", "Cast", "Squeeze"}


def mark_shape_only(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each Gather of a Shape by constant 1-D indices marked (`byoc_shape_only`)
    where its result is read only as a shape: legacy exports also compute with such a value
    (BERT's mask multiplies by the batch size), which needs it as a tensor."""
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    producers = {}
    for node in model.graph.node:
        for index, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, index))
        for name in node.output:
            producers[name] = node
    outputs = {o.name for o in model.graph.output}

    def only_as_shape(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name in outputs or name in seen or not readers.get(name):
            return False
        return all((node.op_type, index) in _TAKES_SHAPE or
                   ((node.op_type == "Concat" or (node.op_type in _PASSES_SHAPE and index == 0))
                    and only_as_shape(node.output[0], seen | {name}))
                   for node, index in readers[name])

    marked = [node for node in model.graph.node if node.op_type == "Gather" and len(node.input) == 2
              and getattr(producers.get(node.input[0]), "op_type", None) == "Shape" and only_as_shape(node.output[0])]
    if not marked:
        return model
    result = onnx.ModelProto()
    result.CopyFrom(model)
    names = {id(node) for node in marked}
    for copy, node in zip(result.graph.node, model.graph.node):
        if id(node) in names:
            copy.attribute.append(onnx.helper.make_attribute(SHAPE_ONLY_ATTR, 1))
    return result
