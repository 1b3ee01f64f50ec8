"""A quantized model's own scales, for an int8 device that quantizes in its own form.

A device that computes in int8 (the DPU, Ethos-U) takes a quantized model's region with its
quantize and dequantize ops and its weights in float32 (`Limits.int8_weights` False). Here that
region is read back as a float region with one range per tensor: the range the model's
quantization gives it, [scale * (qmin - zero point), scale * (qmax - zero point)]. The device's
quantization (byoc.processing.quantize) then starts from those ranges instead of calibrating
again, and is exact where the device can hold the model's scales:

- Ethos-U (TFLite int8, a zero point per tensor): every activation keeps its scale; uint8
  becomes int8 by moving the zero point 128 down. Per-channel weights keep their scales
  (onnxruntime's tool makes them symmetric, max |w| / 127, which quantizing again gives back).
- The DPU (symmetric, power-of-two, per tensor): every scale is rounded up to a power of two and
  the weights are quantized again per tensor. That adds error: the build warns of it, with the
  error measured on the calibration samples where partitioning had some
  (byoc.runtime_metadata.calibration), and `build(strict=True)` refuses instead.

A model quantizes a ReLU's output as uint8 with zero point 0 and leaves the ReLU out: the range
itself clips (onnxruntime's tool drops a ReLU or ReLU6 before a quantize so). Where the device's
range is wider than the model's, the clip would be lost: it is put back into the kernel that
computes the value, as clip(0, the range's top).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from byoc.codegen_json.references import kernels, ref_key, tensor_refs
from byoc.errors import CodegenError
from byoc.ir.quantization import INT8_MOVES
from byoc.processing.json_rewrite import GraphWriter
from byoc.processing.quantize import INTEGER_RANGES, QUANTIZED_WEIGHT_OPS, QuantizationConfig, RegionCalibration, weight_axis

_QDQ = ("relax.quantize", "relax.dequantize")
_ACTIVATIONS = ("relax.nn.relu", "relax.clip")
# Ops whose output range lies within their inputs' (a model may leave their output unquantized).
_WITHIN_INPUTS = ("relax.nn.max_pool2d", "relax.nn.avg_pool2d", "relax.mean", *INT8_MOVES, "relax.concat", "relax.nn.relu", "relax.clip")


@dataclass(frozen=True)
class ModelScale:
    """One tensor's quantization in the model."""

    scale: float
    zero_point: int
    dtype: str

    @property
    def bounds(self) -> list[float]:
        low, high = INTEGER_RANGES[self.dtype]
        return [self.scale * (low - self.zero_point), self.scale * (high - self.zero_point)]


@dataclass
class AdoptedRegion:
    """The region in float32, the model's range for each tensor quantization reads (as
    calibration), and the model's scale of each tensor it quantizes, by float tensor key."""

    graph: dict[str, Any]
    constants: dict[str, np.ndarray]
    calibration: RegionCalibration
    scales: dict[tuple, ModelScale]


def holds_model_quantization(graph: Mapping[str, Any]) -> bool:
    return any(node["op"] in _QDQ for node in graph["nodes"])


def _constant(constants: Mapping[str, np.ndarray], ref: Mapping[str, Any], what: str) -> np.ndarray:
    if "const" not in ref:
        raise CodegenError(f"{what}: its scale and zero point must be constants")
    return np.asarray(constants[ref["const"]])


