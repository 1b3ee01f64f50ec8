"""Specialisation: compiling an ONNX model for the shapes and shape-deciding values of its inputs.

byoc compiles for static shapes. An input with a dynamic dimension gets the shape of the data it
is run with, and an input that decides the shape of a result (the target shape of a Reshape,
the scales of a Resize, the axes of a reduction) is bound to its value, as TVM's converters
take such operands only as constants. A model is compiled once per specialisation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from byoc.errors import InputError

_REDUCTIONS = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
               "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")
_WINDOWS = ("HannWindow", "HammingWindow", "BlackmanWindow")

# Operands, by position, whose value decides an output's shape or that the importer needs as a
# constant (attributes that later opsets turned into inputs).
SHAPE_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "ConstantOfShape": (0,),
    "Slice": (1, 2, 3, 4),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Split": (1,),
    "SplitToSequence": (1,),
    "Pad": (1, 2, 3),
    "Resize": (1, 2, 3),
    "Upsample": (1,),
    "TopK": (1,),
    "OneHot": (1, 2),
    "Range": (0, 1, 2),
    "CenterCropPad": (1,),
    "AffineGrid": (1,),
    "Col2Im": (1, 2),
    "MaxUnpool": (2,),
    "NonMaxSuppression": (2, 3, 4),
    "Dropout": (1, 2),
    "Trilu": (1,),
    "CumSum": (1,),
    "DFT": (1, 2),
    "STFT": (1, 3),
    "MelWeightMatrix": (0, 1, 2, 3, 4),
    **{op: (1,) for op in _REDUCTIONS},
    **{op: (0,) for op in _WINDOWS},
}


def shape_operands(model: onnx.ModelProto) -> list[str]:
    """Graph inputs whose values reach a shape-deciding operand, directly or through other ops
    (a Reshape to a shape computed from an input, as expanded ONNX functions do), in input
    order. Only the shape of a Shape or Size node's input matters, not its values."""
    graph = model.graph
    producers = {out: node for node in graph.node for out in node.output}
    frontier = [node.input[i] for node in graph.node for i in SHAPE_OPERANDS.get(node.op_type, ()) if i < len(node.input) and node.input[i]]
    reached: set[str] = set()
    while frontier:
        name = frontier.pop()
        if name in reached:
            continue
        reached.add(name)
        producer = producers.get(name)
        if producer is not None and producer.op_type not in ("Shape", "Size"):
            frontier.extend(n for n in producer.input if n)
    initializers = {init.name for init in graph.initializer}
    return [v.name for v in graph.input if v.name in reached and v.name not in initializers]


def runtime_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs a caller feeds (those without an initializer), in order."""
    initializers = {init.name for init in model.graph.initializer}
    return [v for v in model.graph.input if v.name not in initializers]


def has_dynamic_shape(value: onnx.ValueInfoProto) -> bool:
    tensor = value.type.tensor_type
    return not tensor.HasField("shape") or any(not d.HasField("dim_value") for d in tensor.shape.dim)


@dataclass(frozen=True)
class Specialization:
    """What one compilation of a model is fixed to: input shapes and bound input values."""

    shapes: dict[str, list[int]]
    constants: dict[str, np.ndarray]

    def key(self) -> tuple:
        shapes = tuple(sorted((n, tuple(s)) for n, s in self.shapes.items()))
        values = tuple(sorted((n, str(a.dtype), a.shape, a.tobytes()) for n, a in self.constants.items()))
        return shapes, values


def specialize(model: onnx.ModelProto, inputs: Mapping[str, np.ndarray], bind: Sequence[str] = ()) -> Specialization:
    """The specialisation of `model` for `inputs` (by graph input name). Inputs named in `bind`
    are bound to their values too, as are the shape-deciding ones."""
    declared = {v.name: v for v in runtime_inputs(model)}
    missing = [name for name in declared if name not in inputs]
    if missing:
        raise InputError(f"missing input(s) {missing}")
    unknown = sorted(set(bind) - set(declared))
    if unknown:
        raise InputError(f"inputs to bind {unknown} are not inputs of the model; its inputs are {sorted(declared)}")
    bound = set(shape_operands(model)) | set(bind)
    shapes = {name: list(np.shape(inputs[name])) for name, value in declared.items() if name not in bound and has_dynamic_shape(value)}
    constants = {name: np.asarray(inputs[name]) for name in bound}
    return Specialization(shapes, constants)


def arrange(model: onnx.ModelProto, inputs: Sequence | Mapping) -> dict[str, np.ndarray]:
    """Inputs given by position (in graph input order) or by name, as a dict by name."""
    names = [v.name for v in runtime_inputs(model)]
    if isinstance(inputs, Mapping):
        unknown = sorted(set(inputs) - set(names))
        if unknown:
            raise InputError(f"unknown input(s) {unknown}; the model's inputs are {names}")
        return {name: np.asarray(value) for name, value in inputs.items()}
    if len(inputs) != len(names):
        raise InputError(f"the model takes {len(names)} input(s) ({', '.join(names)}), got {len(inputs)}")
    return {name: np.asarray(value) for name, value in zip(names, inputs)}
