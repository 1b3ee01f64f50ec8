"""Calibration: the ranges of every region tensor over a set of inputs, at compile time.

The partitioned model runs with every region executed in float32 by TVM through a probing
engine, which returns the region's outputs and records the range of its inputs and of every
kernel's outputs. The ranges are attached to the region functions (attribute
`byoc.calibration`), where quantization finds them at code generation.

A region that holds a quantized model's own quantization needs no ranges (byoc.processing.adopt);
there the samples measure the error the device's own form of it adds, as the model quantizes
the region against as the device will (attribute `byoc.requantization`), for the build's warning.
"""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tvm
from tvm import relax

from byoc.backend.registry import get_backend
from byoc.backend.spec import Backend
from byoc.codegen_json import JsonRuntime, tvm_engine
from byoc.codegen_json.references import kernels
from byoc.errors import CodegenError, QuantizationError, RequantizationWarning
from byoc.ir.dims import copy_dims
from byoc.ir.types import calls_op
from byoc.partition.outline import CODEGEN_ATTR
from byoc.partition.pipeline import partition_graph
from byoc.processing.passes import RegionContext, apply_passes, default_calibration_method, passes_before_quantization
from byoc.processing.quantize import CALIBRATION_ATTR, REQUANTIZATION_ATTR, RegionCalibration
from byoc.processing.ranges import METHODS, TensorRange
from byoc.relative_l2 import RelativeL2
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
        self.engine = tvm_engine.build_engine(probe, constants, tvm_engine.DEFAULT_SETTINGS)
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


class _Requantization:
    """The error a device's quantization adds to a quantized model's region, over the samples."""

    def __init__(self) -> None:
        self.samples = 0
        self.error = RelativeL2()

    def to_json(self) -> str:
        return json.dumps({"samples": self.samples, "relative_l2": self.error.value})


class _RequantizationProbe:
    """Runs a quantized model's region as the model quantizes it (the outputs it returns) and as
    the device would, and adds up how far apart the two are."""

    def __init__(self, model: tuple[dict, dict], device: tuple[dict, dict], errors: _Requantization) -> None:
        self.engines = [tvm_engine.build_engine(graph, constants, tvm_engine.DEFAULT_SETTINGS) for graph, constants in (model, device)]
        self.errors = errors
        self.lock = threading.Lock()

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        self.engines[0].run(inputs, outputs)
        device = [np.empty_like(out) for out in outputs]
        self.engines[1].run(inputs, device)
        with self.lock:
            self.errors.samples += 1
            for want, got in zip(outputs, device):
                self.errors.error.add(got, want)


def _probe_backend(collected: dict[str, _Ranges], requantized: dict[str, _Requantization], target: Backend,
                   options: Mapping[str, Any], method: str) -> Backend:
    # `options`: the region symbols to calibrate ("targets") and to measure ("measured"), and
    # each shape variant's region ("variant_of")
    before = passes_before_quantization(target.processing)

    def build_engine(graph, constants, _settings):
        # A shape-specialised region is probed per shape (`vitis_ai_0__batch4`); its ranges are
        # the region's, over every shape calibrated.
        symbol = options["variant_of"].get(graph["symbol"], graph["symbol"])
        context = RegionContext(graph["symbol"], target.name, {}, target.settings)
        if symbol in options["measured"]:
            model = apply_passes(before, graph, constants, context)
            with warnings.catch_warnings(record=True) as warned:
                warnings.simplefilter("always", RequantizationWarning)  # what this probe measures
                try:
                    device = apply_passes(target.processing[len(before):], *model, context)
                except CodegenError:
                    # The device cannot take the region as the model quantizes it: nothing to
                    # measure here; the build falls back for it with the reason (or refuses under strict).
                    return tvm_engine.build_engine(*model, tvm_engine.DEFAULT_SETTINGS)
            requantizes = False
            for warning in warned:  # any other warning reaches the user as it would have
                if issubclass(warning.category, RequantizationWarning):
                    requantizes = True
                else:
                    warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
            if not requantizes:
                return tvm_engine.build_engine(*model, tvm_engine.DEFAULT_SETTINGS)  # the device holds the model's scales: nothing to measure
            return _RequantizationProbe(model, device, requantized.setdefault(symbol, _Requantization()))
        if symbol in options["targets"] and before:
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
    method: str | None = None,
) -> tvm.IRModule:
    """`mod` with the ranges of `backend`'s regions over `samples` attached to them. Ranges are
    taken on the region graphs as the backend's processing passes before quantization leave
    them (with the backend's settings). `method` turns the values seen into ranges
    (`byoc.processing.ranges`); by default the backend's own."""
    target = get_backend(backend)
    method = method or default_calibration_method(target.processing, target.settings)
    if method not in METHODS:
        raise QuantizationError(f"unknown calibration method {method!r}; the methods are {', '.join(METHODS)}")
    regions = [(symbol, func) for symbol, name, func in region_functions(mod) if name == target.name]
    # A region with the model's own quantization takes its ranges from it (byoc.processing.adopt);
    # the samples measure what the device's own form of it costs instead.
    targets = [symbol for symbol, func in regions if not calls_op(func, "relax.quantize")]
    measured = [symbol for symbol, func in regions if symbol not in targets]
    if not regions:
        return mod
    probe = mod.clone()
    for gvar, func in mod.functions.items():
        if region_symbol(gvar, func) is not None:
            probe[gvar] = func.with_attr(CODEGEN_ATTR, PROBE_BACKEND)
    collected: dict[str, _Ranges] = {}
    variant_of: dict[str, str] = {}
    requantized: dict[str, _Requantization] = {}
    probe_backend = _probe_backend(collected, requantized, target, {"targets": set(targets), "measured": set(measured),
                                                                    "variant_of": variant_of}, method)
    # Lazy: the probe's engines are byoc's own recorders, and a build-time trial run would be
    # recorded as a calibration sample.
    compiled = build(probe, backends={PROBE_BACKEND: probe_backend}, engines="lazy")
    for region in compiled.parts.specialised:
        variant_of.update({symbol: region.symbol for symbol in region.variants.values()})
        compiled.specialised[region.symbol].on_variant = lambda artifact, base=region.symbol: variant_of.setdefault(
            artifact.symbol, base)
    if not sum(1 for _ in _run_samples(compiled, samples, max_samples)):
        raise QuantizationError(f"backend {target.name!r} quantizes at compile time and needs calibration data: none was given")
    result = mod.clone()
    for gvar, func in mod.functions.items():
        symbol = region_symbol(gvar, func)
        if symbol in targets:
            if symbol not in collected:
                raise QuantizationError(f"region {symbol} ({target.name}): no calibration sample ran it")
            result[gvar] = func.with_attr(CALIBRATION_ATTR, collected[symbol].calibration().to_json())
        elif symbol in requantized:
            result[gvar] = func.with_attr(REQUANTIZATION_ATTR, requantized[symbol].to_json())
    return result


