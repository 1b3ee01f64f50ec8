"""Quantized values in numpy, as ONNX's DequantizeLinear and TVM's dequantize define them."""

from __future__ import annotations

import numpy as np

# Ops that move quantized data as it is, without arithmetic: on int8 data between a dequantize
# and a quantize of one scale and zero point, they give the same values.
INT8_MOVES = ("relax.reshape", "relax.permute_dims", "relax.strided_slice", "relax.expand_dims", "relax.squeeze",
              "relax.flatten", "relax.broadcast_to")


def dequantize_array(data: np.ndarray, scale: np.ndarray, zero: np.ndarray, axis: int) -> np.ndarray:
    """(data - zero) * scale in float32; a scale or zero point of more than one value runs along
    `axis` of `data`."""
    data = np.asarray(data)
    shape = [1] * data.ndim
    if data.ndim:
        shape[axis % data.ndim] = -1

    def along_axis(values: np.ndarray) -> np.ndarray:
        values = np.asarray(values)
        return values.astype(np.float32).reshape(shape if values.size > 1 else ())

    return (data.astype(np.float32) - along_axis(zero)) * along_axis(scale)
