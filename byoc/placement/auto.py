"""Placement by measured cost: which backend runs each segment of the model is chosen by timing
every segment on every backend that can take it, then taking the cheapest cover.

The steps: each backend's coverage alone (its patterns and op rules); segments (see
`byoc.placement.segments`); per segment and backend, a candidate model built and timed in a
worker process, or its time read from the cache, or, for a simulated accelerator, its cost
model's estimate; the cost of entering a region, measured per backend on a one-op model; the
cheapest cover (`byoc.placement.search`); and last, the chosen placement and the best
single-backend partition built and timed end to end, keeping the faster.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from byoc.backend.spec import Backend
from byoc.errors import ByocError
from byoc.models import random_inputs
from byoc.partition.coverage import backend_coverage
from byoc.partition.group import HOST
from byoc.partition.outline import CODEGEN_ATTR
from byoc.partition.pipeline import partition_graph
from byoc.partition.report import report
from byoc.placement.cache import MeasurementCache, candidate_key, content_hash
from byoc.placement.measure import LocalMeasurer, Measurement
from byoc.placement.report import PLACEMENT_ATTR, PlacementReport, SegmentRow
from byoc.placement.search import cheapest_cover
from byoc.placement.segments import Segment, cut_segments, extract
from byoc.processing.calibration import calibrate
from byoc.processing.passes import needs_calibration
from byoc.progress import Progress
from byoc.runtime_metadata.build import build, model_io

DEFAULT_PIECES = 16
DEFAULT_BUDGET_S = 600.0
PROBE_INPUT = "byoc_probe"
GIVE_UP_FACTOR = 10.0


class _NotTaken(Exception):
    """The backend's own cost rules send the whole candidate back to the host."""


@dataclass
class _Candidate:
    key: str
    ms: float | None
    note: str = ""
    cached: bool = False


