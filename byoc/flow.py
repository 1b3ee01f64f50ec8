"""`byoc.partition_for`: the one door from a model to a partitioned module, for every vendor.

Options are of three kinds, all passed the same way: cost rules (see `byoc.CostRules`), which
apply to every backend; options a backend declares (`Backend.options`: a hardware
configuration, an integration choice), which reach the backends that declare them; and, for
backends that quantize with calibrated scales at compile time, the calibration options below.
An option no backend takes is an error that lists the ones they do.

Partitioning sits below calibration: calibrating runs the partitioned model, so it needs the
build and the runtime, which sit above the partitioner. This module composes the two.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import tvm

from byoc.backend.options import Option
from byoc.backend.settings import PARTITION
from byoc.backend.spec import Backend
from byoc.errors import PartitionError, QuantizationError
from byoc.frontend.float16 import float16_in_float32
from byoc.frontend.int8_weights import has_quantize_ops
from byoc.ir.dims import dims_of
from byoc.ir.types import calls_op
from byoc.partition.pipeline import COST_OPTIONS, partition_graph, resolve_backends
from byoc.placement.auto import DEFAULT_BUDGET_S, place
from byoc.placement.cache import MeasurementCache
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


def route_options(backends: Sequence[Backend], options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(cost options, {backend name: its own options}); an option nobody declares is an error."""
    cost = {name: value for name, value in options.items() if name in COST_OPTIONS}
    routed: dict[str, dict[str, Any]] = {b.name: {} for b in backends}
    unknown = []
    for name, value in options.items():
        if name in COST_OPTIONS:
            continue
        takers = [b for b in backends if any(o.name == name for o in declared_options(b))]
        if not takers:
            unknown.append(name)
        for backend in takers:
            routed[backend.name][name] = value
    if unknown:
        raise PartitionError(f"unknown partition option(s) {sorted(unknown)} for {', '.join(b.name for b in backends)}; "
                             f"known options: {describe_options(backends)}")
    return cost, routed


def configure(backends: str | Backend | Sequence[str | Backend],
              options: Mapping[str, Any]) -> tuple[list[Backend], dict[str, Any], dict[str, dict[str, Any]]]:
    """The backends (in priority order) configured with their declared options, the cost
    options, and each backend's options by name (calibration's among them, left for it)."""
    ordered = resolve_backends(backends)
    cost, routed = route_options(ordered, options)
    calibration_names = {o.name for o in CALIBRATION_OPTIONS}
    return [b.configured({k: v for k, v in routed[b.name].items() if k not in calibration_names}) for b in ordered], cost, routed


PLACEMENTS = ("priority", "auto")
PRECISIONS = ("fp32", "int8", "auto")


def partition_for(
    mod: tvm.IRModule,
    backends: str | Backend | Sequence[str | Backend],
    placement: str = "priority",
    precision: str = "fp32",
    max_rel_l2: float | None = None,
    budget_s: float | None = None,
    rpc_tracker: str | None = None,
    rpc_key: str | None = None,
    rpc_fallback_local: bool = False,
    placement_inputs: Mapping[str, Any] | None = None,
    placement_cache_dir: str | None = None,
    **options: Any,
) -> tvm.IRModule:
    """Partition `mod["main"]` between the host and `backends` (by name or object, in priority
    order), configure each backend with its declared options, and calibrate the regions of
    backends that quantize at compile time.

    Cost options (`max_ops_per_region`, `max_regions`, `host_ops`, `region_filter`, ...: see
    `byoc.CostRules`) apply to every backend. Calibrating backends take `calibration` (a list
    of model inputs), `num_calibration_samples` and `calibration_method`; without calibration
    data they are an error here rather than a silent host fallback at build time. The result
    carries a partition record that `byoc.report` reads.

    With `placement="auto"`, which backend runs each part of the model is chosen by measured
    cost rather than by priority (see `byoc.placement`): candidates are timed on this machine,
    or on the devices registered under `rpc_key` at the TVM RPC tracker `rpc_tracker`
    ("HOST:PORT"; with `rpc_fallback_local`, on this machine when the tracker or key fails),
    within `budget_s` seconds, on `placement_inputs` (model inputs by name; default seeded
    random), with timings cached under `placement_cache_dir`. `byoc.placement_report` reads
    what was measured and chosen.

    With `precision="int8"`, a float model is quantized first, its activation ranges calibrated
    on `calibration` (`num_calibration_samples`, `calibration_method` apply), as onnxruntime's
    `quantize_static` would quantize it (see `byoc.processing.quantize_model`), for a vendor that
    computes a quantized model in int8 (dnnl). With `precision="auto"`, each segment of the
    model's layers runs in int8 or fp32 by measurement: the fastest choice whose relative L2
    error against the fp32 model on the calibration inputs is within `max_rel_l2` (default 2%;
    see `byoc.placement.precision`); `byoc.precision_report` reads what was measured and chosen.
    A `max_rel_l2` alone asks for `precision="auto"`. With `placement="auto"` too, precision is
    chosen with placement: each segment's backend and precision together, by measured time and
    measured error (see `byoc.placement.joint`), in the placement report.
    """
    if placement not in PLACEMENTS:
        raise PartitionError(f"placement must be one of {PLACEMENTS}, not {placement!r}")
    remote = {"rpc_tracker": rpc_tracker, "rpc_key": rpc_key}
    if placement != "auto" and (budget_s is not None or placement_inputs is not None or any(remote.values())):
        raise PartitionError("budget_s, placement_inputs and the rpc_* options apply to placement='auto' only")
    if budget_s is not None and not budget_s >= 0:
        raise PartitionError(f"budget_s is the time allowed for measuring, in seconds: it must be at least 0, not {budget_s}")
    if max_rel_l2 is not None and precision == "fp32":
        precision = "auto"  # an error budget is what precision by measurement spends
    mod, options, measured_precision, joint = _at_precision(mod, precision, max_rel_l2, backends, options, placement)
    configured, cost, routed = configure(backends, options)
    dims = dims_of(mod)
    if dims and placement == "auto":
        raise PartitionError(f"placement='auto' times the model at one shape; this model has dynamic dimensions "
                             f"({', '.join(dims)}): use placement='priority', or import it with static shapes")
    partitioned = _partitioned(mod, configured, placement, cost, budget_s, rpc_tracker, rpc_key, rpc_fallback_local,
                               placement_cache_dir, placement_inputs, joint)
    for backend in configured:
        regions = [func for _, name, func in region_functions(partitioned) if name == backend.name]
        if not needs_calibration(backend.processing) or not regions:
            continue
        values = routed[backend.name]
        samples = values.get("calibration")
        if samples is None:
            if all(calls_op(func, "relax.quantize") for func in regions):
                continue  # the model's own quantization: nothing to calibrate (byoc.processing.adopt)
            raise QuantizationError(
                f"{backend.name} quantizes at compile time and needs calibration data: pass calibration=[inputs, ...] "
                "(model inputs by name or by position) to partition_for, or --calibration N on the command line "
                "to calibrate on N seeded random inputs"
            )
        method = {"method": values["calibration_method"]} if values.get("calibration_method") else {}
        partitioned = calibrate(partitioned, backend, samples, max_samples=values.get("num_calibration_samples"), **method)
    if measured_precision is not None:
        partitioned = partitioned.with_attr(PRECISION_ATTR, measured_precision.to_json())
    return partitioned


