"""Precision chosen with placement: `placement="auto"` under an error budget (`max_rel_l2`) picks,
for each segment, a backend and whether it runs the segment's layers in int8 or fp32, by measured
time and measured error.

A backend that computes a quantized model in int8 with its scales (dnnl, onnxruntime) gets a
second option per segment, `<backend>:int8`: the segment quantized by byoc as
`precision="int8"` would quantize it (`byoc.processing.quantize_model`, ranges calibrated on the whole
float model), timed like any candidate. A backend that quantizes at compile time (vitis_ai,
ethos_u) is an int8 option as it stands. Each int8 option that is faster than the segment's
fastest fp32 option has its error measured: the whole model with that segment alone on it, the
rest in fp32, against the fp32 model on the calibration inputs.

The choice: the cheapest cover with every int8 option that saves time, kept if the model it
makes is within the budget when measured (then no segment is measured alone). Otherwise each such
option is measured alone, and the set that saves the most time with its errors adding up within
the budget, as independent errors add (in squares), is chosen (every set tried where there are
few), then measured: while it exceeds the budget, the option that saves the least for its error
leaves it. The errors travel in the placement report.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import tvm

from byoc.backend.spec import Backend
from byoc.partition.group import HOST
from byoc.partition.pipeline import partition_graph
from byoc.placement.report import INT8
from byoc.placement.search import cheapest_cover
from byoc.placement.segments import Extracted, Segment, main_block
from byoc.processing.passes import needs_calibration
from byoc.processing.quantize_model import int8_plan, quantize_layers
from byoc.progress import Progress
from byoc.relative_l2 import samples_relative_l2
from byoc.runtime_metadata.build import build
from byoc.runtime_metadata.calibration import calibrate, run_sample


def int8_option(backend: str) -> str:
    return backend + INT8


def backend_of(option: str) -> str:
    """The backend an option runs on (`dnnl:int8` -> `dnnl`)."""
    return option.removesuffix(INT8)


def computes_quantized(backend: Backend) -> bool:
    """Whether `backend` runs a model byoc quantized in int8 with its scales (so it gets `:int8` options)."""
    return bool(backend.limits.quantized) and backend.limits.int8_weights and not needs_calibration(backend.processing)


@dataclass
class PrecisionBudget:
    """What placement needs to choose precision: the budget, the calibration inputs, the backends
    that compute the fp32 model (its reference outputs, and the rest of each model measured for
    error), and the calibrated range of any value of the model by variable id."""

    budget: float
    samples: list
    float_backends: list[Backend]
    ranges: Callable[[Sequence[int]], Mapping[int, list[float]]]


class Switch:
    """Switch costs read through options: `dnnl:int8` is entered as `dnnl` is, and moving between
    a backend's fp32 and int8 segments stays in one region (no switch)."""

    def __init__(self, switch: Mapping[tuple[str, str], float]) -> None:
        self.switch = switch

    def get(self, key: tuple[str, str], default: float = 0.0) -> float:
        a, b = (backend_of(k) for k in key)
        return 0.0 if a == b else self.switch.get((a, b), default)


def segment_layers(mod: tvm.IRModule, segments: Sequence[Segment]) -> list[frozenset[int]]:
    """The quantizable layers (variable ids) of each segment."""
    order = int8_plan(mod).layers
    bindings = list(main_block(mod).bindings)
    return [frozenset(b.var.id_ for b in bindings[s.start:s.end] if b.var.id_ in order) for s in segments]


def quantized_piece(piece: Extracted, layers: frozenset[int], ranges) -> tvm.IRModule | None:
    """`piece` with those of the model's `layers` it holds quantized, or None where it holds none."""
    local = frozenset(i for i, o in piece.origin.items() if o in layers)
    if not local:
        return None

    def piece_ranges(var_ids: Sequence[int]) -> dict[int, list[float]]:
        known = ranges(sorted({piece.origin[i] for i in var_ids}))
        return {i: known[piece.origin[i]] for i in var_ids}

    return quantize_layers(piece.mod, local, piece_ranges)


class ErrorProbe:
    """Measures a placement's error against the fp32 model on the calibration inputs."""

    def __init__(self, mod: tvm.IRModule, precision: PrecisionBudget, backends: Sequence[Backend], segments: Sequence[Segment],
                 layers: Sequence[frozenset[int]], cost_options: Mapping) -> None:
        self.mod, self.precision, self.segments, self.layers = mod, precision, segments, layers
        self.by_name = {b.name: b for b in backends}
        self.cost_options = dict(cost_options)
        self.want = self._outputs(partition_graph(mod, precision.float_backends, **self.cost_options), ())

    def model(self, choice: Mapping[int, str]) -> tvm.IRModule:
        """The model quantized where `choice` (segment index -> option) runs int8 on a backend that
        computes byoc's quantization."""
        layers = frozenset().union(*(self.layers[i] for i, option in choice.items() if option.endswith(INT8)))
        return quantize_layers(self.mod, layers, self.precision.ranges)

    def placement(self, choice: Mapping[int, str]) -> dict[str, str]:
        return {node: backend_of(option) for i, option in choice.items() for node in self.segments[i].nodes}

    def error(self, choice: Mapping[int, str]) -> float:
        """The relative L2 error of the model with `choice` (segment index -> option; the
        segments it leaves out on the float backends by priority)."""
        vendors = [self.by_name[name] for name in {backend_of(o) for o in choice.values()} - {HOST}
                   if self.by_name[name] not in self.precision.float_backends]
        partitioned = partition_graph(self.model(choice), [*self.precision.float_backends, *vendors], self.placement(choice),
                                      **self.cost_options)
        return self.measure(partitioned, vendors)

    def measure(self, partitioned: tvm.IRModule, vendors: Sequence[Backend] = ()) -> float:
        """The relative L2 error of a partitioned model (its `vendors` that quantize at compile
        time calibrated here)."""
        return samples_relative_l2(self._outputs(partitioned, vendors), self.want)

    def _outputs(self, partitioned: tvm.IRModule, vendors: Sequence[Backend]) -> list[list[np.ndarray]]:
        for vendor in vendors:
            if needs_calibration(vendor.processing):
                partitioned = calibrate(partitioned, vendor, self.precision.samples)
        compiled = build(partitioned)
        return [run_sample(compiled, sample) for sample in self.precision.samples]


