"""The systems of one comparison: onnxruntime and OpenVINO on the whole model, TVM host only, and
byoc with each vendor; built, checked against onnxruntime and timed against each other."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from byoc.benchmarking.models import model_label, zoo_reference
from byoc.timing import Spread, busy_core, spread, time_blocks

DEFAULT_VENDORS = ("dnnl", "onnxruntime")
REFERENCES = ("onnxruntime", "openvino")


@dataclass
class SystemResult:
    system: str
    median_ms: float
    ratio_to_onnxruntime: float = 1.0
    build_s: float = 0.0
    max_abs_error: float = 0.0
    offload_nodes: float | None = None
    offload_macs: float | None = None
    regions: int | None = None
    p90_ms: float = 0.0


@dataclass
class ModelResult:
    model: str
    systems: list[SystemResult] = field(default_factory=list)
    breakdowns: dict[str, str] = field(default_factory=dict)  # byoc system slower than the best reference -> its profile
    failures: dict[str, str] = field(default_factory=dict)  # byoc system that did not build or run -> the error


def _max_error(got, want) -> float:
    """The largest absolute difference; infinite where an output's shape differs."""
    import numpy as np

    errors = [float("inf") if g.shape != w.shape else float(np.max(np.abs(g.astype(np.float64) - w))) if g.size else 0.0
              for g, w in zip(got, want)]
    return max(errors, default=0.0)


def openvino_runner(model, threads: int, inputs: dict) -> Callable[[], list] | None:
    """A function running `model` on OpenVINO's CPU plugin in fp32 with `threads` threads, or
    None when OpenVINO is not installed."""
    try:
        import openvino as ov
    except ImportError:
        return None
    import tempfile

    core = ov.Core()
    # fp32 as every other system (on CPUs with bf16 OpenVINO would choose bf16), and threads
    # left unpinned as every other system's are.
    with tempfile.TemporaryDirectory() as tmp:  # OpenVINO reads ONNX from a file
        path = os.path.join(tmp, "model.onnx")
        with open(path, "wb") as f:
            f.write(model.SerializeToString())
        compiled = core.compile_model(core.read_model(path), "CPU", {
            "INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32",
            "ENABLE_CPU_PINNING": False,
        })
    request = compiled.create_infer_request()

    def run() -> list:
        request.infer(inputs)
        return [request.get_output_tensor(i).data.copy() for i in range(len(compiled.outputs))]

    return run


@dataclass
class Systems:
    """The systems of one comparison, built and checked against onnxruntime, ready to time."""

    model: str
    inputs: dict
    runners: dict[str, Callable[[], object]]
    results: dict[str, SystemResult]
    compiled: dict[str, Any]  # byoc system -> its CompiledModel, for the breakdowns
    failures: dict[str, str] = field(default_factory=dict)
    slow: set[str] = field(default_factory=set)


def prepare_systems(name: str, threads: int, with_tvm: bool, vendors: Sequence[str] = DEFAULT_VENDORS) -> Systems:
    import tvm
    from tvm import relax

    import byoc
    from byoc.errors import ByocError, one_line

    model, inputs, session, expected, mod = zoo_reference(name, threads)

    runners: dict[str, Callable[[], object]] = {"onnxruntime": lambda: session.run(None, inputs)}
    results = {"onnxruntime": SystemResult("onnxruntime", 0.0)}
    openvino = openvino_runner(model, threads, inputs)
    if openvino is not None:
        start = time.perf_counter()
        got = openvino()
        results["openvino"] = SystemResult("openvino", 0.0, build_s=time.perf_counter() - start, max_abs_error=_max_error(got, expected))
        runners["openvino"] = openvino
    compiled_models = {}
    failures = {}
    if with_tvm:
        start = time.perf_counter()
        vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
        build_s = time.perf_counter() - start
        tensors = [tvm.runtime.tensor(v) for v in inputs.values()]
        got = vm["main"](*tensors)
        got = [got.numpy()] if isinstance(got, tvm.runtime.Tensor) else [g.numpy() for g in got]
        results["tvm host only"] = SystemResult("tvm host only", 0.0, build_s=build_s, max_abs_error=_max_error(got, expected))
        runners["tvm host only"] = lambda: vm["main"](*tensors)
    for vendor in vendors:
        system = f"byoc + {vendor}"
        start = time.perf_counter()
        # A model from outside may hit what a vendor cannot do yet: that system is reported, the
        # others are still timed.
        try:
            partitioned = byoc.partition_for(mod, vendor)
            compiled = byoc.build(partitioned, engines="eager", backend_options={"onnxruntime": {"intra_op_num_threads": threads}})
            got = compiled.run(**inputs)
        except ByocError as error:
            failures[system] = one_line(error)
            continue
        build_s = time.perf_counter() - start
        report = byoc.report(partitioned)
        results[system] = SystemResult(
            system,
            0.0,
            build_s=build_s,
            max_abs_error=_max_error(got, expected),
            offload_nodes=report.offload_ratio_nodes,
            offload_macs=report.offload_ratio_macs,
            regions=len(report.regions),
        )
        runners[system] = lambda compiled=compiled: compiled.run(**inputs)
        compiled_models[system] = compiled
    return Systems(model_label(name), inputs, runners, results, compiled_models, failures, slow={"tvm host only"})


def time_systems(systems: Systems, rounds: int, busy: bool = False) -> dict[str, Spread]:
    """Each system's latency over `rounds` timed runs, on a quiet machine or with one core busy."""
    with busy_core(busy):
        samples = time_blocks(systems.runners, rounds, systems.slow)
    return {system: spread(values) for system, values in samples.items()}


def benchmark_model(name: str, threads: int, rounds: int, with_tvm: bool, vendors: Sequence[str] = DEFAULT_VENDORS,
                    busy: bool = False) -> ModelResult:
    systems = prepare_systems(name, threads, with_tvm, vendors)
    spreads = time_systems(systems, rounds, busy)
    for system, timing in spreads.items():
        result = systems.results[system]
        result.median_ms, result.p90_ms = timing.median_ms, timing.p90_ms
        result.ratio_to_onnxruntime = timing.median_ms / spreads["onnxruntime"].median_ms
    best = min(spreads[r].median_ms for r in REFERENCES if r in spreads)
    breakdowns = {system: compiled.profile(**systems.inputs, repeat=max(10, rounds // 2)).to_table()
                  for system, compiled in systems.compiled.items() if spreads[system].median_ms > best}
    return ModelResult(systems.model, list(systems.results.values()), breakdowns, systems.failures)


def check_vendors(vendors: Sequence[str]) -> None:
    """An unknown vendor, or one that cannot build here, is an error naming the known ones or what is missing."""
    from byoc.backend.registry import get_backend
    from byoc.errors import BuildError

    for vendor in vendors:
        reason = get_backend(vendor).missing_part()
        if reason:
            raise BuildError(f"vendor {vendor!r} cannot build on this machine: {reason}")
