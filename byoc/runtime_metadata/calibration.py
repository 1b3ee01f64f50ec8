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

from byoc.backend.registry import get_backend
from byoc.backend.spec import Backend
from byoc.codegen_json import JsonRuntime, tvm_engine
from byoc.codegen_json.graph import kernels
from byoc.errors import QuantizationError
from byoc.partition.outline import CODEGEN_ATTR
from byoc.processing.passes import RegionContext, apply_passes, default_calibration_method, passes_before_quantization
from byoc.processing.quantize import CALIBRATION_ATTR, RegionCalibration
from byoc.processing.ranges import METHODS, TensorRange
from byoc.runtime_metadata.build import build, region_functions, region_symbol

PROBE_BACKEND = "calibration_probe"


class _Ranges:
    def __init__(self, inputs: int, kernel_outputs: list[int], method: str) -> None:
        self.samples = 0
        seeds = iter(range(1 << 30))
        self.inputs = [TensorRange(method, next(seeds)) for _ in range(inputs)]
        self.kernels = [[TensorRange(method, next(seeds)) for _ in range(count)] for count in kernel_outputs]

    def calibration(self) -> RegionCalibration:
        return RegionCalibration(self.samples, [r.bounds() for r in self.inputs], [[r.bounds() for r in k] for k in self.kernels])


class _ProbeEngine:
    """Runs a region in float32 and records the ranges of its inputs and kernel outputs."""

    def __init__(self, graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], ranges: _Ranges) -> None:
        self.kernels = kernels(graph)
        self.extra = [(k.index, i, o) for k in self.kernels for i, (ref, o) in enumerate(zip(k.output_refs(), k.result["outputs"]))]
        probe = dict(graph)
        probe["outputs"] = [*graph["outputs"], *(ref for k in self.kernels for ref in k.output_refs())]
        self.engine = tvm_engine.build_engine(probe, constants, {})
        self.ranges = ranges
        self.lock = threading.Lock()

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        extras = [np.empty(spec["shape"], spec["dtype"]) for _, _, spec in self.extra]
        self.engine.run(inputs, [*outputs, *extras])
        with self.lock:
            self.ranges.samples += 1
            for tensor, array in zip(self.ranges.inputs, inputs):
                tensor.add(array)
            for (kernel, output, _), array in zip(self.extra, extras):
                self.ranges.kernels[kernel][output].add(array)


def _probe_backend(collected: dict[str, _Ranges], target: Backend, options: Mapping[str, Any], method: str) -> Backend:
    before = passes_before_quantization(target.processing)

    def build_engine(graph, constants, _options):
        # A shape-specialised region is probed per shape (`vitis_ai_0__batch4`); its ranges are
        # the region's, over every shape calibrated.
        symbol = options["variant_of"].get(graph["symbol"], graph["symbol"])
        if symbol in options["targets"] and before:
            context = RegionContext(graph["symbol"], target.name, {}, options["build"])
            graph, constants = apply_passes(before, graph, constants, context)
        ranges = collected.setdefault(symbol, _Ranges(len(graph["inputs"]), [len(k.result["outputs"]) for k in kernels(graph)], method))
        return _ProbeEngine(graph, constants, ranges)

    return Backend(name=PROBE_BACKEND, description="float32 probe for calibration",
                   codegen=JsonRuntime(build_engine=build_engine, version="probe"))


def calibrate(
    mod: tvm.IRModule,
    backend: str | Backend,
    samples: Iterable[Mapping[str, np.ndarray] | Sequence[np.ndarray]],
    max_samples: int | None = None,
    options: Mapping[str, Any] | None = None,
    method: str | None = None,
) -> tvm.IRModule:
    """`mod` with the ranges of `backend`'s regions over `samples` attached to them. Ranges are
    taken on the region graphs as the backend's processing passes before quantization leave
    them; `options` are the backend's build options those passes may read. `method` turns the
    values seen into ranges (`byoc.processing.ranges`); by default the backend's own."""
    target = get_backend(backend)
    method = method or default_calibration_method(target.processing, options or {})
    if method not in METHODS:
        raise QuantizationError(f"unknown calibration method {method!r}; the methods are {', '.join(METHODS)}")
    regions = region_functions(mod)
    targets = [symbol for symbol, name, _ in regions if name == target.name]
    if not targets:
        return mod
    probe = mod.clone()
    for gvar, func in mod.functions.items():
        if region_symbol(gvar, func) is not None:
            probe[gvar] = func.with_attr(CODEGEN_ATTR, PROBE_BACKEND)
    collected: dict[str, _Ranges] = {}
    variant_of: dict[str, str] = {}
    probe_backend = _probe_backend(collected, target, {"targets": set(targets), "build": dict(options or {}),
                                                        "variant_of": variant_of}, method)
    # Lazy: the probe's engines are byoc's own recorders, and a build-time trial run would be
    # recorded as a calibration sample.
    compiled = build(probe, backends={PROBE_BACKEND: probe_backend}, engines="lazy")
    for region in compiled.parts.specialised:
        variant_of.update({symbol: region.symbol for symbol in region.variants.values()})
        compiled.specialised[region.symbol].on_variant = lambda artifact, base=region.symbol: variant_of.setdefault(
            artifact.symbol, base)
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
        symbol = region_symbol(gvar, func)
        if symbol in targets:
            if symbol not in collected:
                raise QuantizationError(f"region {symbol} ({target.name}): no calibration sample ran it")
            result[gvar] = func.with_attr(CALIBRATION_ATTR, collected[symbol].calibration().to_json())
    return result
