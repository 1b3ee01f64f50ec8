"""Quantized models as users make them: onnxruntime's `quantize_static`, QDQ format, and its
`quantize_dynamic`.

The usual recipe, from onnxruntime's documentation: `quant_pre_process` (shape inference and
graph optimisation, which folds batch norms into convolutions), then `quantize_static`
calibrated on a few inputs, with per-channel int8 weights. Activations are uint8 (u8, the fast
format of onnxruntime's AVX2 kernels without VNNI) or int8 (s8, its default).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence

import numpy as np
import onnx

ACTIVATION_TYPES = ("uint8", "int8")


def quantize_static(model: onnx.ModelProto, calibration: Sequence[Mapping[str, np.ndarray]], activations: str = "uint8",
                    per_channel: bool = True, operators: bool = False, reduce_range: bool = False) -> onnx.ModelProto:
    """`model` quantized by onnxruntime's tool (int8 weights, `activations` uint8 or int8),
    calibrated on `calibration` (dicts of inputs by name): in the QDQ format, or with
    `operators` in the QOperator format (QLinearConv, QLinearAdd, ...). `reduce_range` quantizes
    the weights to 7 bits, as onnxruntime advises for x86 CPUs without VNNI."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType
    from onnxruntime.quantization import quantize_static as ort_quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    if activations not in ACTIVATION_TYPES:
        raise ValueError(f"activations={activations!r}; expected one of {ACTIVATION_TYPES}")

    class _Samples(CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter([dict(s) for s in calibration])

        def get_next(self):
            return next(self.samples, None)

    with tempfile.TemporaryDirectory() as tmp:
        source, prepared, quantized = (os.path.join(tmp, f"{name}.onnx") for name in ("model", "prepared", "quantized"))
        onnx.save(model, source)
        # Symbolic shape inference is for dynamic dimensions and needs sympy, which byoc does not
        # depend on; the zoo's models have static shapes, which onnx's own inference serves.
        quant_pre_process(source, prepared, skip_symbolic_shape=True)
        ort_quantize_static(prepared, quantized, _Samples(), quant_format=QuantFormat.QOperator if operators else QuantFormat.QDQ,
                            per_channel=per_channel,
                            activation_type=QuantType.QUInt8 if activations == "uint8" else QuantType.QInt8,
                            weight_type=QuantType.QInt8, reduce_range=reduce_range)
        return onnx.load(quantized)


def quantize_dynamic(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` quantized by onnxruntime's `quantize_dynamic` with its defaults as users call it
    (int8 weights per tensor; activations quantized at run time by DynamicQuantizeLinear, each
    dense layer a MatMulInteger): no calibration."""
    from onnxruntime.quantization import QuantType
    from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        source, quantized = (os.path.join(tmp, f"{name}.onnx") for name in ("model", "quantized"))
        onnx.save(model, source)
        ort_quantize_dynamic(source, quantized, weight_type=QuantType.QInt8)
        return onnx.load(quantized)
