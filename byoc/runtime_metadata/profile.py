"""Where the time goes (paper figures 7 and 8): per region and for the host, data transfer,
kernel invocation, execution, and one-time engine initialisation.

The VM's instrumentation hook times every call the host makes; inside a Python-dispatched region
byoc times the wrapping of the host's buffers for the engine (transfer) and the engine itself
(execution); invocation is what remains of the region's time as the VM sees it (the call through
the FFI and the dispatch). A C region runs inside the host library: its whole time counts as
execution. Host time is the rest of each run. Times are medians over runs, in milliseconds.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from byoc.runtime_metadata.artifact_types import RegionArtifact
from byoc.runtime_metadata.dispatch import RegionRuntime, RegionTimes


@dataclass
class ProfileRow:
    part: str  # a region symbol, or "host"
    backend: str
    calls_per_run: float
    transfer_ms: float
    invocation_ms: float
    execution_ms: float
    init_ms: float

    @property
    def total_ms(self) -> float:
        return self.transfer_ms + self.invocation_ms + self.execution_ms


HOST_KERNELS_SHOWN = 8
HOST_KERNEL_SHOWN_MS = 0.01


@dataclass
class HostKernel:
    name: str  # the host function the VM called: a fused TVM kernel or a VM builtin
    calls_per_run: float
    ms: float  # median per run


@dataclass
class ProfileReport:
    rows: list[ProfileRow]
    runs: int
    median_run_ms: float
    host_kernels: list[HostKernel] = field(default_factory=list)  # slowest first
    # What the model keeps for the shapes it has met, and how it allocates (a server's memory)
    held: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"runs": self.runs, "median_run_ms": self.median_run_ms, "rows": [{**asdict(r), "total_ms": r.total_ms} for r in self.rows],
                "host_kernels": [asdict(k) for k in self.host_kernels], "held": self.held}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def to_table(self) -> str:
        width = max([16, *(len(r.part) + 2 for r in self.rows)])
        header = f"{'part':<{width}}{'backend':<14}{'calls':>6}{'transfer':>11}{'invoke':>10}{'execute':>11}{'total':>10}{'init':>11}"
        lines = [f"median of {self.runs} run(s): {self.median_run_ms:.3f} ms per run (times in ms per run)", header, "-" * len(header)]
        for r in self.rows:
            lines.append(
                f"{r.part:<{width}}{r.backend:<14}{r.calls_per_run:>6.0f}{r.transfer_ms:>11.3f}{r.invocation_ms:>10.3f}"
                f"{r.execution_ms:>11.3f}{r.total_ms:>10.3f}{r.init_ms:>11.1f}"
            )
        shown = [k for k in self.host_kernels if k.ms >= HOST_KERNEL_SHOWN_MS][:HOST_KERNELS_SHOWN]
        if shown:
            lines.append("slowest host kernels (ms per run):")
            lines.extend(f"  {_shortened(k.name, 44):<44}{k.calls_per_run:>6.0f}{k.ms:>10.3f}" for k in shown)
        if self.held:
            lines.append("held for the shapes met:")
            lines.extend(f"  {what}: {amount}" for what, amount in self.held.items())
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_table()


def _shortened(name: str, width: int) -> str:
    """A fused kernel's name lists every op in it: keep its start."""
    return name if len(name) <= width else name[: width - 3] + "..."


def profile_model(vm: VirtualMachine, artifacts: Sequence[RegionArtifact], regions: Mapping[str, RegionRuntime],
                  arrays: list[np.ndarray], repeat: int, specialised: Mapping[str, Any] | None = None) -> ProfileReport:
    """Profile `repeat` runs of `vm` on `arrays`; `regions` are the Python-dispatched regions
    (engines created) among `artifacts`. `specialised` are the shape-specialised regions of a
    model with dynamic dimensions (`byoc.runtime_metadata.shapes.SpecialisedRuntime`): the host
    calls each by the region's name, and its variants (among `artifacts`) do the work, so the
    region's row sums its variants' times."""
    if repeat < 1:
        raise ValueError("repeat must be at least 1")
    specialised = dict(specialised or {})
    inputs = [tvm.runtime.tensor(a) for a in arrays]
    symbols = {a.symbol for a in artifacts} | set(specialised)
    per_run: list[dict[str, float]] = []
    region_runs: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    run_times: list[float] = []
    stack: list[tuple[str, float]] = []
    seen: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)

    def instrument(func, symbol, before_run, ret_value, *args):
        now = time.perf_counter()
        if before_run:
            stack.append((symbol, now))
        else:
            name, start = stack.pop()
            seen[name] += now - start
            calls[name] += 1
        return 0

    vm["main"](*inputs)  # warm up: a shape-specialised region makes its variant for these shapes
    timed = {**{symbol: [region] for symbol, region in regions.items()},
             **{symbol: [v for v in (*runtime.ahead.values(), *runtime.made.values()) if isinstance(v, RegionRuntime)]
                for symbol, runtime in specialised.items()}}
    vm.set_instrument(instrument)
    # Runs with the hook set but before counting: the first instrumented run pays for setup.
    vm["main"](*inputs)
    calls.clear()
    try:
        for _ in range(repeat):
            seen.clear()
            for runtimes in timed.values():
                for region in runtimes:
                    region.times = RegionTimes()
            start = time.perf_counter()
            vm["main"](*inputs)
            run_times.append(time.perf_counter() - start)
            per_run.append(dict(seen))
            for symbol, runtimes in timed.items():
                region_runs[symbol].append((sum(r.times.transfer for r in runtimes), sum(r.times.execution for r in runtimes),
                                            sum(r.times.calls for r in runtimes)))
    finally:
        vm.set_instrument(lambda *args: 0)
        for runtimes in timed.values():
            for region in runtimes:
                region.times = None

    def median_ms(values) -> float:
        return statistics.median(values) * 1e3 if values else 0.0

    parts = [(a.symbol, a.backend) for a in artifacts
             if a.symbol not in specialised and not any(r.region.has_variant(a.symbol) for r in specialised.values())]
    parts += [(symbol, runtime.region.backend) for symbol, runtime in specialised.items()]
    rows = []
    for symbol, backend in parts:
        in_vm = median_ms([run.get(symbol, 0.0) for run in per_run])
        calls_per_run = calls[symbol] / repeat
        if not timed.get(symbol):  # C: linked into the host library, or a C variant
            rows.append(ProfileRow(symbol, backend, calls_per_run, 0.0, 0.0, in_vm, 0.0))
            continue
        transfer = median_ms([t for t, _, _ in region_runs[symbol]])
        execution = median_ms([e for _, e, _ in region_runs[symbol]])
        init_ms = sum(r.record.seconds for r in timed[symbol] if r.record) * 1e3
        invocation = max(0.0, in_vm - transfer - execution)
        rows.append(ProfileRow(symbol, backend, calls_per_run, transfer, invocation, execution, init_ms))
    total = median_ms(run_times)
    regions_ms = sum(r.total_ms for r in rows)
    rows.append(ProfileRow("host", "(host)", 1, 0.0, 0.0, max(0.0, total - regions_ms), 0.0))
    kernels = [HostKernel(name, calls[name] / repeat, median_ms([run.get(name, 0.0) for run in per_run]))
               for name in calls if name not in symbols]
    return ProfileReport(rows, repeat, total, sorted(kernels, key=lambda k: -k.ms))
