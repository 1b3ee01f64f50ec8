"""One artifact for many shapes: the exported suite with dynamic axes, compiled once, against the
same file compiled for each shape alone, and onnxruntime on the file.

Each architecture of the exported suite (`byoc.models.exported.SUITE`) is exported once with
dynamic axes. byoc compiles it once with `dims=` and every timed shape in `shape_buckets`, so
nothing compiles at run time; then, for each shape, the same file is compiled for that shape
alone (`shapes=`). Both, and onnxruntime, run in one process, timed against each other in
alternating blocks (see `byoc.timing.time_blocks`). Text models run batch 1, 4 and 16 at
sequence lengths 8, 32, 128 and 512; image and audio models run batches 1, 4 and 16.

    python -m benchmarks.shapes [--models bert,vit] [--size tiny] [--vendor dnnl] [--runs 20] [--threads 2]

"dynamic / static" is the ratio the target is stated in (within 1.15x); the error is the largest
absolute difference from onnxruntime over the outputs, relative to the output's largest value.
"first run, not built ahead" is the first run at that shape of the same file built for the
default bucket only (each range's opt): what a shape outside `shape_buckets` costs once, where the
vendor generates and compiles per shape, or only a run where it takes symbolic shapes. Last, the
timed shapes come as a server meets them: 48 requests in a seeded order, each shape met before,
the dynamic artifact against onnxruntime (ms a request).
Needs the torch extra (`pip install 'byoc[torch]'`).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

from byoc.benchmarking.table import describe_machine
from byoc.timing import pin_threads, spread, time_blocks, time_runs

BATCHES = (1, 4, 16)
SEQUENCES = (8, 32, 128, 512)
TEXT_LIMIT = 512
MIXED_REQUESTS = 48  # requests of the grid's shapes in a seeded order, as a server meets them
# A shape's runs are timed over at least this long per system, up to MAX_RUNS: sub-millisecond
# shapes timed over 20 runs (blocks of 5 after an idle) gave ratios that moved by 20% between
# two runs of the benchmark, either way.
MIN_TIMED_S = 0.4
MAX_RUNS = 1000


@dataclass
class Row:
    shape: str
    dynamic_ms: float
    dynamic_p90_ms: float
    static_ms: float
    static_p90_ms: float
    onnxruntime_ms: float
    error: float
    static_build_s: float
    first_run_ms: float


def _grid(model) -> list[dict[str, int]]:
    text = any(d.dim_param == "sequence" for value in model.graph.input for d in value.type.tensor_type.shape.dim)
    return [{"batch": b, "sequence": s} for b in BATCHES for s in SEQUENCES] if text else [{"batch": b} for b in BATCHES]


def _feeds(model, example: dict[str, np.ndarray], values: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    """Inputs at `values` of the named dimensions: tokens drawn like the example's."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        array = example[value.name]
        shape = tuple(values.get(d.dim_param, d.dim_value) for d in value.type.tensor_type.shape.dim)
        if array.dtype == np.int64 and array.max() > 1:  # token ids
            feeds[value.name] = rng.integers(0, int(array.max()) + 1, shape).astype(np.int64)
        elif array.dtype == np.int64:  # a mask
            feeds[value.name] = np.ones(shape, dtype=np.int64)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(array.dtype)
    return feeds


def _error(got, want) -> float:
    return max(float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-30)) for g, w in zip(got, want))