def _at_precision(mod: tvm.IRModule, precision: str, max_rel_l2: float | None, backends, options: dict[str, Any],
                  placement: str) -> tuple[tvm.IRModule, dict[str, Any], PrecisionReport | None, PrecisionBudget | None]:
    """The model as `precision` asks, the options left for the backends (the calibration options
    that only int8 precision took are used up), what `precision="auto"` measured, and for
    precision chosen with placement, what placement needs for it."""
    if precision not in PRECISIONS:
        raise PartitionError(f"precision must be one of {PRECISIONS}, not {precision!r}")
    if max_rel_l2 is not None and precision != "auto":
        raise PartitionError("max_rel_l2 is the error budget of precision='auto'")
    if precision == "fp32":
        return mod, options, None, None
    ordered = resolve_backends(backends)
    if not any(computes_quantized(b) for b in ordered):
        raise PartitionError(f"precision={precision!r} quantizes the model for a vendor that computes a quantized model in "
                             f"int8 with its scales (dnnl); {', '.join(b.name for b in ordered)} does not (vitis_ai and "
                             "ethos_u quantize at compile time anyway)")
    if has_quantize_ops(mod):
        raise PartitionError(f"precision={precision!r}: the model is quantized already; partition it as it is")
    mod, _ = float16_in_float32(mod)  # a float16 model is quantized from its float32 computation
    if options.get("calibration") is None:
        raise QuantizationError(f"precision={precision!r} calibrates activation ranges on the model: pass calibration=[inputs, "
                                "...] (model inputs by name or by position), or --calibration N on the command line")
    samples = list(options["calibration"])[:options.get("num_calibration_samples")]
    float_backends = [b for b in ordered if not needs_calibration(b.processing)]
    known: dict[int, list[float]] = {}

    def ranges(var_ids):
        missing = [i for i in var_ids if i not in known]
        if missing:
            known.update(value_ranges(mod, missing, samples, method=options.get("calibration_method") or "minmax",
                                      backends=float_backends))
        return known

    report = joint = None
    plan = int8_plan(mod)  # refuses a model with nothing to quantize
    budget = DEFAULT_BUDGET if max_rel_l2 is None else max_rel_l2
    if precision == "int8":
        quantized = quantize_model(mod, plan, ranges(plan.calibrated))
    elif placement == "auto":
        quantized, joint = mod, PrecisionBudget(checked_budget(budget), samples, float_backends, ranges)
    else:
        quantized, report = choose_precision(mod, float_backends, samples, ranges, budget)
    declared = {o.name for b in ordered for o in declared_options(b)}
    calibration_names = {o.name for o in CALIBRATION_OPTIONS}
    return quantized, {k: v for k, v in options.items() if k in declared or k not in calibration_names}, report, joint


def _partitioned(mod, configured, placement, cost, budget_s, rpc_tracker, rpc_key, rpc_fallback_local, placement_cache_dir,
                 placement_inputs, joint: PrecisionBudget | None) -> tvm.IRModule:
    if placement == "auto":
        measurer = measurer_for(rpc_tracker, rpc_key, rpc_fallback_local)
        return place(mod, configured, budget_s if budget_s is not None else DEFAULT_BUDGET_S, measurer,
                     MeasurementCache(placement_cache_dir), placement_inputs, precision=joint, **cost)
    return partition_graph(mod, configured, **cost)


__all__ = ["CALIBRATION_OPTIONS", "declared_options", "describe_options", "partition_for", "route_options"]
