"""Runtime overhead per region call, and artifact load time with a warm and a cold engine cache.

Overhead: a chain of K single-op regions whose engine does one tiny element-wise op. The time
per added region (slope between K=1 and K=64, so the VM's fixed cost per run drops out) minus
the engine's own time, called directly, is what byoc's runtime adds per region call: the VM's
call instruction, the FFI, the dispatch to the engine and the wrapping of buffers.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

sys.path.insert(0, os.path.dirname(__file__))

import byoc  # noqa: E402
from byoc.codegen_json import JsonRuntime  # noqa: E402
from byoc.timing import spread, time_runs  # noqa: E402


class ReluEngine:
    def run(self, inputs, outputs):
        np.maximum(inputs[0], 0, out=outputs[0])


def _chain(count: int, width: int) -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((1, width), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            value = x
            for index in range(count):
                value = builder.emit(R.nn.relu(value), f"relu{index}")
            out = builder.emit_output(value)
        builder.emit_func_output(out)
    return builder.get()


def _median_us(fn, repeat: int) -> float:
    return spread(time_runs(fn, repeat, warmup=10)).median_ms * 1e3


def region_overhead(repeat: int, width: int = 64) -> dict[str, float]:
    backend = byoc.Backend(
        name="overhead_probe", codegen=JsonRuntime(build_engine=lambda g, c, o: ReluEngine(), version="1")
    )
    backend.supports("relax.nn.relu")
    byoc.register_backend(backend, override=True)
    times = {}
    for count in (1, 64):
        compiled = byoc.build(byoc.partition_for(_chain(count, width), "overhead_probe", max_ops_per_region=1), engines="eager")
        vm = compiled.virtual_machine()
        tensor = tvm.runtime.tensor(np.random.default_rng(0).standard_normal((1, width)).astype("float32"))
        times[count] = _median_us(lambda vm=vm, tensor=tensor: vm["main"](tensor), repeat)
    engine, a, b = ReluEngine(), np.ones((1, width), "float32"), np.empty((1, width), "float32")
    engine_us = _median_us(lambda: engine.run([a], [b]), repeat * 10)
    per_region = (times[64] - times[1]) / 63
    return {"run_1_region_us": times[1], "run_64_regions_us": times[64], "per_region_us": per_region,
            "engine_direct_us": engine_us, "overhead_us": per_region - engine_us}


def load_times(model_name: str, vendor: str) -> dict[str, float]:
    model = byoc.models.get(model_name)
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), vendor))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.byoc")
        compiled.export(path)
        cache = os.path.join(tmp, "cache")
        start = time.perf_counter()
        byoc.load(path, cache_dir=cache, engines="eager")
        cold = time.perf_counter() - start
        start = time.perf_counter()
        byoc.load(path, cache_dir=cache, engines="eager")
        warm = time.perf_counter() - start
    return {"cold_s": cold, "warm_s": warm}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--vendor", default="reference")
    args = parser.parse_args()
    overhead = region_overhead(args.repeat)
    print("per-region call overhead (median of runs, microseconds)")
    for key, value in overhead.items():
        print(f"  {key:<20}{value:>10.2f}")
    print(f"  target: overhead at most 5 us per region call -> {'met' if overhead['overhead_us'] <= 5 else 'NOT met'}")
    loads = load_times(args.model, args.vendor)
    print(f"\nartifact load with engines built ({args.model}, {args.vendor})")
    print(f"  cold engine cache  {loads['cold_s']:8.2f} s")
    print(f"  warm engine cache  {loads['warm_s']:8.2f} s   ({loads['cold_s'] / loads['warm_s']:.1f}x faster)")


if __name__ == "__main__":
    main()