def mixed(feeds: list[dict[str, np.ndarray]], dynamic, session, runs: int) -> tuple[float, float]:
    """Milliseconds a request, the dynamic artifact's and onnxruntime's, over `MIXED_REQUESTS`
    requests of these shapes (each met before) in a seeded order: a shape differs from the last
    at most requests, where the per-shape timings repeat one shape."""
    order = np.random.default_rng(0).integers(0, len(feeds), MIXED_REQUESTS)

    def serve(run) -> None:
        for index in order:
            run(feeds[index])

    runners = {"dynamic": lambda: serve(dynamic.run), "onnxruntime": lambda: serve(lambda f: session.run(None, f))}
    timings = {system: spread(samples) for system, samples in time_blocks(runners, max(4, runs // 4)).items()}
    return timings["dynamic"].median_ms / len(order), timings["onnxruntime"].median_ms / len(order)


def _runs_for(run, runs: int) -> int:
    """At least `runs`, and as many as fill `MIN_TIMED_S` (at most `MAX_RUNS`)."""
    each = statistics.median(time_runs(run, 3, warmup=2))
    return max(runs, min(MAX_RUNS, math.ceil(MIN_TIMED_S / each)))


def benchmark(name: str, size: str, vendor: str, threads: int, runs: int) -> tuple[list[Row], float, str, tuple[float, float]]:
    import onnxruntime as ort

    import byoc
    from byoc.models import exported

    path = exported.path(name, size, dynamic=True)
    model = exported.export(name, size, dynamic=True)
    example = exported.sample_inputs(model)
    grid = _grid(model)
    dims = {"batch": (1, max(BATCHES))}
    if "sequence" in grid[0]:
        dims["sequence"] = (1, TEXT_LIMIT)
    options = {"onnxruntime": {"intra_op_num_threads": threads}} if vendor == "onnxruntime" else None
    start = time.perf_counter()
    dynamic = byoc.build(byoc.partition_for(byoc.from_onnx(path, dims=dims), vendor), shape_buckets=grid, backend_options=options)
    dynamic_build_s = time.perf_counter() - start
    # The same file built for the default bucket only: every other shape's first run pays for
    # what is made on first use (code generated and compiled, engines built), if anything.
    on_demand = byoc.build(byoc.partition_for(byoc.from_onnx(path, dims=dims), vendor), backend_options=options)
    session_options = ort.SessionOptions()
    session_options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), session_options, providers=["CPUExecutionProvider"])
    rows, every_feeds = [], []
    for index, values in enumerate(grid):
        feeds = _feeds(model, example, values, index)
        every_feeds.append(feeds)
        shapes = {k: list(v.shape) for k, v in feeds.items()}
        start = time.perf_counter()
        static = byoc.build(byoc.partition_for(byoc.from_onnx(path, shapes=shapes), vendor), backend_options=options)
        static_build_s = time.perf_counter() - start
        want = session.run(None, feeds)
        start = time.perf_counter()
        on_demand.run(feeds)
        first_run_ms = (time.perf_counter() - start) * 1e3
        error = _error(dynamic.run(feeds), want)
        runners = {"dynamic": lambda feeds=feeds: dynamic.run(feeds), "static": lambda feeds=feeds, static=static: static.run(feeds),
                   "onnxruntime": lambda feeds=feeds: session.run(None, feeds)}
        timings = {system: spread(samples) for system, samples in time_blocks(runners, _runs_for(runners["static"], runs)).items()}
        label = " x ".join(str(v) for v in values.values())
        rows.append(Row(label, timings["dynamic"].median_ms, timings["dynamic"].p90_ms, timings["static"].median_ms,
                        timings["static"].p90_ms, timings["onnxruntime"].median_ms, error, static_build_s, first_run_ms))
        print(f"  {name} {label}: dynamic {rows[-1].dynamic_ms:.2f} ms, static {rows[-1].static_ms:.2f} ms", file=sys.stderr,
              flush=True)
    built_here = [r["built_here"] for r in dynamic.inspect()["shape_specialised"].values()]
    compiled_at_run_time = "none" if not any(built_here) else ", ".join(k for keys in built_here for k in keys)
    return rows, dynamic_build_s, compiled_at_run_time, mixed(every_feeds, dynamic, session, runs)


def markdown(name: str, size: str, vendor: str, rows: list[Row], build_s: float, compiled_at_run_time: str,
             mixed_ms: tuple[float, float]) -> str:
    shape = "batch x sequence" if " x " in rows[0].shape else "batch"
    lines = [f"### {name} ({size}), byoc + {vendor}", "",
             f"| {shape} | dynamic ms (p90) | static ms (p90) | dynamic / static | onnxruntime ms | error | static build s "
             "| first run, not built ahead, ms |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r.shape} | {r.dynamic_ms:.2f} ({r.dynamic_p90_ms:.2f}) | {r.static_ms:.2f} ({r.static_p90_ms:.2f}) | "
                     f"{r.dynamic_ms / r.static_ms:.2f}x | {r.onnxruntime_ms:.2f} | {r.error:.1e} | {r.static_build_s:.1f} | "
                     f"{r.first_run_ms:.1f} |")
    ratios = [r.dynamic_ms / r.static_ms for r in rows]
    lines += ["", f"One artifact for {len(rows)} shapes, built in {build_s:.1f} s; dynamic / static: median "
              f"{float(np.median(ratios)):.2f}x, worst {max(ratios):.2f}x; regions compiled at run time: {compiled_at_run_time}.",
              f"Requests of these shapes in a mixed order ({MIXED_REQUESTS}, seeded): {mixed_ms[0]:.2f} ms a request, onnxruntime "
              f"{mixed_ms[1]:.2f} ({mixed_ms[0] / mixed_ms[1]:.2f}x).", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from byoc.models import exported

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(exported.SUITE), help="comma-separated architectures (default: the suite)")
    parser.add_argument("--size", default="tiny", choices=exported.SIZES)
    parser.add_argument("--vendor", default="dnnl")
    parser.add_argument("--runs", type=int, default=20, help="timed runs per system and shape at least (default: 20; more where they take under 0.4 s)")
    parser.add_argument("--threads", type=int, default=2, help="threads for every system (default: 2)")
    args = parser.parse_args(argv)
    missing = exported.available()
    if missing:
        print(f"benchmarks.shapes needs the torch extra: {missing}", file=sys.stderr)
        return 2
    pin_threads(args.threads, "benchmarks.shapes", argv)
    print(f"Dynamic shapes: {describe_machine(args.threads, busy=False)}\n")
    for name in args.models.split(","):
        rows, build_s, compiled, mixed_ms = benchmark(name, args.size, args.vendor, args.threads, args.runs)
        print(markdown(name, args.size, args.vendor, rows, build_s, compiled, mixed_ms), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
