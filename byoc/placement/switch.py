"""The cost of entering a region of each backend and of switching between backends, measured
on small models made for it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from byoc.partition.group import HOST
from byoc.partition.pipeline import partition_graph
from byoc.placement.candidates import Search

PROBE_INPUT = "byoc_probe"


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
class SwitchCosts:
    base_ms: float  # a model run's own overhead
    invocation: dict[str, float]  # backend -> cost of a region of it, over the same op on the host
    switch: dict[tuple[str, str], float]  # (from, to) -> cost of handing over between regions


def switch_costs(search: Search) -> SwitchCosts:
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
    return SwitchCosts(base, {HOST: 0.0, **invocation}, switch)
