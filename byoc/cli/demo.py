"""`byoc demo`: the main job on an embedded model, end to end.

Builds a zoo model in code, partitions it, compiles it, runs it, checks it against onnxruntime
and compares latency with onnxruntime in the same run.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np
import onnxruntime as ort

from byoc import models as zoo
from byoc.backend.registry import list_backends
from byoc.cli.arguments import at_least
from byoc.flow import partition_for
from byoc.frontend import from_onnx
from byoc.partition import report
from byoc.runtime_metadata.build import build
from byoc.runtime_metadata.model import load
from byoc.timing import spread, time_runs

_PREFERRED_VENDORS = ("dnnl", "onnxruntime", "reference")


def add_parser(commands) -> None:
    parser = commands.add_parser("demo", help="partition, compile, run and check an embedded model")
    parser.add_argument("--model", default="resnet18", choices=zoo.names())
    parser.add_argument("--vendor", default=None, help=f"default: the first available of {', '.join(_PREFERRED_VENDORS)}")
    parser.add_argument("--small", action="store_true", help="use the reduced test-size model")
    parser.add_argument("--repeat", type=at_least(1), default=20, help="timed runs per system")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    vendor = args.vendor or next(v for v in _PREFERRED_VENDORS if v in list_backends())
    threads = os.cpu_count() or 1
    print(f"== {args.model}{' (small)' if args.small else ''} on {vendor}, {threads} thread(s)")
    model = zoo.get(args.model, small=args.small)
    inputs = zoo.sample_inputs(model, seed=0)

    start = time.perf_counter()
    mod = from_onnx(model)
    partitioned = partition_for(mod, vendor)
    partition_s = time.perf_counter() - start
    print(report(partitioned).to_table(max_host_ops=10))

    start = time.perf_counter()
    compiled = build(partitioned, engines="eager")
    build_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{args.model}.byoc")
        compiled.export(path)
        size_mb = os.path.getsize(path) / 2**20
        loaded = load(path, engines="eager")
    outputs = loaded.run(**inputs)

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    expected = session.run(None, inputs)
    print(f"\npartition {partition_s:.2f} s, build {build_s:.2f} s, artifact {size_mb:.1f} MiB (exported and reloaded)")
    ok = True
    for index, (got, want) in enumerate(zip(outputs, expected)):
        if np.issubdtype(want.dtype, np.floating):
            error = float(np.max(np.abs(got - want)))
            bound = 1e-4 * max(1.0, float(np.max(np.abs(want))))
            ok &= error <= bound
            print(f"output {index}: max abs error vs onnxruntime {error:.2e} (tolerance {bound:.1e})")
        else:
            equal = np.array_equal(got, want)
            ok &= equal
            print(f"output {index}: {'identical to' if equal else 'DIFFERENT from'} onnxruntime")

    byoc_ms = spread(time_runs(lambda: loaded.run(**inputs), args.repeat)).median_ms
    ort_ms = spread(time_runs(lambda: session.run(None, inputs), args.repeat)).median_ms
    print(f"\n{'system':<24}{'median ms':>10}{'vs onnxruntime':>16}")
    print(f"{'onnxruntime':<24}{ort_ms:>10.2f}{1.0:>15.2f}x")
    print(f"{'byoc + ' + vendor:<24}{byoc_ms:>10.2f}{byoc_ms / ort_ms:>15.2f}x")
    print("\nnumerics:", "OK" if ok else "MISMATCH")
    return 0 if ok else 1