class _Search:
    def __init__(self, mod: tvm.IRModule, backends: Sequence[Backend], measurer, cache: MeasurementCache,
                 budget_s: float, cost_options: Mapping, progress: Progress | None) -> None:
        self.mod = mod
        self.backends = list(backends)
        self.by_name = {b.name: b for b in self.backends}
        self.measurer = measurer
        self.cache = cache
        self.deadline = time.perf_counter() + budget_s
        self.budget_s = budget_s
        self.cost_options = dict(cost_options)
        self.progress = progress
        self.machine = measurer.machine()
        self.workdir = tempfile.TemporaryDirectory(prefix="byoc-placement-")
        self.measured = self.cached = 0
        self.values: dict[str, np.ndarray] = {}
        self.hashes: dict[int, str] = {}
        self.producers: dict[str, tuple] = {}  # value name -> (the extracted segment making it, its takers)
        self.modules: list[tvm.IRModule] = []

    def time(self, what: str, mod: tvm.IRModule, backend: str, input_names: Sequence[str],
             output_names: Sequence[str] = (), extra_key: str = "", give_up_ms: float | None = None) -> _Candidate:
        """`candidate` for a backend by name (HOST: the module as it is, on the host), shown
        as a step of the progress bar."""
        if self.progress is not None:
            self.progress.step(what)
        found = self.candidate(mod, self.by_name.get(backend), input_names, output_names, extra_key, give_up_ms)
        if self.progress is not None:
            self.progress.advance(what)
        return found

    def compare(self, modules: Mapping[str, tvm.IRModule], input_names: Sequence[str]) -> dict[str, float]:
        """Whole partitioned models timed against each other in one worker, in interleaved
        rounds (or all read from the cache); {label: ms} for those that built and ran."""
        if self.progress is not None:
            self.progress.step("end to end, against each other")
        keys = {label: candidate_key(content_hash(mod), None, self.machine, "compared") for label, mod in modules.items()}
        entries = {label: self.cache.get(key) for label, key in keys.items()}
        if all(entry is not None for entry in entries.values()):
            self.cached += len(entries)
            timed = {label: entry["ms"] for label, entry in entries.items() if entry["ms"] is not None}
        else:
            paths = {}
            for label, mod in modules.items():
                try:
                    paths[label] = self._artifact(mod, None, {})[0]
                except Exception:  # a placement that does not build is not compared (its regions fell back)
                    continue
            results = self.measurer.compare(list(paths.values()), self._save_inputs(input_names))
            timed = {}
            for label, result in zip(paths, results):
                self.measured += 1
                self.cache.put(keys[label], {"ms": result.ms, "runs": result.runs, "note": result.error})
                if result.ms is not None:
                    timed[label] = result.ms
        if self.progress is not None:
            self.progress.advance("end to end, against each other")
        return timed

    # ------------------------------------------------------------ one candidate
    def _build(self, key: str, mod: tvm.IRModule, backend: Backend | None, input_names: Sequence[str]):
        """(artifact path, estimate) or the skipped `_Candidate` with the reason."""
        try:
            return self._artifact(mod, backend, {n: self.values[n] for n in input_names})
        except _NotTaken as error:
            return _Candidate(key, None, str(error))
        except ByocError as error:
            return _Candidate(key, None, f"build failed: {str(error).splitlines()[0]}")
        except Exception as error:  # a vendor's code generator can raise anything: the candidate is skipped
            text = str(error).strip()
            return _Candidate(key, None, f"build failed: {type(error).__name__}: {text.splitlines()[0] if text else ''}")

    def _load_outputs(self, path: str, names: Sequence[str]) -> None:
        with np.load(path) as data:
            for i, name in enumerate(names):
                self.values[name] = data[f"arr_{i}"]

    def _ensure_values(self, names: Sequence[str]) -> str:
        """Make the values `names` by running the segments that produce them (untimed: their
        times came from the cache); returns why that failed, or ""."""
        for name in names:
            if name in self.values:
                continue
            producer = self.producers.get(name)
            if producer is None:
                return f"nothing makes {name}"
            piece, takers = producer
            failed = self._ensure_values(piece.inputs)
            if failed:
                return failed
            for taker in takers:
                built = self._build("", piece.mod, self.by_name.get(taker), piece.inputs)
                if isinstance(built, _Candidate):
                    continue
                path = built[0]
                result = self.measurer.measure(path, self._save_inputs(piece.inputs), path + ".out.npz", False, None, taker)
                if not result.error:
                    self._load_outputs(path + ".out.npz", piece.outputs)
                    break
            if name not in self.values:
                return f"every candidate that makes {name} failed"
        return ""

    def _artifact(self, mod: tvm.IRModule, backend: Backend | None, inputs: dict[str, np.ndarray]) -> tuple[str, float | None]:
        """Build `mod` for `backend` (all of it on the host when None); (artifact path, the
        vendor's own estimate in ms when it is a simulated accelerator)."""
        if backend is not None:
            mod = partition_graph(mod, [backend], **self.cost_options)
            summary = report(mod)
            if not summary.regions:
                why = summary.host_ops[0].reasons[-1] if summary.host_ops else "no region"
                raise _NotTaken(f"{backend.name} makes no region of it: {why}")
            if needs_calibration(backend.processing):
                mod = calibrate(mod, backend, [inputs])
        # strict: a code generator that fails must skip the candidate, not time the host instead
        model = build(mod, strict=True, backends=self.by_name)
        estimates = [a.info.get("ms_at_clock") for a in model.artifacts if a.info]
        estimate = sum(estimates) if estimates and all(e is not None for e in estimates) else None
        fd, path = tempfile.mkstemp(suffix=".byoc", dir=self.workdir.name)
        os.close(fd)
        model.export(path)
        return path, estimate

    def _save_inputs(self, names: Sequence[str]) -> str:
        fd, path = tempfile.mkstemp(suffix=".npz", dir=self.workdir.name)
        os.close(fd)
        np.savez(path, *[self.values[n] for n in names])
        return path

    def candidate(self, mod: tvm.IRModule, backend: Backend | None, input_names: Sequence[str],
                  output_names: Sequence[str] = (), extra_key: str = "", give_up_ms: float | None = None) -> _Candidate:
        content = self.hashes.get(id(mod))
        if content is None:  # one hash per module, not per backend (hashing reads every constant)
            content = self.hashes[id(mod)] = content_hash(mod)
            self.modules.append(mod)  # keeps the id unique while the search runs
        key = candidate_key(content, backend, self.machine, extra_key)
        entry = self.cache.get(key)
        if entry is not None:
            self.cached += 1
            return _Candidate(key, entry["ms"], entry.get("note", ""), cached=True)
        if time.perf_counter() > self.deadline:
            return _Candidate(key, None, f"not measured: the search budget of {self.budget_s:.0f} s was spent")
        failed = self._ensure_values(input_names)
        if failed:
            return _Candidate(key, None, f"no input values for it: {failed}")
        built = self._build(key, mod, backend, input_names)
        if isinstance(built, _Candidate):
            return built
        path, estimate = built
        wants_outputs = any(n not in self.values for n in output_names)
        outputs_path = path + ".out.npz" if wants_outputs else ""
        # A candidate that mixes backends (a switch probe, a whole placement) runs in the mixed pool.
        pool = backend.name if backend is not None else ("mixed" if _has_regions(mod) else HOST)
        result = self.measurer.measure(path, self._save_inputs(input_names), outputs_path, estimate is None, give_up_ms, pool)
        if outputs_path and not result.error:
            self._load_outputs(outputs_path, output_names)
        if estimate is not None:
            result = Measurement(estimate, "")
            note = "the simulator's cost model estimate"
        elif give_up_ms is not None and result.runs == 1:
            note = f"one run: over {GIVE_UP_FACTOR:.0f}x the fastest backend's time"
        else:
            note = ""
        if result.ms is None:
            return _Candidate(key, None, f"failed when run: {result.error}")
        self.measured += 1
        self.cache.put(key, {"ms": result.ms, "runs": result.runs, "note": note, "where": self.measurer.where})
        return _Candidate(key, result.ms, note)


