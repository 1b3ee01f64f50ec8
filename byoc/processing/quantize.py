"""Partial quantization (paper section 3.2): a float region runs in int8 inside.

Quantize/dequantize pairs are inserted at the region's boundary and around every kernel (a
composite, or a single op): a kernel reads the dequantized int8 values of its inputs and its
int8 weights, computes, and its result is quantized again. This is the QDQ form that int8
accelerator compilers consume and that TVM can execute, so a quantized region is also its own
numerical reference. Scales are symmetric (zero point 0), per tensor for activations and per
output channel (or per tensor) for weights, from calibration at compile time or from the data
at run time, optionally rounded up to powers of two for fixed-point hardware. Activations may
instead be asymmetric, int8 with a zero point (TFLite's int8, which Ethos-U runs), so that a
ReLU's output spends all 256 levels on its non-negative range.

A quantized model's region starts from the model's own ranges instead of calibration (see
byoc.processing.adopt).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from byoc.codegen_json.references import kernels, ref_key
from byoc.errors import QuantizationError
from byoc.processing.json_rewrite import GraphWriter
from byoc.processing.ranges import METHODS

CALIBRATION_ATTR = "byoc.calibration"
# What a device's own quantization of a quantized model's region adds to its error, measured on
# the calibration samples: {"samples": n, "relative_l2": e}.
REQUANTIZATION_ATTR = "byoc.requantization"
_QUANTIZE_ATTRS = "relax.attrs.QuantizeAttrs"
# Ops whose second operand is a weight, and the axis of its output channels by layout.
QUANTIZED_WEIGHT_OPS = {"relax.nn.conv2d", "relax.matmul"}
_QMAX = {"int8": 127, "uint8": 255, "int16": 32767}
_TINY = 1e-8
# The largest weight magnitude whose pairs of products with a u8 source fit the 16-bit sums of x86
# int8 kernels without VNNI (`vpmaddubsw`): 255 * 2 * 64 = 32,640 <= 32,767.
WEIGHT_LEVELS_WITHOUT_VNNI = 64


INTEGER_RANGES = {"int8": (-128, 127), "uint8": (0, 255)}  # the activation types a quantized model has


def with_zero_point(low: float, high: float, dtype: str) -> tuple[float, int]:
    """Scale and zero point that map [low, high], widened to hold 0 (zero padding and ReLU need
    zero exactly), onto the whole range of `dtype` (int8 or uint8)."""
    qmin, qmax = INTEGER_RANGES[dtype]
    low, high = min(float(low), 0.0), max(float(high), 0.0)
    scale = float(np.float32(max(high - low, _TINY) / (qmax - qmin)))
    return scale, int(np.clip(round(qmin - low / scale), qmin, qmax))


@dataclass(frozen=True)
class QuantizationConfig:
    dtype: str = "int8"
    per_channel: bool = True
    power_of_two: bool = False
    calibration: str = "static"  # "static": scales from calibration data; "dynamic": from the data at run time
    calibration_method: str = "minmax"  # how calibration data becomes ranges (byoc.processing.ranges)
    symmetric: bool = True  # activations: zero point 0; else int8 with a zero point over [low, high]
    # The largest weight in steps: 127, or 64 for x86 int8 kernels without VNNI, which add pairs of
    # u8 x s8 products in 16 bits (255 * 2 * 64 fits; onnxruntime's `reduce_range` for the same CPUs).
    weight_levels: int = 127

    def __post_init__(self) -> None:
        if self.dtype != "int8":
            raise QuantizationError(f"quantization to {self.dtype} is not supported; int8 is")
        if self.calibration not in ("static", "dynamic"):
            raise QuantizationError(f"calibration must be 'static' or 'dynamic', not {self.calibration!r}")
        if self.calibration_method not in METHODS:
            raise QuantizationError(f"calibration_method must be one of {', '.join(METHODS)}, not {self.calibration_method!r}")
        if self.power_of_two and not self.symmetric:
            raise QuantizationError("power-of-two scales are fixed-point positions: they need symmetric quantization")

    def scale(self, magnitude: np.ndarray | float, levels: int | None = None) -> np.ndarray:
        scale = np.maximum(np.asarray(magnitude, dtype=np.float64), _TINY) / (levels or _QMAX[self.dtype])
        if self.power_of_two:
            scale = np.exp2(np.ceil(np.log2(scale)))
        return scale.astype(np.float32)

    def activation(self, low: float, high: float) -> tuple[float, int]:
        """Scale and zero point for a tensor ranging over [low, high]. Asymmetric, the range is
        widened to hold 0, as zero padding and ReLU need zero exactly representable."""
        if self.symmetric:
            return float(self.scale(max(abs(low), abs(high)))), 0
        return with_zero_point(low, high, "int8")

    def quantize_weights(self, weights: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
        """int8 weights and their scales: per slice along `axis` (flattened) when per channel,
        else one scale (shape ())."""
        if self.per_channel:
            scales = self.weight_scale(weights, tuple(a for a in range(weights.ndim) if a != axis))
        else:
            scales = self.weight_scale(weights, None)
        quantized = np.clip(np.round(weights / scales), -self.weight_levels, self.weight_levels).astype(np.int8)
        return quantized, scales.reshape(-1) if self.per_channel else scales.reshape(())

    def weight_scale(self, weights: np.ndarray, reduce_axes: tuple[int, ...] | None) -> np.ndarray:
        """Scales for `weights`, one per slice along the axes not reduced (None: one in all).

        With power-of-two scales the step from the largest weight is up to twice too coarse; a
        finer power that clips a few outliers often loses less, so each of the two next finer
        powers is tried and the one with the least squared error kept (VGG-19 on the DPU: the
        relative error of the output went from 6.7% to 5.5%, ResNet-18 from 4.8% to 4.4%).
        """
        scale = self.scale(np.abs(weights).max(axis=reduce_axes, keepdims=True), self.weight_levels)
        if not self.power_of_two:
            return scale
        best, best_error = scale, None
        for candidate in (scale, scale / 2, scale / 4):
            restored = np.clip(np.round(weights / candidate), -self.weight_levels, self.weight_levels) * candidate
            error = np.sum((restored - weights) ** 2, axis=reduce_axes, keepdims=True)
            best = candidate if best_error is None else np.where(error < best_error, candidate, best)
            best_error = error if best_error is None else np.minimum(error, best_error)
        return best.astype(np.float32)


@dataclass
class RegionCalibration:
    """Observed ranges of a region's tensors over the calibration set: per region input, and per
    kernel (in graph order) per output, as [low, high]."""

    samples: int
    inputs: list[list[float]]
    kernels: list[list[list[float]]]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> RegionCalibration:
        return cls(**json.loads(text))


def weight_axis(node: Mapping[str, Any], weights: np.ndarray) -> int:
    """The axis of a weight's output channels: O of a convolution's kernel layout, a dense layer's last."""
    return node["attrs"].get("kernel_layout", "OIHW").index("O") if node["op"] == "relax.nn.conv2d" else weights.ndim - 1