def int8_options(options: Sequence[Mapping[str, float]], by_name: Mapping[str, Backend]) -> list[tuple[int, str]]:
    """(segment, option) of every int8 option faster than the segment's fastest fp32 option."""
    found = []
    for index, costs in enumerate(options):
        fp32 = [ms for option, ms in costs.items() if not is_int8(option, by_name)]
        for option, ms in costs.items():
            if is_int8(option, by_name) and (not fp32 or ms < min(fp32)):
                found.append((index, option))
    return found


def is_int8(option: str, by_name: Mapping[str, Backend]) -> bool:
    backend = by_name.get(backend_of(option))
    return option.endswith(INT8) or (backend is not None and needs_calibration(backend.processing))


def choose(options: Sequence[Mapping[str, float]], switch: Switch, by_name: Mapping[str, Backend], probe: ErrorProbe,
           budget: float, labels: Sequence[str],
           progress: Progress | None) -> tuple[list[str], float, dict[tuple[int, str], float]]:
    """(an option per segment, the measured error of that choice, the errors measured of int8
    options alone by (segment, option)): see the module doc."""
    fp32 = [{o: ms for o, ms in costs.items() if not is_int8(o, by_name)} for costs in options]

    def cover(allowed: set[tuple[int, str]]) -> list[str]:
        offered = [{**fp32[i], **{o: ms for o, ms in costs.items() if (i, o) in allowed}} for i, costs in enumerate(options)]
        return cheapest_cover(offered, switch, labels)[0]

    def int8_of(chosen: Sequence[str]) -> set[tuple[int, str]]:
        return {(i, o) for i, o in enumerate(chosen) if is_int8(o, by_name)}

    def measured(choice: Mapping[int, str], what: str) -> float:
        if progress is not None:
            progress.step(what)
        error = probe.error(choice)
        if progress is not None:
            progress.advance(what)
        return error

    faster = int8_options(options, by_name)
    chosen = cover(set(faster))
    if not int8_of(chosen):
        return chosen, 0.0, {}
    error = measured(dict(enumerate(chosen)), "the error of the fastest placement")
    if error <= budget:  # the segments need not be measured alone
        return chosen, error, {}
    errors = {key: measured({key[0]: key[1]}, f"the error of segment {key[0]} on {key[1]}") for key in faster}

    def saving(key: tuple[int, str]) -> float:
        index, option = key
        return min(fp32[index].values(), default=options[index][option]) - options[index][option]

    usable = [key for key in faster if errors[key] <= budget]
    allowed = set(_most_saved(usable, saving, {k: errors[k] ** 2 for k in usable}, budget ** 2))
    while allowed:  # errors need not add up as independent ones do: the worst value for its error leaves first
        chosen = cover(allowed)
        if int8_of(chosen) == allowed and len(allowed) == 1:
            error = errors[next(iter(allowed))]
        else:
            error = measured(dict(enumerate(chosen)), "the error of a placement")
        if error <= budget:
            return chosen, error, errors
        allowed.discard(min(allowed, key=lambda k: saving(k) / max(errors[k] ** 2, 1e-12)))
    return cover(set()), 0.0, errors


EXACT_UP_TO = 16  # int8 options over which the best set is found by trying every one


def _most_saved(keys: Sequence[tuple[int, str]], saving, weight: Mapping[tuple[int, str], float],
                capacity: float) -> list[tuple[int, str]]:
    """The options (at most one a segment) that save the most time with their squared errors
    adding up to at most `capacity`: every set tried where there are few, else by time saved per
    squared error."""
    keys = sorted(keys, key=lambda k: saving(k) / max(weight[k], 1e-24), reverse=True)
    if len(keys) > EXACT_UP_TO:
        chosen, used, segments = [], 0.0, set()
        for key in keys:
            if key[0] not in segments and used + weight[key] <= capacity:
                chosen.append(key)
                used += weight[key]
                segments.add(key[0])
        return chosen
    best: list[tuple[int, str]] = []
    best_saving = 0.0
    for mask in range(1, 1 << len(keys)):
        picked = [k for bit, k in enumerate(keys) if mask >> bit & 1]
        if len({k[0] for k in picked}) < len(picked) or sum(weight[k] for k in picked) > capacity:
            continue
        total = sum(saving(k) for k in picked)
        if total > best_saving:
            best, best_saving = picked, total
    return best
