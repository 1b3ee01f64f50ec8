"""`byoc.partition_for`: the one door from a model to a partitioned module, for every vendor.

It reads one `byoc.Settings` (byoc.compile_settings), made from keyword options where none is
given: placement, precision and calibration; cost rules (see `byoc.CostRules`), which apply to
every backend; and the settings a vendor declares (its `VendorSettings`: a hardware
configuration, an integration choice), which reach the backends that declare them. An option
no backend takes is an error that lists the ones they do.

Partitioning sits below calibration: calibrating runs the partitioned model, so it needs the
build and the runtime, which sit above the partitioner. This module composes the two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import tvm

from byoc.backend.cost import COST_OPTIONS
from byoc.backend.options import Option
from byoc.backend.settings import PARTITION
from byoc.backend.spec import Backend
from byoc.compile_settings import Settings
from byoc.errors import PartitionError, QuantizationError
from byoc.frontend.float16 import float16_in_float32
from byoc.frontend.int8_weights import has_quantize_ops
from byoc.ir.dims import dims_of
from byoc.ir.types import calls_op
from byoc.partition.pipeline import partition_graph, resolve_backends
from byoc.placement.auto import DEFAULT_BUDGET_S, place
from byoc.placement.cache import MeasurementCache
from byoc.placement.dynamic import placed_at_shapes
from byoc.placement.joint import PrecisionBudget, computes_quantized
from byoc.placement.precision import DEFAULT_BUDGET, PRECISION_ATTR, PrecisionReport, checked_budget, choose_precision
from byoc.placement.remote import measurer_for
from byoc.processing.passes import needs_calibration
from byoc.processing.quantize_model import int8_plan, quantize_model
from byoc.processing.ranges import METHODS
from byoc.runtime_metadata.build import region_functions
from byoc.runtime_metadata.calibration import calibrate, value_ranges


def _samples_from_text(text: str):
    raise ValueError("calibration inputs cannot be written as text: use --calibration N for N seeded random inputs")


CALIBRATION_OPTIONS = (
    Option("calibration", "model inputs to calibrate int8 scales on: a list of dicts by input name, or of lists by "
           "position (on the command line: --calibration N seeded random inputs)", parse=_samples_from_text),
    Option("num_calibration_samples", "use at most this many of the calibration inputs", parse=int),
    Option("calibration_method", "how the values seen become int8 ranges: minmax, percentile (99.99th of |x|), entropy "
           "(least KL divergence) or min_diffs (power-of-two steps: the least squared error, Vitis AI's); by default the "
           "vendor's own", parse=str, choices=METHODS),
)


def declared_options(backend: Backend) -> list[Option]:
    """The partition options `backend` takes: its settings that apply at partition, plus
    calibration when it quantizes at compile time."""
    return [*backend.settings.options(PARTITION), *(CALIBRATION_OPTIONS if needs_calibration(backend.processing) else ())]


def describe_options(backends: Iterable[Backend]) -> str:
    parts = [f"cost options: {', '.join(sorted(COST_OPTIONS))}"]
    parts += [f"{b.name}: {', '.join(o.name for o in declared_options(b))}" for b in backends if declared_options(b)]
    return "; ".join(parts)


def route_options(backends: Sequence[Backend], options: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """{backend name: its own partition settings} from `options` (names the vendors declare);
    an option no vendor declares is an error that lists those they do."""
    routed: dict[str, dict[str, Any]] = {b.name: {} for b in backends}
    unknown = []
    for name, value in options.items():
        takers = [b for b in backends if any(o.name == name for o in declared_options(b))]
        if not takers:
            unknown.append(name)
        for backend in takers:
            routed[backend.name][name] = value
    if unknown:
        raise PartitionError(f"unknown partition option(s) {sorted(unknown)} for {', '.join(b.name for b in backends)}; "
                             f"known options: {describe_options(backends)}")
    return routed


def configure(backends: str | Backend | Sequence[str | Backend], settings: Settings) -> list[Backend]:
    """The backends (in priority order), each made for the partition settings of its own that
    `settings` gives."""
    ordered = resolve_backends(backends)
    routed = route_options(ordered, settings.vendor_options)
    return [b.configured(routed[b.name]) for b in ordered]


def partition_for(mod: tvm.IRModule, backends: str | Backend | Sequence[str | Backend], settings: Settings | None = None,
                  **options: Any) -> tvm.IRModule:
    """Partition `mod["main"]` between the host and `backends` (by name or object, in priority
    order), with `settings` (`byoc.Settings`) or the keyword `options` that make them: how each
    part is placed and at which precision, calibration, cost rules over every vendor's (see
    `byoc.CostRules`), and each vendor's own partition settings. Vendors that quantize at compile
    time are calibrated on `calibration`; without it they are an error here rather than a
    silent host fallback at build time. The result carries a partition record that
    `byoc.report` reads.

    With `placement="auto"`, which backend runs each part of the model is chosen by measured
    cost rather than by priority (see `byoc.placement`); `byoc.placement_report` reads what was
    measured and chosen. With `precision="int8"`, a float model is quantized first, its
    activation ranges calibrated on `calibration`, as onnxruntime's `quantize_static` would
    quantize it (see `byoc.processing.quantize_model`), for a vendor that computes a quantized
    model in int8 (dnnl). With `precision="auto"`, each segment of the model's layers runs in
    int8 or fp32 by measurement: the fastest choice whose relative L2 error against the fp32
    model on the calibration inputs is within `max_rel_l2` (default 2%; see
    `byoc.placement.precision`); `byoc.precision_report` reads what was measured and chosen.
    With `placement="auto"` too, precision is chosen with placement: each segment's backend and
    precision together, by measured time and measured error (see `byoc.placement.joint`).
    """
    settings = Settings.of(settings, options)
    mod, measured_precision, joint = _at_precision(mod, settings, backends)
    configured = configure(backends, settings)
    _check_calibration_is_taken(settings, configured)
    dims = dims_of(mod)
    if dims and settings.placement == "auto" and joint is not None:
        raise PartitionError(f"precision chosen with placement='auto' quantizes the model it times, at one shape; this model "
                             f"has dynamic dimensions ({', '.join(dims)}): choose precision with placement='priority', or "
                             "import the model with static shapes")
    partitioned = _partitioned(mod, configured, settings, joint)
    for backend in configured:
        regions = [func for _, name, func in region_functions(partitioned) if name == backend.name]
        if not needs_calibration(backend.processing) or not regions:
            continue
        if settings.calibration is None:
            if all(calls_op(func, "relax.quantize") for func in regions):
                continue  # the model's own quantization: nothing to calibrate (byoc.processing.adopt)
            raise QuantizationError(
                f"{backend.name} quantizes at compile time and needs calibration data: pass calibration=[inputs, ...] "
                "(model inputs by name or by position) to partition_for, or --calibration N on the command line "
                "to calibrate on N seeded random inputs"
            )
        method = {"method": settings.calibration_method} if settings.calibration_method else {}
        partitioned = calibrate(partitioned, backend, settings.calibration, max_samples=settings.num_calibration_samples, **method)
    if measured_precision is not None:
        partitioned = partitioned.with_attr(PRECISION_ATTR, measured_precision.to_json())
    return partitioned


def _check_calibration_is_taken(settings: Settings, configured: Sequence[Backend]) -> None:
    """Calibration given where nothing calibrates is a mistake to say, not to ignore."""
    given = [o.name for o in CALIBRATION_OPTIONS if getattr(settings, o.name) is not None]
    if given and settings.precision == "fp32" and not any(needs_calibration(b.processing) for b in configured):
        raise PartitionError(f"unknown partition option(s) {given} for {', '.join(b.name for b in configured)}: calibration "
                             f"applies to precision='int8' or 'auto' and to vendors that quantize at compile time; known "
                             f"options: {describe_options(configured)}")


def _at_precision(mod: tvm.IRModule, settings: Settings, backends) -> tuple[tvm.IRModule, PrecisionReport | None, PrecisionBudget | None]:
    """The model as `settings.precision` asks, what `precision="auto"` measured, and for
    precision chosen with placement, what placement needs for it."""
    precision = settings.precision
    if precision == "fp32":
        return mod, None, None
    ordered = resolve_backends(backends)
    if not any(computes_quantized(b) for b in ordered):
        raise PartitionError(f"precision={precision!r} quantizes the model for a vendor that computes a quantized model in "
                             f"int8 with its scales (dnnl); {', '.join(b.name for b in ordered)} does not (vitis_ai and "
                             "ethos_u quantize at compile time anyway)")
    if has_quantize_ops(mod):
        raise PartitionError(f"precision={precision!r}: the model is quantized already; partition it as it is")
    mod, _ = float16_in_float32(mod)  # a float16 model is quantized from its float32 computation
    if settings.calibration is None:
        raise QuantizationError(f"precision={precision!r} calibrates activation ranges on the model: pass calibration=[inputs, "
                                "...] (model inputs by name or by position), or --calibration N on the command line")
    samples = settings.calibration_samples()
    float_backends = [b for b in ordered if not needs_calibration(b.processing)]
    known: dict[int, list[float]] = {}

    def ranges(var_ids):
        missing = [i for i in var_ids if i not in known]
        if missing:
            known.update(value_ranges(mod, missing, samples, method=settings.calibration_method or "minmax",
                                      backends=float_backends))
        return known

    plan = int8_plan(mod)  # refuses a model with nothing to quantize
    budget = DEFAULT_BUDGET if settings.max_rel_l2 is None else settings.max_rel_l2
    if precision == "int8":
        return quantize_model(mod, plan, ranges(plan.calibrated)), None, None
    if settings.placement == "auto":
        return mod, None, PrecisionBudget(checked_budget(budget), samples, float_backends, ranges)
    quantized, report = choose_precision(mod, float_backends, samples, ranges, budget)
    return quantized, report, None


def _partitioned(mod, configured, settings: Settings, joint: PrecisionBudget | None) -> tvm.IRModule:
    if settings.placement != "auto":
        return partition_graph(mod, configured, **settings.cost)
    measurer = measurer_for(settings.rpc_tracker, settings.rpc_key, settings.rpc_fallback_local)

    def measured(model: tvm.IRModule) -> tvm.IRModule:
        return place(model, configured, settings.budget_s if settings.budget_s is not None else DEFAULT_BUDGET_S, measurer,
                     MeasurementCache(settings.placement_cache_dir), settings.placement_inputs, precision=joint, **settings.cost)

    # A model with dynamic dimensions is timed at its representative shapes (byoc.placement.dynamic).
    return placed_at_shapes(mod, configured, measured, settings.cost) if dims_of(mod) else measured(mod)


__all__ = ["CALIBRATION_OPTIONS", "Settings", "declared_options", "describe_options", "partition_for", "route_options"]