def run_sample(compiled, sample: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> list[np.ndarray]:
    """`compiled` run on one calibration sample: model inputs by name or by position."""
    return compiled.run(**sample) if isinstance(sample, Mapping) else compiled.run(*sample)


def _run_samples(compiled, samples: Iterable, max_samples: int | None) -> Iterator[list[np.ndarray]]:
    """The outputs of `compiled` on each of `samples`, at most `max_samples` of them."""
    for count, sample in enumerate(samples):
        if max_samples is not None and count >= max_samples:
            return
        yield run_sample(compiled, sample)


def _with_outputs(func: relax.Function, var_ids: Sequence[int]) -> relax.Function:
    """`func` returning its result followed by the values `var_ids` bind (for calibration)."""
    flat = relax.transform.ToNonDataflow()(tvm.IRModule({"main": func}))["main"]
    # ToNonDataflow keeps the variables it rebinds; match them by position
    original = [b.var for block in func.body.blocks for b in block.bindings]
    rebound = [b.var for block in flat.body.blocks for b in block.bindings]
    by_id = {old.id_: new for old, new in zip([*func.params, *original], [*flat.params, *rebound])}
    result = flat.body.body
    outputs = list(result.fields) if isinstance(result, relax.Tuple) else [result]
    returned = relax.BlockBuilder().normalize(relax.Tuple([*outputs, *(by_id[i] for i in var_ids)]))
    return relax.Function(flat.params, relax.SeqExpr(flat.body.blocks, returned), returned.ty, flat.is_pure, flat.attrs)


def value_ranges(mod: tvm.IRModule, var_ids: Sequence[int], samples: Iterable, max_samples: int | None = None,
                 method: str = "minmax", backends: Sequence[Backend] = ()) -> dict[int, list[float]]:
    """The range ([low, high] by `method`) of each value of `mod["main"]` that `var_ids` name (its
    bindings or parameters), over the model run on `samples` (model inputs): in float32, on
    `backends` where they take it (the values become region outputs), else on the host."""
    if method not in METHODS:
        raise QuantizationError(f"unknown calibration method {method!r}; the methods are {', '.join(METHODS)}")
    # A model with dynamic dimensions is probed with them: one build runs samples of any shape.
    probe = copy_dims(mod, tvm.IRModule({"main": _with_outputs(mod["main"], var_ids)}))
    if backends:  # TVM's untuned host kernels took 290 s to calibrate a full-size BERT encoder on 8 inputs
        probe = partition_graph(relax.transform.ConvertToDataflow(min_size=1)(probe), list(backends))
    compiled = build(probe)
    first = len(compiled.outputs) - len(var_ids)
    ranges = [TensorRange(method, seed) for seed in range(len(var_ids))]
    ran = 0
    for results in _run_samples(compiled, samples, max_samples):
        ran += 1
        for tensor, array in zip(ranges, results[first:]):
            tensor.add(array)
    if ran == 0:
        raise QuantizationError("calibration needs model inputs: none was given")
    return {var_id: tensor.bounds() for var_id, tensor in zip(var_ids, ranges)}