class _Quantizer:
    def __init__(self, graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], config: QuantizationConfig,
                 calibration: RegionCalibration | None) -> None:
        self.graph = graph
        self.config = config
        self.calibration = calibration
        self.writer = GraphWriter(graph, constants)
        self.constants = constants

    def _scalar(self, value, dtype: str) -> dict:
        return self.writer.constant(np.asarray(value, dtype=dtype), "q")

    def _pair(self, value: dict, shape, bounds: list[float] | None, name: str) -> dict:
        """quantize + dequantize of `value` (over `bounds`, None: from the data at run time);
        returns the dequantized reference."""
        w = self.writer
        qtype = self.config.dtype
        if bounds is None:
            zero, scale = self._scalar(0, qtype), self._runtime_scale(value, shape, name)
        else:
            scale_value, zero_point = self.config.activation(*bounds)
            zero, scale = self._scalar(zero_point, qtype), self._scalar(scale_value, "float32")
        attrs = {"axis": -1, "out_dtype": qtype}
        quantized = w.add("relax.quantize", [value, scale, zero], [{"shape": shape, "dtype": qtype}], name, attrs, _QUANTIZE_ATTRS)
        attrs = {"axis": -1, "out_dtype": "float32"}
        return w.add("relax.dequantize", [quantized, scale, zero], [{"shape": shape, "dtype": "float32"}], name, attrs, _QUANTIZE_ATTRS)

    def _runtime_scale(self, value: dict, shape, name: str) -> dict:
        """scale = max|x| / qmax (rounded up to a power of two when asked), computed per call."""
        w = self.writer
        scalar = {"shape": [], "dtype": "float32"}
        magnitude = w.add("relax.abs", [value], [{"shape": shape, "dtype": "float32"}], name)
        peak = w.add("relax.max", [magnitude], [scalar], name, {"axis": None, "keepdims": False}, "relax.attrs.StatisticalAttrs")
        peak = w.add("relax.maximum", [peak, self._scalar(_TINY, "float32")], [scalar], name)
        scale = w.add("relax.divide", [peak, self._scalar(_QMAX[self.config.dtype], "float32")], [scalar], name)
        if self.config.power_of_two:
            log2 = w.add("relax.divide", [w.add("relax.log", [scale], [scalar], name), self._scalar(math.log(2.0), "float32")], [scalar], name)
            scale = w.add("relax.power", [self._scalar(2.0, "float32"), w.add("relax.ceil", [log2], [scalar], name)], [scalar], name)
        return scale

    def _weight(self, node: dict, ref: dict) -> dict:
        """int8 weights with their scales, dequantized for the kernel."""
        w = self.writer
        weights = self.constants[ref["const"]]
        axis = weight_axis(node, weights)
        quantized, scales = self.config.quantize_weights(weights, axis)
        if self.config.per_channel:
            scale_ref, zero_ref, attrs = w.constant(scales, "wscale"), w.constant(np.zeros(scales.shape, np.int8), "wzero"), {"axis": axis}
        else:
            scale_ref, zero_ref, attrs = self._scalar(scales, "float32"), self._scalar(0, "int8"), {"axis": -1}
        stored = w.constant(quantized, "qweight")
        return w.add("relax.dequantize", [stored, scale_ref, zero_ref], [{"shape": list(weights.shape), "dtype": "float32"}],
                     node["name"], {**attrs, "out_dtype": "float32"}, _QUANTIZE_ATTRS)

    def _bounds(self, kind: str, index: int, output: int = 0) -> list[float] | None:
        if self.config.calibration == "dynamic":
            return None
        if kind == "input":
            return self.calibration.inputs[index]
        return self.calibration.kernels[index][output]

    def run(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        w = self.writer
        for index, spec in enumerate(self.graph["inputs"]):
            if spec["dtype"] == "float32":
                w.mapping[("input", index)] = self._pair({"input": index}, spec["shape"], self._bounds("input", index), spec["name"])
        for kernel in kernels(self.graph):
            for node in kernel.nodes:
                args = []
                for position, arg in enumerate(node["args"]):
                    is_weight = node["op"] in QUANTIZED_WEIGHT_OPS and position == 1 and "const" in arg
                    is_weight = is_weight and self.graph["constants"][arg["const"]]["dtype"] == "float32"
                    args.append(self._weight(node, arg) if is_weight else w.lookup(arg))
                w.copy(node, args)
            for output, ref in enumerate(kernel.output_refs()):
                spec = kernel.result["outputs"][output]
                if spec["dtype"] == "float32":
                    bounds = self._bounds("kernel", kernel.index, output)
                    w.mapping[ref_key(ref)] = self._pair(w.mapping[ref_key(ref)], spec["shape"], bounds, kernel.result["name"])
        graph = w.graph([w.lookup(ref) for ref in self.graph["outputs"]])
        return graph, w.used_constants(graph)


def quantize_graph(
    graph: Mapping[str, Any],
    constants: Mapping[str, np.ndarray],
    config: QuantizationConfig,
    calibration: RegionCalibration | None = None,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The QDQ form of a region's JSON graph."""
    where = f"region {graph['symbol']} ({graph['backend']})"
    if config.calibration == "static":
        if calibration is None:
            raise QuantizationError(f"{where}: static quantization needs calibration data; partition with calibration=[...] inputs")
        count = len(kernels(graph))
        if len(calibration.kernels) != count or len(calibration.inputs) != len(graph["inputs"]):
            raise QuantizationError(f"{where}: the calibration covers {len(calibration.kernels)} kernels, the region has {count}")
    return _Quantizer(graph, constants, config, calibration).run()
