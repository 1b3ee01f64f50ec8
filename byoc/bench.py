"""End-to-end benchmark: onnxruntime and OpenVINO on the whole model, TVM host only, and byoc
with each vendor (dnnl and onnxruntime unless --vendors says which); batch 1, equal thread
counts, all in one run.

OpenVINO is optional (`pip install 'byoc[bench]'`); it runs in fp32, as the others do (on CPUs
with bf16 it would otherwise choose bf16). "vs best" is the ratio to the fastest reference. For
every model where a byoc system is slower than the fastest reference, the table is followed by that system's profile: time per region and on
the host, and the host's slowest kernels.

Each system is timed in blocks of consecutive runs (the thread pools of onnxruntime, OpenMP and
TVM spin after a run, and interleaving single runs of different systems makes them fight for the
cores); the blocks alternate in order over several passes, so that drift in the machine's speed
affects every system alike. Latencies are medians over all timed runs, with the 90th percentile
over the median as their spread; `--busy` times everything while another process keeps one core
busy. Run as `python -m byoc.bench`, `byoc bench` or `benchmarks/e2e.py`; thread counts must
be fixed before the libraries load, which those entry points do.

Models are zoo names, `hf:NAME` or `hf:NAME:base` (a `transformers` architecture exported with
torch.onnx, see `byoc.models.exported`), or the path of an ONNX file with static input shapes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_MODELS = ["resnet18", "resnet50", "mobilenet_v2", "vgg19", "bert_encoder", "ssd_detector"]
DEFAULT_VENDORS = ("dnnl", "onnxruntime")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "TVM_NUM_THREADS")
# A busy-core child that outlives a crashed benchmark stops by itself after this long.
BUSY_LIMIT_S = 3600.0


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


REFERENCES = ("onnxruntime", "openvino")


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


PASSES = 4


def median_seconds(fn: Callable[[], object], repeat: int, warmup: int = 1) -> float:
    """Median wall time of `repeat` calls; the untimed warm-up calls pay for lazy set-up (engines, caches, thread pools)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def pin_threads(threads: int, module: str, argv: list[str] | None) -> None:
    """Run `module` again with every library's thread count set to `threads`, unless it is.

    Thread pools read these variables when the libraries load, which has happened by the time
    a command runs: the process starts again with them set.
    """
    if all(os.environ.get(v) == str(threads) for v in THREAD_VARIABLES):
        return
    env = {**os.environ, **{v: str(threads) for v in THREAD_VARIABLES}}
    os.execve(sys.executable, [sys.executable, "-m", module, *(argv if argv is not None else sys.argv[1:])], env)


