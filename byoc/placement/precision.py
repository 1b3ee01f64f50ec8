"""Precision chosen by measurement (`precision="auto"`): int8 or fp32 for each segment of a float
model's quantizable layers, the fastest choice whose error on the calibration inputs, measured
against the fp32 model, stays within a budget (`max_rel_l2`).

The layers that `byoc.processing.quantize_model` would quantize are cut, in the model's order, into
segments of about equal count. Candidates are built for the vendors and run on the calibration
inputs: the fp32 model, the whole model in int8, and each segment alone in int8, which gives
each segment's error and, timed against each other, the time it saves. Where the whole model in
int8 is within the budget, that is the choice. Otherwise segments join the int8 set by time saved
per squared error alone (independent errors add in squares), each addition measured on the model
with every segment chosen so far, and kept only if the measured error stays within the budget.
The choice, what each segment costs in error and saves in time, travels with the partitioned
module as JSON in the attribute `byoc.precision` (`precision_report`).
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import tvm

from byoc.backend.spec import Backend
from byoc.errors import QuantizationError
from byoc.partition.pipeline import partition_graph
from byoc.processing.quantize_model import int8_plan, quantize_layers
from byoc.progress import Progress
from byoc.relative_l2 import samples_relative_l2
from byoc.runtime_metadata.build import build
from byoc.runtime_metadata.calibration import run_sample
from byoc.timing import time_blocks

PRECISION_ATTR = "byoc.precision"
DEFAULT_SEGMENTS = 8
DEFAULT_BUDGET = 0.02


@dataclass
class PrecisionSegment:
    index: int
    label: str  # first .. last layer
    layers: int
    chosen: str  # "int8" or "fp32"
    alone_rel_l2: float | None  # error of the model with this segment alone in int8 (None: not measured)
    saved_ms: float | None  # time this segment alone in int8 saves


@dataclass
class PrecisionReport:
    budget: float
    rel_l2: float  # the chosen model's measured error against fp32
    int8_rel_l2: float  # the whole model in int8
    fp32_ms: float
    int8_ms: float
    chosen_ms: float
    samples: int
    search_s: float
    segments: list[PrecisionSegment]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> PrecisionReport:
        data = json.loads(text)
        return cls(**{**data, "segments": [PrecisionSegment(**s) for s in data["segments"]]})

    def to_table(self) -> str:
        chosen = sum(s.layers for s in self.segments if s.chosen == "int8")
        layers = sum(s.layers for s in self.segments)
        lines = [
            f"precision by measurement: {chosen} of {layers} layers in int8, relative L2 {self.rel_l2:.2%} against fp32 "
            f"(budget {self.budget:.2%}; all int8: {self.int8_rel_l2:.2%}) on {self.samples} calibration input(s), "
            f"{self.search_s:.1f} s",
            f"latency: fp32 {self.fp32_ms:.2f} ms, chosen {self.chosen_ms:.2f} ms ({self.fp32_ms / self.chosen_ms:.2f}x faster), "
            f"all int8 {self.int8_ms:.2f} ms",
            f"{'seg':>4}  {'layers':<52}{'count':>6}  {'runs in':<8}{'error alone':>12}{'saves ms':>10}",
        ]
        lines.append("-" * len(lines[-1]))
        for s in self.segments:
            error = "-" if s.alone_rel_l2 is None else f"{s.alone_rel_l2:.2%}"
            saved = "-" if s.saved_ms is None else f"{s.saved_ms:.2f}"
            lines.append(f"{s.index:>4}  {s.label[:50]:<52}{s.layers:>6}  {s.chosen:<8}{error:>12}{saved:>10}")
        if all(s.alone_rel_l2 is None for s in self.segments):
            lines.append("(the whole model in int8 is within the budget: segments were not measured alone)")
        return "\n".join(lines)


def precision_report(mod: tvm.IRModule) -> PrecisionReport | None:
    """What `precision="auto"` measured and chose for `mod`, or None."""
    text = mod.attrs.get(PRECISION_ATTR) if mod.attrs is not None else None
    return PrecisionReport.from_json(str(text)) if text is not None else None


def checked_budget(budget: float) -> float:
    """`budget` (max_rel_l2), refused unless it is a relative error between 0 and 1."""
    if not 0 < budget < 1:
        raise QuantizationError(f"max_rel_l2 must be a relative error between 0 and 1, not {budget!r}")
    return budget


class _Candidates:
    """Builds a model for a set of int8 layers and runs it on the calibration inputs."""

    def __init__(self, mod: tvm.IRModule, backends: Sequence[Backend], samples: list, ranges: Callable[[Sequence[int]], Mapping]):
        self.mod, self.backends, self.samples, self.ranges = mod, list(backends), samples, ranges

    def model(self, layers: frozenset[int]) -> tvm.IRModule:
        return quantize_layers(self.mod, layers, self.ranges)

    def compiled(self, layers: frozenset[int]):
        return build(partition_graph(self.model(layers), self.backends))

    def outputs(self, compiled) -> list[list[np.ndarray]]:
        return [run_sample(compiled, sample) for sample in self.samples]


def choose_precision(mod: tvm.IRModule, backends: Sequence[Backend], samples: list, ranges: Callable[[Sequence[int]], Mapping],
                     budget: float = DEFAULT_BUDGET, segments: int = DEFAULT_SEGMENTS, runs: int = 10,
                     show_progress: bool = True) -> tuple[tvm.IRModule, PrecisionReport]:
    """The model with the int8 segments chosen (see the module doc) quantized, and the report.
    `ranges(var ids)` gives the calibrated ranges of the model's values."""
    checked_budget(budget)
    start = time.perf_counter()
    order = int8_plan(mod).order
    count = max(1, min(segments, len(order)))
    cuts = [round(i * len(order) / count) for i in range(count + 1)]
    parts = [frozenset(order[a:b]) for a, b in zip(cuts, cuts[1:])]
    names = {b.var.id_: b.var.name for block in mod["main"].body.blocks for b in block.bindings}
    candidates = _Candidates(mod, backends, samples, ranges)
    progress = Progress(len(parts) + 2, "measuring precision") if show_progress else None
    compiled = {"fp32": candidates.compiled(frozenset())}
    want = candidates.outputs(compiled["fp32"])
    _advance(progress, "fp32")
    compiled["int8"] = candidates.compiled(frozenset(order))
    errors = {"int8": samples_relative_l2(candidates.outputs(compiled["int8"]), want)}
    _advance(progress, "all int8")
    if errors["int8"] > budget:
        for index, part in enumerate(parts):
            compiled[index] = candidates.compiled(part)
            errors[index] = samples_relative_l2(candidates.outputs(compiled[index]), want)
            _advance(progress, f"segment {index} in int8")
    ms = _median_ms(compiled, samples[0], runs)
    chosen: set[int] = set()
    error = 0.0
    if errors["int8"] <= budget:
        chosen, error = set(range(len(parts))), errors["int8"]
    else:
        # the most time saved per squared error first; each addition measured with those before it
        ranked = sorted(range(len(parts)), key=lambda i: (ms["fp32"] - ms[i]) / max(errors[i] ** 2, 1e-12), reverse=True)
        for index in ranked:
            if ms["fp32"] - ms[index] <= 0 or errors[index] > budget:
                continue
            trial = chosen | {index}
            measured = errors[index] if not chosen else samples_relative_l2(
                candidates.outputs(candidates.compiled(frozenset().union(*(parts[i] for i in trial)))), want)
            if measured <= budget:
                chosen, error = trial, measured
    layers = frozenset().union(*(parts[i] for i in chosen)) if chosen else frozenset()
    fp32_ms = ms["fp32"]
    if not layers or layers == frozenset(order):
        chosen_ms = ms["int8"] if layers else ms["fp32"]
    else:  # timed against fp32 once more, in one run
        final = _median_ms({"fp32": compiled["fp32"], "chosen": candidates.compiled(layers)}, samples[0], runs)
        fp32_ms, chosen_ms = final["fp32"], final["chosen"]
    rows = [PrecisionSegment(index, f"{names.get(part_order[0], '?')} .. {names.get(part_order[-1], '?')}", len(part),
                             "int8" if index in chosen else "fp32", errors.get(index),
                             ms["fp32"] - ms[index] if index in ms else None)
            for index, (part, part_order) in enumerate(zip(parts, (order[a:b] for a, b in zip(cuts, cuts[1:]))))]
    report = PrecisionReport(budget, error, errors["int8"], fp32_ms, ms["int8"], chosen_ms, len(samples),
                             time.perf_counter() - start, rows)
    return candidates.model(layers), report


def _advance(progress: Progress | None, what: str) -> None:
    if progress is not None:
        progress.advance(what)


def _median_ms(compiled: Mapping, inputs, runs: int) -> dict:
    """Median milliseconds per run of each compiled model on `inputs`, timed against each other."""
    timings = time_blocks({key: (lambda model=model: run_sample(model, inputs)) for key, model in compiled.items()}, runs, passes=2,
                          idle_s=0.2)
    return {key: statistics.median(values) * 1e3 for key, values in timings.items()}