def _has_regions(mod: tvm.IRModule) -> bool:
    return any(isinstance(f, relax.Function) and f.attrs is not None and CODEGEN_ATTR in f.attrs for f in mod.functions.values())


def _probe(rows: int, width: int, names: Sequence[str]) -> tvm.IRModule:
    """A chain of (rows x width) by (width x width) products, named `names`."""
    builder = relax.BlockBuilder()
    x = relax.Var(f"{PROBE_INPUT}_{rows}x{width}", relax.TensorType((rows, width), "float32"))
    rng = np.random.default_rng(0)
    with builder.function("main", params=[x]):
        with builder.dataflow():
            y = x
            for name in names:
                weight = relax.const((rng.standard_normal((width, width)) / np.sqrt(width)).astype("float32"))
                y = builder.emit(relax.op.matmul(y, weight), name)
            y = builder.emit_output(y, "probe_out")
        builder.emit_func_output(y)
    return builder.get()


@dataclass
class _SwitchCosts:
    base_ms: float  # a model run's own overhead
    invocation: dict[str, float]  # backend -> cost of a region of it, over the same op on the host
    switch: dict[tuple[str, str], float]  # (from, to) -> cost of handing over between regions


def _switch_costs(search: _Search) -> _SwitchCosts:
    """The cost of entering a region, from a one-op model that computes next to nothing (1x64 by
    64x64) on each backend against the host; and of switching from backend a to backend b, from
    a two-op model (256x1024 by 1024x1024, twice) with one op on each: what it costs beyond the two
    ops and a's invocation. That catches more than invocation: a library whose threads still
    spin after its region (onnxruntime's, OpenMP's) slows the next one down, which the ops
    must last long enough (about a millisecond each) to show. Switches to and
    from the host cost the invocation alone: a host op in the two-op model would be TVM's
    parallel matmul, whose clash with spinning threads says little of the small serial kernels
    the host runs between regions (which a stretch's own timing and the end-to-end check see)."""
    names = list(search.by_name)
    tiny = _probe(1, 64, ["probe"])
    pair = _probe(256, 1024, ["probe_first", "probe_second"])
    for probe in (tiny, pair):
        param = probe["main"].params[0]
        search.values[param.name] = np.ones([int(d) for d in param.ty.shape.values], np.float32)
    inputs = [tiny["main"].params[0].name]
    alone = {name: search.time(f"probe on {name}", tiny, name, inputs, extra_key="probe").ms for name in [HOST, *names]}
    base = alone[HOST] or 0.0
    invocation = {name: max(0.0, alone[name] - base) for name in names if alone[name] is not None}
    switch = {(HOST, name): ms for name, ms in invocation.items()}
    pair_inputs = [pair["main"].params[0].name]
    times: dict[tuple[str, str], float] = {}
    for first in invocation:
        for second in invocation:
            placed = partition_graph(pair, search.backends, {"probe_first": first, "probe_second": second})
            found = search.time(f"switch {first} to {second}", placed, HOST, pair_inputs, extra_key="switch")
            if found.ms is not None:
                times[first, second] = found.ms
    op = {name: (times[name, name] - base - invocation[name]) / 2 for name in invocation if (name, name) in times}
    for first in invocation:
        for second in invocation:
            if first == second:
                continue
            if (first, second) in times and first in op and second in op:
                switch[first, second] = max(invocation[second], times[first, second] - base - op[first] - op[second] - invocation[first])
            else:
                switch[first, second] = invocation[second]
    return _SwitchCosts(base, {HOST: 0.0, **invocation}, switch)


def _runs(chosen: Sequence[str]) -> list[tuple[str, int, int]]:
    """(backend, first segment, last segment) of each stretch of segments on one backend."""
    runs: list[tuple[str, int, int]] = []
    for index, backend in enumerate(chosen):
        if runs and runs[-1][0] == backend:
            runs[-1] = (backend, runs[-1][1], index)
        else:
            runs.append((backend, index, index))
    return runs