class _Reader:
    def __init__(self, graph: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> None:
        self.graph = graph
        self.constants = constants
        self.where = f"region {graph['symbol']} ({graph['backend']})"
        self.writer = GraphWriter(graph, constants)
        self.int8: dict[tuple, tuple[dict, ModelScale]] = {}  # key of an int8 value -> (the float value, its scale)
        self.scales: dict[tuple, ModelScale] = {}  # key of a float value (new graph) -> the model's scale for it
        composites = [n["composite"]["id"] for n in graph["nodes"] if n.get("composite")]
        self.next_composite = max(composites, default=-1) + 1

    def _model_scale(self, node: Mapping[str, Any]) -> ModelScale:
        what = f"{self.where}: node {node['name']!r} ({node['op']})"
        scale, zero = (_constant(self.constants, a, what) for a in node["args"][1:3])
        if scale.size != 1 or zero.size != 1:
            raise CodegenError(f"{what}: activations quantized per channel; the device takes one scale and zero point per tensor")
        dtype = node["outputs"][0]["dtype"] if node["op"] == "relax.quantize" else str(zero.dtype)
        if dtype not in INTEGER_RANGES:
            raise CodegenError(f"{what}: {dtype} quantization; the device computes in int8 (int8 or uint8 models)")
        return ModelScale(float(scale.reshape(-1)[0]), int(zero.reshape(-1)[0]), dtype)

    def _quantized_readers(self) -> dict[tuple, ModelScale]:
        """Each float value of the source graph that the model quantizes, with its scale."""
        found: dict[tuple, ModelScale] = {}
        for node in self.graph["nodes"]:
            if node["op"] == "relax.quantize":
                found.setdefault(ref_key(node["args"][0]), self._model_scale(node))
        return found

    def _record(self, ref: dict, scale: ModelScale) -> None:
        self.scales.setdefault(ref_key(ref), scale)

    def run(self) -> AdoptedRegion:
        w = self.writer
        readers = self._quantized_readers()
        results = {kernel.result["id"]: kernel for kernel in kernels(self.graph)}
        for node in self.graph["nodes"]:
            op, out_key = node["op"], ("node", node["id"], 0)
            what = f"{self.where}: node {node['name']!r} ({op})"
            if op == "relax.quantize":
                source = w.lookup(node["args"][0])
                scale = self._model_scale(node)
                self.int8[out_key] = (source, scale)
                self._record(source, scale)
            elif op == "relax.dequantize":
                data = node["args"][0]
                if "const" in data:  # a weight the partitioner left int8: its float values
                    scale, zero = (_constant(self.constants, a, what) for a in node["args"][1:3])
                    array = self.constants[data["const"]].astype(np.float32)
                    axis = int(node["attrs"].get("axis", -1)) % array.ndim if scale.size > 1 else 0
                    shape = [-1 if a == axis else 1 for a in range(array.ndim)] if scale.size > 1 else []
                    values = (array - zero.reshape(shape)) * scale.reshape(shape).astype(np.float32)
                    w.mapping[out_key] = w.constant(values.astype(np.float32), "dequantized")
                elif ref_key(data) in self.int8:
                    w.mapping[out_key] = self.int8[ref_key(data)][0]
                else:
                    raise CodegenError(f"{what}: the region receives int8 data from the host; the device's regions start "
                                       "from float32 values the model quantizes")
            elif op in INT8_MOVES and ref_key(node["args"][0]) in self.int8:
                source, scale = self.int8[ref_key(node["args"][0])]
                outputs = [{"shape": node["outputs"][0]["shape"], "dtype": "float32"}]
                moved = w.copy(node, [source, *(w.lookup(a) for a in node["args"][1:])], outputs=outputs)[0]
                self.int8[out_key] = (moved, scale)
                self._record(moved, scale)
            else:
                if any(ref_key(r) in self.int8 for a in node["args"] for r in tensor_refs(a)):
                    raise CodegenError(f"{what}: computes on int8 data; the device takes a quantized model's "
                                       "convolutions, matrix products, pooling and adds as dequantize -> op -> quantize")
                refs = w.copy(node)
                kernel = results.get(node["id"])
                scale = readers.get(out_key)
                if kernel is not None and scale is not None and scale.bounds[0] == 0.0 \
                        and not any(n["op"] in _ACTIVATIONS for n in kernel.nodes):
                    self._clip(node, refs[0], scale.bounds[1])
        if any(ref_key(ref) in self.int8 for ref in self.graph["outputs"]):
            raise CodegenError(f"{self.where}: an output of the region is int8 data; the device's regions end in "
                               "float32 values")
        graph = w.graph([w.lookup(ref) for ref in self.graph["outputs"]])
        return AdoptedRegion(graph, w.used_constants(graph), self._calibration(graph), self.scales)

    def _clip(self, node: Mapping[str, Any], value: dict, high: float) -> None:
        """clip(0, high) after `node`, the last of its kernel: the model's range [0, high] clips
        there, as the ReLU (or ReLU6) that the model's quantization took in."""
        composite = node.get("composite")
        if composite is None:
            composite = {"id": self.next_composite, "pattern": f"{self.graph['backend']}.{node['op'].rsplit('.', 1)[1]}_clip"}
            self.next_composite += 1
            self.writer.nodes[value["node"]]["composite"] = composite
        bounds = [{"prim": 0.0, "dtype": "float32"}, {"prim": float(high), "dtype": "float32"}]
        clipped = self.writer.add("relax.clip", [value, *bounds], [dict(node["outputs"][0])], node["name"], composite=composite)
        self.writer.mapping[("node", node["id"], 0)] = clipped

    def _calibration(self, graph: dict[str, Any]) -> RegionCalibration:
        known: dict[tuple, list[float]] = {key: scale.bounds for key, scale in self.scales.items()}
        inputs = []
        for index, spec in enumerate(graph["inputs"]):
            bounds = known.get(("input", index))
            if bounds is None and spec["dtype"] == "float32":
                raise CodegenError(f"{self.where}: region input {spec['name']!r} is float32 that the model does not quantize")
            inputs.append(bounds or [0.0, 0.0])
        ranges = []
        for kernel in kernels(graph):
            outputs = []
            for ref, spec in zip(kernel.output_refs(), kernel.result["outputs"]):
                bounds = known.get(ref_key(ref)) or self._within_inputs(kernel, known)
                if bounds is None:
                    if spec["dtype"] == "float32":
                        raise CodegenError(f"{self.where}: node {kernel.result['name']!r} ({kernel.result['op']}): the model "
                                           "does not quantize its result, and the device computes in int8; quantize the "
                                           "model with this op's output quantized too, or keep it on the host")
                    bounds = [0.0, 0.0]
                known[ref_key(ref)] = bounds
                outputs.append(bounds)
            ranges.append(outputs)
        return RegionCalibration(0, inputs, ranges)

    @staticmethod
    def _within_inputs(kernel, known: Mapping[tuple, list[float]]) -> list[float] | None:
        """The range of a kernel whose output lies within its inputs' (pooling, layout, ReLU)."""
        if any(n["op"] not in _WITHIN_INPUTS for n in kernel.nodes):
            return None
        inside = {n["id"] for n in kernel.nodes}
        sources = [known.get(ref_key(r)) for n in kernel.nodes for a in n["args"] for r in tensor_refs(a)
                   if "const" not in r and r.get("node") not in inside]
        if not sources or any(s is None for s in sources):
            return None
        low, high = min(s[0] for s in sources), max(s[1] for s in sources)
        if any(n["op"] == "relax.nn.relu" for n in kernel.nodes):
            low, high = max(low, 0.0), max(high, 0.0)
        return [low, high]


def adopt_model_quantization(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> AdoptedRegion:
    """A quantized model's region as a float region with the model's range for each tensor."""
    return _Reader(graph, constants).run()


@dataclass(frozen=True)
class Requantization:
    """What the device's form changed of the model's quantization."""

    activations: int  # tensors whose scale or zero point changed
    activations_total: int
    coarsest: float  # the largest ratio of a new step to the model's
    weights: int  # weight tensors quantized to other values
    weights_total: int

    @property
    def exact(self) -> bool:
        return self.activations == 0 and self.weights == 0


def requantization(region: AdoptedRegion, config: QuantizationConfig) -> Requantization:
    """What the device's quantization (`config`) changes of the model's."""
    changed, coarsest = 0, 1.0
    for scale in region.scales.values():
        new_scale, new_zero = config.activation(*scale.bounds)
        zero = scale.zero_point - 128 if scale.dtype == "uint8" else scale.zero_point
        if not (abs(new_scale - scale.scale) <= 1e-6 * scale.scale and new_zero == zero):
            changed += 1
            coarsest = max(coarsest, new_scale / scale.scale)
    weights = total = 0
    for node in region.graph["nodes"]:
        if node["op"] in QUANTIZED_WEIGHT_OPS and "const" in node["args"][1]:
            array = region.constants[node["args"][1]["const"]]
            if array.dtype != np.float32:
                continue
            axis = weight_axis(node, array)
            quantized, scales = config.quantize_weights(array, axis)
            shape = [-1 if a == axis else 1 for a in range(array.ndim)] if scales.ndim else []
            restored = quantized.astype(np.float32) * scales.reshape(shape)
            total += 1
            weights += int(not np.allclose(restored, array, rtol=0, atol=1e-6 * float(np.abs(array).max() or 1)))
    return Requantization(changed, len(region.scales), coarsest, weights, total)

