"""Placement by measured cost: which backend runs each segment of the model is chosen by timing
every segment on every backend that can take it, then taking the cheapest cover.

The steps: each backend's coverage alone (its patterns and op rules); segments (see
`byoc.placement.segments`); per segment and backend, a candidate model built and timed
(`byoc.placement.candidates`), or its time read from the cache, or, for a simulated
accelerator, its cost model's estimate; the cost of entering a region and of switching
between backends (`byoc.placement.switch`); the cheapest cover (`byoc.placement.search`); the
predicted latency from each stretch of one backend timed as one region; and last, the chosen
placement and every backend alone timed end to end against each other, keeping the fastest.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import tvm

from byoc.backend.spec import Backend
from byoc.errors import ByocError, PlacementError
from byoc.models import random_inputs
from byoc.partition.coverage import backend_coverage
from byoc.partition.group import HOST
from byoc.partition.module_report import report as partition_report
from byoc.partition.pipeline import partition_graph
from byoc.placement.cache import MeasurementCache
from byoc.placement.candidates import BUDGET_SPENT, GIVE_UP_FACTOR, Search
from byoc.placement.joint import (
    INT8,
    ErrorProbe,
    PrecisionBudget,
    Switch,
    backend_of,
    choose,
    computes_quantized,
    int8_option,
    quantized_piece,
    segment_layers,
)
from byoc.placement.measure import LocalMeasurer
from byoc.placement.report import PLACEMENT_ATTR, PlacementReport, SegmentRow
from byoc.placement.search import cheapest_cover
from byoc.placement.segments import Extracted, Segment, cut_segments, extract
from byoc.placement.switch import SwitchCosts, switch_costs
from byoc.progress import Progress
from byoc.runtime_metadata.build import model_io

DEFAULT_PIECES = 16
DEFAULT_BUDGET_S = 600.0


def _runs(chosen: Sequence[str]) -> list[tuple[str, int, int]]:
    """(backend, first segment, last segment) of each stretch of segments on one backend (its
    fp32 and int8 segments together: one region)."""
    runs: list[tuple[str, int, int]] = []
    for index, option in enumerate(chosen):
        backend = backend_of(option)
        if runs and runs[-1][0] == backend:
            runs[-1] = (backend, runs[-1][1], index)
        else:
            runs.append((backend, index, index))
    return runs


def place(mod: tvm.IRModule, backends: Sequence[Backend], budget_s: float = DEFAULT_BUDGET_S, measurer=None,
          cache: MeasurementCache | None = None, inputs: Mapping[str, np.ndarray] | None = None,
          pieces: int = DEFAULT_PIECES, show_progress: bool = True, precision: PrecisionBudget | None = None,
          **cost_options) -> tvm.IRModule:
    """Partition `mod` between the host and `backends` by measured cost (see the module doc).
    `inputs` by name are the model inputs the candidates see (default: seeded random). With
    `precision`, each segment also runs in int8 or fp32, chosen under its error budget (see
    `byoc.placement.joint`); the result is the model quantized where int8 was chosen."""
    start = time.perf_counter()
    measurer = measurer if measurer is not None else LocalMeasurer()
    cache = cache if cache is not None else MeasurementCache()
    host_ops = frozenset(cost_options.get("host_ops") or ())
    # Here measurement decides what a region is worth: a backend's rule that sends a region
    # without MACs back to the host (its guess that copies cost more than they save) does not
    # apply to the candidates or to the placement chosen, unless the caller gives it. Each
    # backend alone is partitioned as placement by priority would.
    measured_options = {"fallback_without_macs": False, **cost_options}
    coverages = [backend_coverage(mod, backend, host_ops) for backend in backends]
    segments = cut_segments(mod, coverages, pieces)
    extracted = [extract(mod, segment) for segment in segments]
    names = [HOST, *(b.name for b in backends)]
    total = sum(len(s.takers) for s in segments) + len(names) * len(names) + 3
    progress = Progress(total, "placement") if show_progress else None
    search = Search(backends, measurer, cache, budget_s, measured_options, progress)
    for segment, piece in zip(segments, extracted):
        search.producers.update(dict.fromkeys(piece.outputs, (piece, segment.takers)))

    try:
        search.values.update(_model_inputs(mod, inputs))
        costs = SwitchCosts(0.0, {}, {}) if not backends else switch_costs(search)
        rows, options = _measure_segments(search, segments, extracted, costs)
        choice = _choose(search, mod, backends, segments, extracted, rows, options, costs, precision, measured_options, progress)
        for row, option in zip(rows, choice.chosen):
            row.chosen = option

        def quantize(piece: Extracted, first: int, last: int) -> tvm.IRModule | None:
            """A stretch's piece with its int8 segments' layers quantized (None: it has none)."""
            if precision is None:
                return None
            return quantized_piece(piece, _int8_layers(rows, choice.layers, first, last), precision.ranges)

        predicted = _predict(search, mod, segments, rows, costs, quantize)
        placement, why = _placement(mod, segments, rows)
        placed = partition_graph(choice.model, backends, placement, why, **measured_options)
        kept = _end_to_end(search, mod, placed, choice, backends, rows, cost_options, precision)
        running = segment_backends(kept.partitioned, segments, [backend_of(option) for option in kept.chosen])
        running = [option if backend_of(option) == backend else backend for option, backend in zip(kept.chosen, running)]
        if running != [row.chosen for row in rows]:  # the report says where each segment runs
            for row, option in zip(rows, running):
                row.chosen = option
            predicted = _predict(search, mod, segments, rows, costs, quantize)
        report = PlacementReport(
            backends=[b.name for b in backends], where=f"{measurer.where} ({search.machine})", rows=rows,
            switch_ms={f"{a} -> {b}": ms for (a, b), ms in costs.switch.items()}, base_ms=costs.base_ms,
            segments_ms=costs.base_ms + choice.segments_ms, predicted_ms=predicted, measured_ms=kept.measured_ms,
            single_backend_ms=_single_backends(backends, rows, costs), decision=kept.decision,
            search_s=time.perf_counter() - start, measured=search.measured, cached=search.cached,
            budget=precision.budget if precision is not None else None, rel_l2=kept.error,
            samples=len(precision.samples) if precision is not None else 0,
        )
    finally:
        measurer.close()
        search.workdir.cleanup()
    return kept.partitioned.with_attr(PLACEMENT_ATTR, report.to_json())


@dataclass
class _Choice:
    """The cover the search chose: an option per segment, what it costs (segments and switches),
    the model it runs (quantized where int8 was chosen), its error, and the layers per segment."""

    chosen: list[str]
    segments_ms: float
    model: tvm.IRModule
    error: float | None = None
    layers: list[frozenset[int]] = field(default_factory=list)
    probe: ErrorProbe | None = None


def _choose(search: Search, mod: tvm.IRModule, backends: Sequence[Backend], segments, extracted, rows: list[SegmentRow],
            options, costs: SwitchCosts, precision: PrecisionBudget | None, measured_options: dict, progress) -> _Choice:
    """The cheapest cover in fp32; with `precision`, over fp32 and int8 options under the error
    budget (each segment's int8 options measured first)."""
    labels = [s.label for s in segments]
    if precision is None:
        chosen, segments_ms = cheapest_cover(options, costs.switch, labels)
        return _Choice(chosen, segments_ms, mod)
    layers = segment_layers(mod, segments)
    _measure_int8(search, segments, extracted, layers, rows, options, costs, precision)
    probe = ErrorProbe(mod, precision, backends, segments, layers, measured_options)
    switch = Switch(costs.switch)
    chosen, error, errors = choose(options, switch, search.by_name, probe, precision.budget, labels, progress)
    for (index, option), alone in errors.items():
        rows[index].errors[option] = alone
    return _Choice(chosen, _cover_cost(options, chosen, switch), probe.model(dict(enumerate(chosen))), error, layers, probe)


def _single_backends(backends: Sequence[Backend], rows: Sequence[SegmentRow], costs: SwitchCosts) -> dict[str, float]:
    """The predicted latency of each backend alone (with the host), where it takes every segment
    the host does not."""
    singles = {}
    for backend in backends:
        only = [{k: v for k, v in row.costs.items() if k in (backend.name, HOST)} for row in rows]
        if all(only):
            singles[backend.name] = costs.base_ms + cheapest_cover(only, costs.switch)[1]
    return singles


@dataclass
class _Kept:
    """What the end-to-end comparison kept: the partitioned model, the option per segment, its
    measured time and error, and the decision in words."""

    partitioned: tvm.IRModule
    chosen: list[str]
    measured_ms: float | None
    error: float | None
    decision: str


def _end_to_end(search: Search, mod: tvm.IRModule, placed: tvm.IRModule, choice: _Choice, backends: Sequence[Backend],
                rows: Sequence[SegmentRow], cost_options: dict, precision: PrecisionBudget | None) -> _Kept:
    """The chosen placement and every backend alone, timed end to end against each other, the
    fastest kept. Costs are not additive (layouts kept across cuts, thread pools that clash)."""
    params = [p.name for p in mod["main"].params]
    error = choice.error
    ends = {"the chosen placement": placed}
    ends.update({f"{b.name} alone": partition_graph(mod, [b], **cost_options) for b in backends})
    # With int8 chosen, the same quantized model on one backend alone too (no switches
    # between backends' int8 kernels), kept only if its own error is within the budget.
    at_precision = {f"{b.name} alone at the chosen precision": b for b in backends if computes_quantized(b)} \
        if error else {}
    ends.update({label: partition_graph(choice.model, [b], **cost_options) for label, b in at_precision.items()})
    timed = search.compare(ends, params)
    listed = ", ".join(f"{label} {ms:.3f} ms" for label, ms in timed.items())
    fastest = min(timed, key=timed.get) if timed else "the chosen placement"
    rejected = []
    while fastest in at_precision:
        alone = choice.probe.measure(ends[fastest])
        if alone <= precision.budget:
            error = alone
            break
        rejected.append(f"{fastest}, whose error {alone:.2%} exceeds the budget")
        timed.pop(fastest)
        fastest = min(timed, key=timed.get)
    decision = f"end to end: {listed or 'nothing could be timed (a simulated accelerator is only estimated)'}; kept {fastest}" \
        + (f" (not {'; '.join(rejected)})" if rejected else "")
    chosen = [row.chosen for row in rows]
    if fastest in at_precision:  # one backend runs the quantized model
        name = at_precision[fastest].name
        chosen = [int8_option(name) if option.endswith(INT8) else name for option in chosen]
    elif fastest != "the chosen placement":  # a backend alone runs the fp32 model
        chosen = [backend_of(option) for option in chosen]
        error = None if error is None else 0.0
    return _Kept(ends[fastest], chosen, timed.get(fastest), error, decision)


def _measure_segments(search: Search, segments, extracted, costs: SwitchCosts):
    """A report row and {backend: cost} per segment: its time alone, less a run's overhead and
    the backend's invocation (the search adds those back per region)."""
    rows, options = [], []
    for segment, piece in zip(segments, extracted):
        row = SegmentRow(segment.index, segment.label, len(segment.nodes), segment.macs, "", {}, dict(segment.reasons))
        for name in segment.takers:
            # A candidate far slower than the best so far cannot win: one run shows it.
            best = min((ms + costs.base_ms for ms in row.costs.values()), default=None)
            give_up = GIVE_UP_FACTOR * best if best is not None else None
            found = search.time(f"segment {segment.index} on {name}", piece.mod, name, piece.inputs, piece.outputs, give_up_ms=give_up)
            if found.ms is None:
                row.notes[name] = found.note
                continue
            row.costs[name] = max(0.0, found.ms - costs.base_ms - costs.invocation.get(name, 0.0))
        rows.append(row)
        options.append(dict(row.costs) or _unmeasured(segment, row))
    return rows, options


def _measure_int8(search: Search, segments, extracted, layers, rows, options, costs: SwitchCosts,
                  precision: PrecisionBudget) -> None:
    """Each segment with layers to quantize, quantized and timed on each backend that takes it
    and computes byoc's quantization in int8: its `<backend>:int8` option."""
    takers = [(i, name) for i, segment in enumerate(segments) if layers[i] for name in segment.takers
              if name in search.by_name and computes_quantized(search.by_name[name])]
    if search.progress is not None:
        search.progress.total += len(takers) + 2 * len(segments)  # the timings, and at most two errors a segment
    for index, name in takers:
        piece = quantized_piece(extracted[index], layers[index], precision.ranges)
        option = int8_option(name)
        found = search.time(f"segment {index} on {option}", piece, name, extracted[index].inputs, extracted[index].outputs,
                            extra_key="int8")
        if found.ms is None:
            rows[index].notes[option] = found.note
            continue
        rows[index].costs[option] = options[index][option] = max(0.0, found.ms - costs.base_ms - costs.invocation.get(name, 0.0))


def _int8_layers(rows: Sequence[SegmentRow], layers: Sequence[frozenset[int]], first: int, last: int) -> frozenset[int]:
    """The layers of the segments from `first` to `last` whose chosen option runs int8 by byoc's quantization."""
    return frozenset().union(*(layers[i] for i in range(first, last + 1) if rows[i].chosen.endswith(INT8)))


def _cover_cost(options: Sequence[Mapping[str, float]], chosen: Sequence[str], switch: Switch) -> float:
    """What the search minimises for `chosen`: its segments' costs and the switches between them."""
    total, previous = 0.0, HOST
    for costs, option in zip(options, chosen):
        total += costs[option] + (0.0 if option == previous else switch.get((previous, option)))
        previous = option
    return total


def _unmeasured(segment: Segment, row: SegmentRow) -> dict[str, float]:
    """The one option of a segment no backend was timed on: where the search budget ran out,
    the first backend by priority that was not ruled out (as placement by priority would
    choose), at no cost, so that the stretches around it decide; where every candidate failed,
    a PlacementError with each one's reason."""
    spent = [name for name in segment.takers if row.notes.get(name, "").startswith(BUDGET_SPENT)]
    if spent:
        row.notes[spent[0]] = f"{row.notes[spent[0]]}: placed by priority"
        return {spent[0]: 0.0}
    reasons = "; ".join(f"{name}: {row.notes.get(name, 'no note')}" for name in segment.takers)
    raise PlacementError(f"segment {segment.index} ({segment.label}): no candidate ran ({reasons})")


def segment_backends(partitioned: tvm.IRModule, segments: Sequence[Segment], default: Sequence[str]) -> list[str]:
    """The backend that runs most of each segment's nodes in `partitioned`, by its partition
    record: a region's nodes, or the host's. A composite is recorded under one name, so a
    segment's other members are not counted; a segment with no node recorded keeps `default`."""
    record = partition_report(partitioned)
    where = {node: region.backend for region in record.regions for node in region.nodes}
    where.update({op.node: HOST for op in record.host_ops})
    backends = []
    for segment, fallback in zip(segments, default):
        counted = Counter(where[node] for node in segment.nodes if node in where)
        backends.append(counted.most_common(1)[0][0] if counted else fallback)
    return backends


def _predict(search: Search, mod: tvm.IRModule, segments: Sequence[Segment], rows: Sequence[SegmentRow],
             costs: SwitchCosts, quantize: Callable[[Extracted, int, int], tvm.IRModule | None]) -> float | None:
    """The whole model's latency from measurements: each stretch of segments on one backend
    timed as one region (a region keeps its layouts and threads across segment cuts, which
    the segments alone cannot show), plus the switch costs between stretches; None where a
    stretch has no time (the search budget was spent)."""
    total = costs.base_ms
    previous = HOST
    runs = _runs([row.chosen for row in rows])
    if search.progress is not None:  # the stretches, then the end-to-end comparison
        search.progress.total = search.progress.done + len(runs) + 1
    for backend, first, last in runs:
        span = Segment(-1, segments[first].start, segments[last].end, [n for s in segments[first:last + 1] for n in s.nodes], 0, [], {})
        piece = extract(mod, span)
        quantized = quantize(piece, first, last) if backend != HOST else None
        found = search.time(f"segments {first}-{last} on {backend}", quantized or piece.mod, backend, piece.inputs, piece.outputs,
                            extra_key="int8" if quantized is not None else "")
        if found.ms is not None:
            total += max(0.0, found.ms - costs.base_ms - costs.invocation.get(backend, 0.0))
        elif all(row.chosen in row.costs for row in rows[first:last + 1]):  # the segments' own sum
            total += sum(row.costs[row.chosen] for row in rows[first:last + 1])
        else:
            return None
        if backend != previous:
            total += costs.switch.get((previous, backend), 0.0)
        previous = backend
    return total


def _model_inputs(mod: tvm.IRModule, given: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
    specs, _ = model_io(mod)
    if given is not None:
        missing = [s.name for s in specs if s.name not in given]
        if missing:
            raise ByocError(f"placement inputs: missing input(s) {missing}; the model's inputs are {[s.name for s in specs]}")
        return {s.name: np.asarray(given[s.name], dtype=s.dtype).reshape(s.shape) for s in specs}
    return random_inputs([(s.name, s.shape, s.dtype) for s in specs], seed=0)


def _placement(mod: tvm.IRModule, segments: Sequence[Segment], rows: Sequence[SegmentRow]) -> tuple[dict[str, str], dict[str, str]]:
    bindings = mod["main"].body.blocks[0].bindings
    placement, why = {}, {}
    for segment, row in zip(segments, rows):
        measured = ", ".join(f"{b} {ms:.3f} ms" for b, ms in row.costs.items()) or row.notes.get(row.chosen, "")
        for binding in bindings[segment.start:segment.end]:
            placement[binding.var.name] = backend_of(row.chosen)
            why[binding.var.name] = f"segment {segment.index}: {measured}"
    return placement, why
