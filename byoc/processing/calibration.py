"""Calibration: the ranges of every region tensor over a set of inputs, at compile time.

The partitioned model runs with every region executed in float32 by TVM through a probing
engine, which returns the region's outputs and records the range of its inputs and of every
kernel's outputs. The ranges are attached to the region functions (attribute
`byoc.calibration`), where quantization finds them at code generation.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import tvm

from byoc.backend.spec import Backend
from byoc.codegen_json import JsonRuntime
from byoc.codegen_json.graph import kernels
from byoc.errors import QuantizationError
from byoc.partition.outline import CODEGEN_ATTR
from byoc.processing.passes import RegionContext, apply_passes, passes_before_quantization
from byoc.processing.quantize import CALIBRATION_ATTR, RegionCalibration

PROBE_BACKEND = "calibration_probe"
# The accelerator configuration a region is compiled for (a DPU, an Ethos-U variant), read by
# custom formats at code generation.
TARGET_ATTR = "byoc.target"


class _Ranges:
    def __init__(self, inputs: int, kernel_outputs: list[int]) -> None:
        self.samples = 0
        self.inputs = [[np.inf, -np.inf] for _ in range(inputs)]
        self.kernels = [[[np.inf, -np.inf] for _ in range(count)] for count in kernel_outputs]

    @staticmethod
    def _update(bounds: list[float], array: np.ndarray) -> None:
        if array.size and np.issubdtype(array.dtype, np.floating):
            bounds[0] = min(bounds[0], float(array.min()))
            bounds[1] = max(bounds[1], float(array.max()))

    def calibration(self) -> RegionCalibration:
        def finite(bounds):
            return [0.0, 0.0] if bounds[0] > bounds[1] else [float(bounds[0]), float(bounds[1])]

        return RegionCalibration(self.samples, [finite(b) for b in self.inputs], [[finite(b) for b in k] for k in self.kernels])


class _ProbeEngine:
    """Runs a region in float32 and records the ranges of its inputs and kernel outputs."""

    def __init__(self, graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], ranges: _Ranges) -> None:
        from byoc.vendors.reference.tvm_engine import build_engine

        self.kernels = kernels(graph)
        self.extra = [(k.index, i, o) for k in self.kernels for i, (ref, o) in enumerate(zip(k.output_refs(), k.result["outputs"]))]
        probe = dict(graph)
        probe["outputs"] = [*graph["outputs"], *(ref for k in self.kernels for ref in k.output_refs())]
        self.engine = build_engine(probe, constants, {})
        self.ranges = ranges
        self.lock = threading.Lock()

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        extras = [np.empty(spec["shape"], spec["dtype"]) for _, _, spec in self.extra]
        self.engine.run(inputs, [*outputs, *extras])
        with self.lock:
            self.ranges.samples += 1
            for bounds, array in zip(self.ranges.inputs, inputs):
                _Ranges._update(bounds, array)
            for (kernel, output, _), array in zip(self.extra, extras):
                _Ranges._update(self.ranges.kernels[kernel][output], array)


def _probe_backend(collected: dict[str, _Ranges], target: Backend, options: Mapping[str, Any]) -> Backend:
    before = passes_before_quantization(target.processing)

    def build_engine(graph, constants, _options):
        if graph["symbol"] in options["targets"] and before:
            context = RegionContext(graph["symbol"], target.name, {}, options["build"])
            graph, constants = apply_passes(before, graph, constants, context)
        ranges = collected.setdefault(graph["symbol"], _Ranges(len(graph["inputs"]), [len(k.result["outputs"]) for k in kernels(graph)]))
        return _ProbeEngine(graph, constants, ranges)

    return Backend(name=PROBE_BACKEND, codegen="json", description="float32 probe for calibration",
                   json_runtime=JsonRuntime(build_engine=build_engine, version="probe"))


def calibrate(
    mod: tvm.IRModule,
    backend: str | Backend,
    samples: Iterable[Mapping[str, np.ndarray] | Sequence[np.ndarray]],
    max_samples: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> tvm.IRModule:
    """`mod` with the ranges of `backend`'s regions over `samples` attached to them. Ranges are
    taken on the region graphs as the backend's processing passes before quantization leave
    them; `options` are the backend's build options those passes may read."""
    from byoc.backend.registry import get_backend
    from byoc.runtime_metadata.build import build, region_functions

    target = get_backend(backend)
    regions = region_functions(mod)
    targets = [symbol for symbol, name, _ in regions if name == target.name]
    if not targets:
        return mod
    probe = mod.clone()
    for gvar, func in mod.functions.items():
        if gvar.name_hint in {symbol for symbol, _, _ in regions}:
            probe[gvar] = func.with_attr(CODEGEN_ATTR, PROBE_BACKEND)
    collected: dict[str, _Ranges] = {}
    probe_backend = _probe_backend(collected, target, {"targets": set(targets), "build": dict(options or {})})
    compiled = build(probe, backends={PROBE_BACKEND: probe_backend})
    count = 0
    for sample in samples:
        if max_samples is not None and count >= max_samples:
            break
        compiled.run(**sample) if isinstance(sample, Mapping) else compiled.run(*sample)
        count += 1
    if count == 0:
        raise QuantizationError(f"backend {target.name!r} quantizes at compile time and needs calibration data: none was given")
    result = mod.clone()
    for gvar, func in mod.functions.items():
        if gvar.name_hint in targets:
            result[gvar] = func.with_attr(CALIBRATION_ATTR, collected[gvar.name_hint].calibration().to_json())
    return result


def calibrate_for_target(
    mod: tvm.IRModule,
    backend: Backend,
    target: str,
    calibration: Iterable[Mapping[str, np.ndarray] | Sequence[np.ndarray]] | None,
    max_samples: int | None = None,
) -> tvm.IRModule:
    """Tag `backend`'s regions with the accelerator configuration they are compiled for (unless
    `target` is empty: the backend's default) and calibrate them, for int8 vendors that quantize
    at compile time."""
    if calibration is None:
        raise QuantizationError(f"{backend.name} quantizes at compile time: pass calibration=[inputs, ...], a list of model inputs")
    tagged = mod.clone()
    for gvar, func in mod.functions.items():
        if target and func.attrs is not None and func.attrs.get(CODEGEN_ATTR) == backend.name:
            tagged[gvar] = func.with_attr(TARGET_ATTR, target)
    return calibrate(tagged, backend, calibration, max_samples=max_samples)
