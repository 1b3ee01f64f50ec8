"""Memory under a server's load: one artifact called at random shapes, against onnxruntime.

An architecture of the exported suite is exported with dynamic axes and compiled once with the
ranges given (`--dims`); then it is called `--calls` times at shapes drawn uniformly from those
ranges, seeded; every 50th call's inputs and outputs are saved and checked against onnxruntime
afterwards, in another process. The resident memory the process gained over its first call is
read as it goes. onnxruntime on the same file takes the same calls in a process of its own, so
that neither counts the other's memory.

    python -m benchmarks.shape_memory [--model bert] [--size tiny] [--vendor dnnl] [--calls 3000]
        [--dims batch=1:16,sequence=1:128] [--threads 2]

Needs the torch extra (`pip install 'byoc[torch]'`) to export the model once; the export is
cached.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

CHECK_EVERY = 50
ROWS = 5  # memory read this many times over the calls


def _resident_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _feeds(model, dims: dict[str, tuple[int, int]], rng: np.random.Generator) -> dict[str, np.ndarray]:
    values = {name: int(rng.integers(low, high + 1)) for name, (low, high) in dims.items()}
    feeds = {}
    for value in model.graph.input:
        shape = [values[d.dim_param] if d.dim_param else d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = (rng.integers(0, 100, shape, dtype=np.int64) if "ids" in value.name
                             else np.ones(shape, np.int64))
    return feeds


def load(system: str, path: str, vendor: str, dims: dict[str, tuple[int, int]], calls: int, threads: int,
         checks: str | None = None) -> list[dict]:
    """One system's run, in this process: memory gained and time taken, at ROWS points. Every
    CHECK_EVERY calls the inputs and outputs are written under `checks`, for the parent to
    compare with onnxruntime (a session here would add its own memory to byoc's)."""
    import onnx

    model = onnx.load(path)
    if system == "onnxruntime":
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        run = lambda feeds: session.run(None, feeds)  # noqa: E731
    else:
        import byoc

        compiled = byoc.build(byoc.partition_for(byoc.from_onnx(path, dims=dims), vendor))
        run = lambda feeds: compiled.run(**feeds)  # noqa: E731
    rng = np.random.default_rng(0)
    run(_feeds(model, {name: (low, low) for name, (low, _) in dims.items()}, rng))
    base, start, rows = _resident_mib(), time.perf_counter(), []
    for call in range(1, calls + 1):
        feeds = _feeds(model, dims, rng)
        got = run(feeds)
        if checks is not None and call % CHECK_EVERY == 0:
            np.savez(os.path.join(checks, f"{call}.npz"), **{f"in_{k}": v for k, v in feeds.items()},
                     **{f"out_{i}": v for i, v in enumerate(got)})
        if call % max(1, calls // ROWS) == 0:
            rows.append({"calls": call, "mib": _resident_mib() - base, "s": time.perf_counter() - start})
    return rows


def _worst_error(path: str, checks: str) -> float:
    """The largest difference from onnxruntime over the checked calls, relative to each output's
    largest value."""
    import onnxruntime as ort

    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    worst = 0.0
    for name in os.listdir(checks):
        with np.load(os.path.join(checks, name)) as saved:
            feeds = {k[3:]: saved[k] for k in saved.files if k.startswith("in_")}
            got = [saved[f"out_{i}"] for i in range(sum(k.startswith("out_") for k in saved.files))]
        want = session.run(None, feeds)
        worst = max(worst, *(float(np.abs(g - w).max() / (np.abs(w).max() or 1.0)) for g, w in zip(got, want)))
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="bert")
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--vendor", default="dnnl")
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--dims", default="batch=1:16,sequence=1:128", help="NAME=LOW:HIGH, comma-separated")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a system's run, in the process the parent started
    parser.add_argument("--checks", help=argparse.SUPPRESS)  # where that run writes the calls to check
    args = parser.parse_args(argv)
    dims = {name: tuple(int(v) for v in span.split(":")) for name, span in (item.split("=") for item in args.dims.split(","))}
    if args.one:
        path, system = args.one.split("::")
        print(json.dumps(load(system, path, args.vendor, dims, args.calls, args.threads, args.checks)))
        return 0

    from byoc.benchmarking.table import describe_machine
    from byoc.models import exported

    missing = exported.available()
    if missing:
        print(f"benchmarks.shape_memory needs the torch extra: {missing}", file=sys.stderr)
        return 2
    path = str(exported.path(args.model, args.size, dynamic=True))
    print(f"Memory at random shapes: {args.model} ({args.size}), {args.dims}, {args.calls} calls; "
          f"{describe_machine(args.threads, busy=False)}\n")
    environment = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "BYOC_NUM_THREADS": str(args.threads)}
    results = {}
    with tempfile.TemporaryDirectory() as checks:
        for system in (f"byoc + {args.vendor}", "onnxruntime"):
            command = [sys.executable, "-m", "benchmarks.shape_memory", "--one", f"{path}::{system}", "--vendor", args.vendor,
                       "--calls", str(args.calls), "--dims", args.dims, "--threads", str(args.threads)]
            command += ["--checks", checks] if system != "onnxruntime" else []
            done = subprocess.run(command, capture_output=True, text=True, env=environment, check=True)
            results[system] = json.loads(done.stdout.strip().splitlines()[-1])
        worst = _worst_error(path, checks)
    systems = list(results)
    print("| calls | " + " | ".join(f"{s}: memory gained" for s in systems) + " | ratio | "
          + " | ".join(f"{s}: s" for s in systems) + " |")
    print("| ---: |" + " ---: |" * (2 * len(systems) + 1))
    for mine, theirs in zip(*results.values()):
        ratio = mine["mib"] / theirs["mib"] if theirs["mib"] > 0 else float("inf")
        print(f"| {mine['calls']:,} | +{mine['mib']:.0f} MiB | +{theirs['mib']:.0f} MiB | {ratio:.1f}x | {mine['s']:.0f} | "
              f"{theirs['s']:.0f} |")
    print(f"\nbyoc's largest difference from onnxruntime on every {CHECK_EVERY}th call, relative to the output's largest "
          f"value: {worst:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