def place(mod: tvm.IRModule, backends: Sequence[Backend], budget_s: float = DEFAULT_BUDGET_S, measurer=None,
          cache: MeasurementCache | None = None, inputs: Mapping[str, np.ndarray] | None = None,
          pieces: int = DEFAULT_PIECES, show_progress: bool = True, **cost_options) -> tvm.IRModule:
    """Partition `mod` between the host and `backends` by measured cost (see the module doc).
    `inputs` by name are the model inputs the candidates see (default: seeded random)."""
    start = time.perf_counter()
    measurer = measurer if measurer is not None else LocalMeasurer()
    cache = cache if cache is not None else MeasurementCache()
    host_ops = frozenset(cost_options.get("host_ops") or ())
    coverages = [backend_coverage(mod, backend, host_ops) for backend in backends]
    segments = cut_segments(mod, coverages, pieces)
    extracted = [extract(mod, segment) for segment in segments]
    names = [HOST, *(b.name for b in backends)]
    total = sum(len(s.takers) for s in segments) + len(names) * len(names) + 3
    progress = Progress(total, "placement") if show_progress else None
    search = _Search(mod, backends, measurer, cache, budget_s, cost_options, progress)
    for segment, piece in zip(segments, extracted):
        search.producers.update(dict.fromkeys(piece.outputs, (piece, segment.takers)))

    try:
        search.values.update(_model_inputs(mod, inputs))
        costs = _SwitchCosts(0.0, {}, {}) if not backends else _switch_costs(search)
        rows, options = _measure_segments(search, segments, extracted, costs)
        chosen, segment_sum = cheapest_cover(options, costs.switch, [s.label for s in segments])
        for row, backend in zip(rows, chosen):
            row.chosen = backend
        predicted = _predict(search, mod, segments, rows, costs)
        singles = {}
        for backend in backends:
            only = [{k: v for k, v in o.items() if k in (backend.name, HOST)} for o in options]
            if all(only):
                singles[backend.name] = costs.base_ms + cheapest_cover(only, costs.switch)[1]
        placement, why = _placement(mod, segments, rows)
        partitioned = partition_graph(mod, backends, placement, why, **cost_options)
        params = [p.name for p in mod["main"].params]
        # Costs are not additive (layouts kept across cuts, thread pools that clash): the chosen
        # placement and every backend alone are timed end to end against each other, and the
        # fastest is kept.
        ends = {"the chosen placement": partitioned}
        ends.update({f"{b.name} alone": partition_graph(mod, [b], **cost_options) for b in backends})
        timed = search.compare(ends, params)
        fastest = min(timed, key=timed.get) if timed else "the chosen placement"
        listed = ", ".join(f"{label} {ms:.3f} ms" for label, ms in timed.items())
        decision = f"end to end: {listed or 'nothing could be timed'}; kept {fastest}"
        partitioned = ends[fastest]
        if fastest != "the chosen placement":
            name = fastest.removesuffix(" alone")
            for row in rows:
                row.chosen = name if name in row.costs else HOST
            predicted = _predict(search, mod, segments, rows, costs)
        report = PlacementReport(
            [b.name for b in backends], f"{measurer.where} ({search.machine})", rows,
            {f"{a} -> {b}": ms for (a, b), ms in costs.switch.items()}, costs.base_ms, costs.base_ms + segment_sum, predicted,
            timed.get(fastest), singles, decision, time.perf_counter() - start, search.measured, search.cached,
        )
    finally:
        measurer.close()
        search.workdir.cleanup()
    return partitioned.with_attr(PLACEMENT_ATTR, report.to_json())


def _measure_segments(search: _Search, segments, extracted, costs: _SwitchCosts):
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
        options.append(dict(row.costs))
    return rows, options


def _predict(search: _Search, mod: tvm.IRModule, segments: Sequence[Segment], rows: Sequence[SegmentRow],
             costs: _SwitchCosts) -> float:
    """The whole model's latency from measurements: each stretch of segments on one backend
    timed as one region (a region keeps its layouts and threads across segment cuts, which
    the segments alone cannot show), plus the switch costs between stretches."""
    total = costs.base_ms
    previous = HOST
    runs = _runs([row.chosen for row in rows])
    if search.progress is not None:  # the stretches, then the end-to-end comparison
        search.progress.total = search.progress.done + len(runs) + 1
    for backend, first, last in runs:
        span = Segment(-1, segments[first].start, segments[last].end, [n for s in segments[first:last + 1] for n in s.nodes], 0, [], {})
        piece = extract(mod, span)
        found = search.time(f"segments {first}-{last} on {backend}", piece.mod, backend, piece.inputs, piece.outputs)
        if found.ms is not None:
            total += max(0.0, found.ms - costs.base_ms - costs.invocation.get(backend, 0.0))
        else:  # the segments' own sum
            total += sum(row.costs[backend] for row in rows[first:last + 1])
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
        measured = ", ".join(f"{b} {ms:.3f} ms" for b, ms in row.costs.items())
        for binding in bindings[segment.start:segment.end]:
            placement[binding.var.name] = row.chosen
            why[binding.var.name] = f"segment {segment.index}: {measured}"
    return placement, why