def block_samples(runners: dict[str, Callable[[], object]], rounds: int, slow: set[str]) -> dict[str, list[float]]:
    """Seconds of every timed run of each system, timed in alternating blocks (see above); about
    `rounds` runs per system, 3 for those in `slow`."""
    samples: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners)
    for index in range(PASSES):
        for name in order if index % 2 == 0 else reversed(order):
            count = max(1, (3 if name in slow else rounds) // PASSES)
            time.sleep(0.2)  # let the previous system's threads stop spinning
            runners[name]()  # warm-up
            for _ in range(count):
                start = time.perf_counter()
                runners[name]()
                samples[name].append(time.perf_counter() - start)
    return samples


def block_medians(runners: dict[str, Callable[[], object]], rounds: int, slow: set[str]) -> dict[str, float]:
    """Milliseconds, the median of each system's `block_samples`."""
    return {name: statistics.median(values) * 1e3 for name, values in block_samples(runners, rounds, slow).items()}


@dataclass(frozen=True)
class Spread:
    median_ms: float
    p90_ms: float

    @property
    def tail(self) -> float:
        """p90 over the median: 1.0 for a system whose every run takes as long."""
        return self.p90_ms / self.median_ms


def spread(samples: Sequence[float]) -> Spread:
    p90 = statistics.quantiles(samples, n=10, method="inclusive")[8] if len(samples) > 1 else samples[0]
    return Spread(statistics.median(samples) * 1e3, p90 * 1e3)


def _spin(deadline: float, parent: int) -> None:
    while time.monotonic() < deadline and os.getppid() == parent:
        for _ in range(100_000):
            pass


@contextlib.contextmanager
def busy_core(enabled: bool = True, limit_s: float = BUSY_LIMIT_S) -> Iterator[None]:
    """Keep one core busy with another process (a tight Python loop) while the block runs: a
    machine shared with other work, where thread pools that spin or pin suffer. The loop also
    stops by itself after `limit_s` or when this process dies."""
    if not enabled:
        yield
        return
    import multiprocessing

    # fork: a child that only loops needs nothing imported again (spawn would import byoc and TVM)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    child = multiprocessing.get_context(method).Process(target=_spin, args=(time.monotonic() + limit_s, os.getpid()), daemon=True)
    child.start()
    try:
        yield
    finally:
        child.terminate()
        child.join(5)


def instruction_set() -> str:
    """The widest vector instruction set of this CPU that oneDNN and onnxruntime choose kernels by."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        flags = []
    return "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "sse"


def _is_path(spec: str) -> bool:
    return spec.endswith(".onnx") or os.sep in spec or os.path.exists(spec)


def _require_static_inputs(spec: str, model) -> None:
    from byoc.errors import DynamicShapeError

    initializers = {init.name for init in model.graph.initializer}
    dynamic = []
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if value.name not in initializers and (not value.type.tensor_type.HasField("shape") or any(d.dim_value <= 0 for d in dims)):
            dynamic.append(f"{value.name} [{', '.join(str(d.dim_value) if d.dim_value > 0 else d.dim_param or '?' for d in dims)}]")
    if dynamic:
        raise DynamicShapeError(
            f"{spec}: input(s) with dynamic dimensions: {'; '.join(dynamic)}. byoc bench times static shapes: export the model "
            "with static shapes, or fix each dimension first, e.g. python -m onnxruntime.tools.make_dynamic_shape_fixed "
            "--dim_param batch --dim_value 1 in.onnx out.onnx")


def check_model(spec: str) -> None:
    """Raise the error `load_model(spec)` would, without building or exporting anything."""
    import onnx

    import byoc.models
    from byoc.errors import ModelLoadError

    if spec.startswith("hf:"):
        from byoc.models import exported

        exported.parse_spec(spec)
    elif _is_path(spec):
        if not os.path.isfile(spec):
            raise ModelLoadError(f"{spec}: no such ONNX file")
        _require_static_inputs(spec, onnx.load(spec, load_external_data=False))
    else:
        byoc.models.describe(spec)


def load_model(spec: str):
    """The ONNX model a `--models` entry names, and its seeded sample inputs."""
    import onnx

    import byoc.models

    if spec.startswith("hf:"):
        from byoc.models import exported

        model = exported.export(*exported.parse_spec(spec))
    elif _is_path(spec):
        model = onnx.load(spec)
        _require_static_inputs(spec, model)
    else:
        model = byoc.models.get(spec)
    return model, byoc.models.sample_inputs(model)


def model_label(spec: str) -> str:
    return os.path.basename(spec) if not spec.startswith("hf:") and _is_path(spec) else spec


def zoo_reference(name: str, threads: int):
    """A model (zoo name, `hf:NAME[:SIZE]` or ONNX path), its seeded inputs, an onnxruntime
    session on `threads` threads, the session's outputs, and the model imported to Relax."""
    import onnxruntime as ort

    import byoc

    model, inputs = load_model(name)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return model, inputs, session, session.run(None, inputs), byoc.from_onnx(model)


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
        samples = block_samples(systems.runners, rounds, systems.slow)
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


def describe_machine(threads: int, busy: bool) -> str:
    return (f"batch 1, {threads} thread(s) for every system, {instruction_set()}"
            + (", one core kept busy by another process" if busy else ""))


def format_table(results: list[ModelResult], threads: int, busy: bool = False) -> str:
    width = max([14, *(len(result.model) + 2 for result in results)])
    system_width = max([18, *(len(r.system) + 1 for result in results for r in result.systems)])
    header = (f"{'model':<{width}}{'system':<{system_width}}{'median ms':>11}{'vs ORT':>8}{'vs best':>9}{'p90/med':>9}{'offload ops':>12}"
              f"{'offload MACs':>13}{'regions':>8}{'build s':>9}{'max err':>10}")
    lines = [describe_machine(threads, busy), header, "-" * len(header)]
    for result in results:
        best = min(r.median_ms for r in result.systems if r.system in REFERENCES)  # the fastest reference
        for index, r in enumerate(result.systems):
            lines.append(
                f"{result.model if index == 0 else '':<{width}}{r.system:<{system_width}}{r.median_ms:>11.2f}{r.ratio_to_onnxruntime:>7.2f}x"
                f"{r.median_ms / best:>8.2f}x{r.p90_ms / r.median_ms:>9.2f}"
                + (f"{r.offload_nodes:>12.1%}{r.offload_macs:>13.1%}{r.regions:>8}" if r.regions is not None else f"{'':>12}{'':>13}{'':>8}")
                + f"{r.build_s:>9.1f}{r.max_abs_error:>10.1e}"
            )
    if not any(r.system == "openvino" for result in results for r in result.systems):
        lines.append("(OpenVINO not installed: pip install 'byoc[bench]' to compare with it too)")
    for result in results:
        for system, error in result.failures.items():
            lines.append(f"{result.model}, {system}: failed: {error}")
    for result in results:
        for system, table in result.breakdowns.items():
            lines += ["", f"{result.model}, {system}: slower than the fastest reference; where its time goes:", table]
    return "\n".join(lines)


def check_vendors(vendors: Sequence[str]) -> None:
    """An unknown vendor, or one that cannot build here, is an error naming the known ones or what is missing."""
    from byoc.backend.registry import get_backend
    from byoc.errors import BuildError

    for vendor in vendors:
        reason = get_backend(vendor).missing_part()
        if reason:
            raise BuildError(f"vendor {vendor!r} cannot build on this machine: {reason}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="byoc bench", description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS,
                        help="zoo names, hf:NAME[:base] (exported transformers architectures) or .onnx paths")
    parser.add_argument("--vendors", nargs="+", default=list(DEFAULT_VENDORS), help="byoc systems to time (any registered vendor)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=40, help="timed runs per system (4 for TVM host only)")
    parser.add_argument("--skip-tvm", action="store_true", help="leave out TVM host only (slow: untuned TVM)")
    parser.add_argument("--busy", action="store_true", help="time while another process keeps one core busy")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    pin_threads(args.threads, "byoc.bench", argv)
    from byoc.errors import ByocError

    try:
        for name in args.models:
            check_model(name)
        check_vendors(args.vendors)
    except ByocError as error:
        parser.error(str(error))
    results = []
    for name in args.models:
        print(f"benchmarking {name} ...", file=sys.stderr, flush=True)
        results.append(benchmark_model(name, args.threads, args.rounds, not args.skip_tvm, args.vendors, args.busy))
    print(format_table(results, args.threads, args.busy))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "instruction_set": instruction_set(), "busy": args.busy,
                       "results": [asdict(r) for r in results]}, f, indent=2)
    return 0


if __name__ == "__main__":  # where `byoc bench` starts again with its thread counts set
    from byoc.cli import main as cli_main

    sys.exit(cli_main(["bench", *sys.argv[1:]]))
