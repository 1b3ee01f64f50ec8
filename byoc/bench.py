"""End-to-end benchmark: onnxruntime and OpenVINO on the whole model, TVM host only, byoc with
dnnl, byoc with onnxruntime; batch 1, equal thread counts, all in one run.

OpenVINO is optional (`pip install 'byoc[bench]'`); it runs in fp32, as the others do (on CPUs
with bf16 it would otherwise choose bf16). "vs best" is the ratio to the fastest reference. For
every model where a byoc system is slower than the fastest reference, the table is followed by that system's profile: time per region and on
the host, and the host's slowest kernels.

Each system is timed in blocks of consecutive runs (the thread pools of onnxruntime, OpenMP and
TVM spin after a run, and interleaving single runs of different systems makes them fight for the
cores); the blocks alternate in order over several passes, so that drift in the machine's speed
affects every system alike. Latencies are medians over all timed runs. Run as `python -m byoc.bench`, `byoc bench` or `benchmarks/e2e.py`; thread counts must
be fixed before the libraries load, which those entry points do.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

DEFAULT_MODELS = ["resnet18", "resnet50", "mobilenet_v2", "vgg19", "bert_encoder", "ssd_detector"]
THREAD_VARIABLES = ("OMP_NUM_THREADS", "TVM_NUM_THREADS")


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


@dataclass
class ModelResult:
    model: str
    systems: list[SystemResult] = field(default_factory=list)
    breakdowns: dict[str, str] = field(default_factory=dict)  # byoc system slower than the best reference -> its profile


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


def block_medians(runners: dict[str, Callable[[], object]], rounds: int, slow: set[str]) -> dict[str, float]:
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
    return {name: statistics.median(values) * 1e3 for name, values in samples.items()}


def zoo_reference(name: str, threads: int):
    """A zoo model, its seeded inputs, an onnxruntime session on `threads` threads, the
    session's outputs, and the model imported to Relax."""
    import onnxruntime as ort

    import byoc

    model = byoc.models.get(name)
    inputs = byoc.models.sample_inputs(model, seed=0)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return model, inputs, session, session.run(None, inputs), byoc.from_onnx(model)


def benchmark_model(name: str, threads: int, rounds: int, with_tvm: bool) -> ModelResult:
    import tvm
    from tvm import relax

    import byoc

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
    if with_tvm:
        start = time.perf_counter()
        vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
        build_s = time.perf_counter() - start
        tensors = [tvm.runtime.tensor(v) for v in inputs.values()]
        got = vm["main"](*tensors)
        got = [got.numpy()] if isinstance(got, tvm.runtime.Tensor) else [g.numpy() for g in got]
        results["tvm host only"] = SystemResult("tvm host only", 0.0, build_s=build_s, max_abs_error=_max_error(got, expected))
        runners["tvm host only"] = lambda: vm["main"](*tensors)
    for vendor in ("dnnl", "onnxruntime"):
        system = f"byoc + {vendor}"
        start = time.perf_counter()
        partitioned = byoc.partition_for(mod, vendor)
        compiled = byoc.build(partitioned, engines="eager", backend_options={"onnxruntime": {"intra_op_num_threads": threads}})
        build_s = time.perf_counter() - start
        report = byoc.report(partitioned)
        results[system] = SystemResult(
            system,
            0.0,
            build_s=build_s,
            max_abs_error=_max_error(compiled.run(**inputs), expected),
            offload_nodes=report.offload_ratio_nodes,
            offload_macs=report.offload_ratio_macs,
            regions=len(report.regions),
        )
        runners[system] = lambda compiled=compiled: compiled.run(**inputs)
        compiled_models[system] = compiled
    medians = block_medians(runners, rounds, slow={"tvm host only"})
    for system, median in medians.items():
        results[system].median_ms = median
        results[system].ratio_to_onnxruntime = median / medians["onnxruntime"]
    best = min(medians[r] for r in REFERENCES if r in medians)
    breakdowns = {system: compiled.profile(**inputs, repeat=max(10, rounds // 2)).to_table()
                  for system, compiled in compiled_models.items() if medians[system] > best}
    return ModelResult(name, list(results.values()), breakdowns)


def format_table(results: list[ModelResult], threads: int) -> str:
    header = (f"{'model':<14}{'system':<18}{'median ms':>11}{'vs ORT':>8}{'vs best':>9}{'offload ops':>12}{'offload MACs':>13}"
              f"{'regions':>8}{'build s':>9}{'max err':>10}")
    lines = [f"batch 1, {threads} thread(s) for every system", header, "-" * len(header)]
    for result in results:
        best = min(r.median_ms for r in result.systems if r.system in REFERENCES)  # the fastest reference
        for index, r in enumerate(result.systems):
            lines.append(
                f"{result.model if index == 0 else '':<14}{r.system:<18}{r.median_ms:>11.2f}{r.ratio_to_onnxruntime:>7.2f}x"
                f"{r.median_ms / best:>8.2f}x"
                + (f"{r.offload_nodes:>12.1%}{r.offload_macs:>13.1%}{r.regions:>8}" if r.regions is not None else f"{'':>12}{'':>13}{'':>8}")
                + f"{r.build_s:>9.1f}{r.max_abs_error:>10.1e}"
            )
    if not any(r.system == "openvino" for result in results for r in result.systems):
        lines.append("(OpenVINO not installed: pip install 'byoc[bench]' to compare with it too)")
    for result in results:
        for system, table in result.breakdowns.items():
            lines += ["", f"{result.model}, {system}: slower than the fastest reference; where its time goes:", table]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="byoc bench", description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=40, help="timed runs per system (4 for TVM host only)")
    parser.add_argument("--skip-tvm", action="store_true", help="leave out TVM host only (slow: untuned TVM)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    pin_threads(args.threads, "byoc.bench", argv)
    import byoc.models
    from byoc.errors import ByocError

    try:
        for name in args.models:
            byoc.models.describe(name)
    except ByocError as error:
        parser.error(str(error))
    results = []
    for name in args.models:
        print(f"benchmarking {name} ...", file=sys.stderr, flush=True)
        results.append(benchmark_model(name, args.threads, args.rounds, not args.skip_tvm))
    print(format_table(results, args.threads))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "results": [asdict(r) for r in results]}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
