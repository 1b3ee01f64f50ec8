"""onnx's model checker, without handing it the weights.

`onnx.checker.check_model` serializes the whole model to pass it to C++: 1.0-1.2 s of a BERT-base
import (434 MB of float weights), for checks that read nothing of a weight but its size. Here the
checker gets the model with each large plain weight (`_LARGE` bytes or more, raw data of a type of
whole bytes) replaced by an empty stand-in of the same name and type, and the checks onnx makes of
such a weight are made here: dimensions not negative, raw data at least as large as its shape and
type need (with onnx's own message), no second value field.
"""

from __future__ import annotations

import math

import onnx
from onnx import TensorProto

_LARGE = 1 << 20
_BYTES = {
    TensorProto.UINT8: 1, TensorProto.INT8: 1, TensorProto.BOOL: 1,
    TensorProto.UINT16: 2, TensorProto.INT16: 2, TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2,
    TensorProto.FLOAT: 4, TensorProto.INT32: 4, TensorProto.UINT32: 4,
    TensorProto.DOUBLE: 8, TensorProto.INT64: 8, TensorProto.UINT64: 8,
}
_OTHER_VALUES = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data")


def check_model(model: onnx.ModelProto) -> None:
    """Raise `onnx.checker.ValidationError` where onnx's checker would."""
    skeleton = onnx.ModelProto()
    _copy_fields(model, skeleton, skip="graph")
    _copy_fields(model.graph, skeleton.graph, skip="initializer")
    for tensor in model.graph.initializer:
        size = len(tensor.raw_data) if _plain(tensor) else 0
        if size < _LARGE:
            skeleton.graph.initializer.add().CopyFrom(tensor)
            continue
        _check_weight(tensor, size)
        skeleton.graph.initializer.add(name=tensor.name, data_type=tensor.data_type, dims=[0])
    onnx.checker.check_model(skeleton)


def _plain(tensor: TensorProto) -> bool:
    return (tensor.data_type in _BYTES and tensor.HasField("raw_data")
            and tensor.data_location != TensorProto.EXTERNAL)


def _check_weight(tensor: TensorProto, size: int) -> None:
    name = tensor.name
    if any(d < 0 for d in tensor.dims):
        raise onnx.checker.ValidationError(f"TensorProto (tensor name: {name}) has a negative dimension {list(tensor.dims)}")
    if any(len(getattr(tensor, field)) for field in _OTHER_VALUES):
        raise onnx.checker.ValidationError(f"TensorProto (tensor name: {name}) should contain one and only one value field.")
    expected = math.prod(tensor.dims) * _BYTES[tensor.data_type]
    if size < expected:
        raise onnx.checker.ValidationError(f"TensorProto (tensor name: {name}) raw_data size ({size} bytes) is too small "
                                           f"for the declared shape and type ({expected} bytes required).")


def _copy_fields(source, target, skip: str) -> None:
    """Every field `source` sets but `skip`, copied into `target` (protobuf has no partial copy)."""
    for field, value in source.ListFields():
        if field.name == skip:
            continue
        held = getattr(target, field.name)
        if hasattr(held, "extend"):
            held.extend(value)
        elif hasattr(held, "CopyFrom"):
            held.CopyFrom(value)
        else:
            setattr(target, field.name, value)
