"""Converters for ONNX's sequence ops, where TVM's are wrong or cannot read their input.

With static shapes a sequence is a tuple of known length, so every position is resolved at
import. TVM's converters take a sequence only as a tuple expression they can index in Python:
a sequence that was bound to a variable first (SplitToSequence's result) has no `len()` there,
and SequenceInsert counts a negative position one place too far (it inserts -1 after the last
tensor, where ONNX, like Python's `list.insert`, inserts before it), which returned the wrong
tensor with no error. Each converter here reads the sequence's tensors through its type, and
checks positions against the spec's ranges.
"""

from __future__ import annotations

from tvm import relax

from byoc.errors import ModelLoadError
from byoc.ir.types import constant_array, is_tensor_constant


def _tensors(bb: relax.BlockBuilder, sequence: relax.Expr) -> list[relax.Expr]:
    if isinstance(sequence, relax.Tuple):
        return list(sequence.fields)
    if not isinstance(sequence.ty, relax.TupleType):
        raise ModelLoadError(f"expected a sequence, got a value of type {sequence.ty}")
    return [bb.emit(relax.TupleGetItem(sequence, i)) for i in range(len(sequence.ty.fields))]


def _position(op: str, inputs, index: int, default: int, length: int, last: int) -> int:
    """The constant position operand `index` (or `default`), checked against [-length, last]
    as the spec gives it, and counted from the front."""
    if last < 0:
        raise ModelLoadError(f"{op} of an empty sequence")
    operand = inputs[index] if len(inputs) > index else None
    if operand is None:
        return default
    if not is_tensor_constant(operand):
        raise ModelLoadError(f"{op} with a position computed at run time is not supported: the sequence's tensors must be known at compile time")
    position = int(constant_array(operand).reshape(()))
    if not -length <= position <= last:
        raise ModelLoadError(f"{op} position {position} is out of range for a sequence of {length} tensors ([{-length}, {last}])")
    return position + length if position < 0 else position


def sequence_at(bb, inputs, attrs, opset, tvm) -> relax.Expr:
    tensors = _tensors(bb, inputs[0])
    return tensors[_position("SequenceAt", inputs, 1, 0, len(tensors), len(tensors) - 1)]


def sequence_erase(bb, inputs, attrs, opset, tvm) -> relax.Expr:
    tensors = _tensors(bb, inputs[0])
    erased = _position("SequenceErase", inputs, 1, len(tensors) - 1, len(tensors), len(tensors) - 1)
    return relax.Tuple([t for i, t in enumerate(tensors) if i != erased])


def sequence_insert(bb, inputs, attrs, opset, tvm) -> relax.Expr:
    tensors = _tensors(bb, inputs[0])
    tensors.insert(_position("SequenceInsert", inputs, 2, len(tensors), len(tensors), len(tensors)), inputs[1])
    return relax.Tuple(tensors)


def sequence_length(bb, inputs, attrs, opset, tvm) -> relax.Expr:
    return relax.const(len(_tensors(bb, inputs[0])), "int64")


def concat_from_sequence(bb, inputs, attrs, opset, tvm) -> relax.Expr:
    return tvm("ConcatFromSequence", [relax.Tuple(_tensors(bb, inputs[0]))], attrs)


SEQUENCE_CONVERTERS = {
    "SequenceAt": sequence_at,
    "SequenceErase": sequence_erase,
    "SequenceInsert": sequence_insert,
    "SequenceLength": sequence_length,
    "ConcatFromSequence": concat_from_sequence,
}
