"""The `cuda` vendor on a GPU: ResNet-50 and BERT-base (the zoo's) at batch 1 and 32, in float32
and float16, checked against torch on the same GPU and timed against torch eager and
`torch.compile` on the same weights.

Two steps, because the GPU machine has nvcc, torch and NVIDIA's libraries but not byoc's compiler:

    python -m benchmarks.gpu_check prepare [--out out/gpu-check]      # here: build and compile
    python benchmarks/gpu_check.py run out/gpu-check [--table T.md]   # on the GPU machine

`prepare` partitions each model for `cuda` (one region, every MAC), builds it for sm_90 and writes
each region's compiled library, its graph as the library was generated from it, and its
constants' shapes with their mean and spread: the weights are not carried (ResNet-50 and BERT-base
hold 560 MB of them), the run draws them again, seeded, with the same statistics, and gives the
same arrays to byoc and to torch.

`run` needs only numpy, torch and this repository's `byoc.codegen_cuda.engine` (no TVM): it loads
each library on the GPU, runs the region on seeded inputs, and runs the same graph op by op in
torch (torch eager: cuDNN and cuBLAS for convolutions and products, TF32 off, as byoc's float32;
float16 graphs in float16 as byoc computes them) and through `torch.compile`. Bounds: float32
within 1e-3 of the output's range; float16 within a relative L2 of 1e-2 of torch's float16 and
of torch's float32 on the float32 graph. Times are medians (with p90) of `--runs` calls after
warm-up: byoc on the device (its events) and with its copies between host and device, torch
with its inputs on the device. It prints a Markdown table, and writes it where `--table` says.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from byoc.timing import Spread

CASES = [(model, batch, fp16) for model in ("resnet50", "bert_base") for batch in (1, 32) for fp16 in (False, True)]


# ---------------------------------------------------------------------------------- prepare
def prepare(out: Path, arch: str) -> None:
    import tempfile
    import warnings

    import byoc
    from byoc import models
    from byoc.custom_formats.container import unwrap
    from byoc.runtime_metadata.artifact import read_artifact
    from byoc.vendors.cuda.runtime import CUDA_REGION, unpack

    out.mkdir(parents=True, exist_ok=True)
    warnings.simplefilter("ignore")  # no device here: the build says it leaves the engines to the GPU machine
    for model, batch, fp16 in CASES:
        name = f"{model}-b{batch}-{'fp16' if fp16 else 'fp32'}"
        start = time.perf_counter()
        onnx_model = models.resnet50(batch=batch) if model == "resnet50" else models.bert_encoder(batch=batch)
        partitioned = byoc.partition_for(byoc.from_onnx(onnx_model), "cuda", arch=arch, dtype="float16" if fp16 else "float32")
        report = byoc.report(partitioned)
        if len(report.regions) != 1 or report.host_ops:
            raise SystemExit(f"{name}: expected one region and nothing on the host:\n{report}")
        with tempfile.TemporaryDirectory() as tmp:
            byoc.build(partitioned, strict=True).export(Path(tmp) / "m.byoc")
            parts, _ = read_artifact(Path(tmp) / "m.byoc")
        _, payload = unwrap(parts.artifacts[0].payload, CUDA_REGION.name, CUDA_REGION.versions(), name)
        header, library, constants = unpack(payload)
        case = out / name
        case.mkdir(exist_ok=True)
        (case / "region.so").write_bytes(library)
        (case / "graph.json").write_text(json.dumps(header["graph"]))
        statistics = {key: {"mean": float(np.mean(a, dtype=np.float64)), "std": float(np.std(a, dtype=np.float64))}
                      for key, a in zip(header["constants"], constants)}
        (case / "constants.json").write_text(json.dumps(statistics))
        print(f"{name}: {len(header['graph']['nodes'])} ops, library {len(library) / 2**20:.1f} MiB, {time.perf_counter() - start:.0f} s")


# ---------------------------------------------------------------------------------- run
def _constants(graph: dict, statistics: dict) -> list[np.ndarray]:
    arrays = []
    for k, (name, spec) in enumerate(graph["constants"].items()):
        rng = np.random.default_rng(1000 + k)
        values = rng.normal(statistics[name]["mean"], statistics[name]["std"], spec["shape"]).astype(np.float32)
        arrays.append(values.astype(spec["dtype"]))
    return arrays


def _inputs(graph: dict, index_range: int) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    arrays = []
    for spec in graph["inputs"]:
        if spec["dtype"].startswith("int"):
            arrays.append(rng.integers(0, index_range, spec["shape"]).astype(spec["dtype"]))
        else:
            arrays.append(rng.standard_normal(spec["shape"]).astype(spec["dtype"]))
    return arrays


def torch_function(graph: dict, constants: list, torch):
    """The region's graph as a function of its inputs, op by op in torch."""
    import torch.nn.functional as F

    def run(*inputs):
        values: dict = {}

        def value(ref):
            if "input" in ref:
                return inputs[ref["input"]]
            if "const" in ref:
                return constants[list(graph["constants"]).index(ref["const"])]
            if "tuple" in ref:
                return [value(r) for r in ref["tuple"]]
            if "shape" in ref:
                return ref["shape"]
            if "prim" in ref:
                return ref["prim"]
            return values[(ref["node"], ref.get("index", 0))]

        for node in graph["nodes"]:
            args, attrs, op = [value(a) for a in node["args"]], node["attrs"], node["op"].removeprefix("relax.")
            values[(node["id"], 0)] = _TORCH_OPS[op](args, attrs, torch, F)
        return [values[(r["node"], r.get("index", 0))] for r in graph["outputs"]]

    return run


def _pool(args, attrs, F, kind):
    top, left = attrs["padding"][:2]
    if kind == "max":
        return F.max_pool2d(args[0], attrs["pool_size"], attrs["strides"], (top, left), attrs["dilation"], attrs["ceil_mode"])
    return F.avg_pool2d(args[0], attrs["pool_size"], attrs["strides"], (top, left), attrs["ceil_mode"], attrs["count_include_pad"])


_DTYPES = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}
_TORCH_OPS = {
    "nn.conv2d": lambda a, t, torch, F: F.conv2d(a[0], a[1], None, t["strides"], t["padding"][:2], t["dilation"], t["groups"]),
    "matmul": lambda a, t, torch, F: torch.matmul(a[0], a[1]),
    "add": lambda a, t, torch, F: a[0] + a[1],
    "subtract": lambda a, t, torch, F: a[0] - a[1],
    "multiply": lambda a, t, torch, F: a[0] * a[1],
    "divide": lambda a, t, torch, F: a[0] / a[1],
    "maximum": lambda a, t, torch, F: torch.maximum(a[0], a[1]),
    "minimum": lambda a, t, torch, F: torch.minimum(a[0], a[1]),
    "power": lambda a, t, torch, F: torch.pow(a[0], a[1]),
    "nn.relu": lambda a, t, torch, F: F.relu(a[0]),
    "clip": lambda a, t, torch, F: torch.clamp(a[0], a[1], a[2]),
    "erf": lambda a, t, torch, F: torch.erf(a[0]),
    "exp": lambda a, t, torch, F: torch.exp(a[0]),
    "sigmoid": lambda a, t, torch, F: torch.sigmoid(a[0]),
    "tanh": lambda a, t, torch, F: torch.tanh(a[0]),
    "sqrt": lambda a, t, torch, F: torch.sqrt(a[0]),
    "rsqrt": lambda a, t, torch, F: torch.rsqrt(a[0]),
    "negative": lambda a, t, torch, F: -a[0],
    "abs": lambda a, t, torch, F: torch.abs(a[0]),
    "astype": lambda a, t, torch, F: a[0].to(getattr(torch, _DTYPES[t["dtype"]])),
    "nn.softmax": lambda a, t, torch, F: torch.softmax(a[0], dim=t["axis"]),
    "nn.layer_norm": lambda a, t, torch, F: F.layer_norm(a[0], a[0].shape[-1:], a[1], a[2], t["epsilon"]),
    "mean": lambda a, t, torch, F: torch.mean(a[0], dim=t["axis"], keepdim=t["keepdims"]),
    "sum": lambda a, t, torch, F: torch.sum(a[0], dim=t["axis"], keepdim=t["keepdims"]),
    "nn.max_pool2d": lambda a, t, torch, F: _pool(a, t, F, "max"),
    "nn.avg_pool2d": lambda a, t, torch, F: _pool(a, t, F, "avg"),
    "take": lambda a, t, torch, F: a[0][a[1]],
    "permute_dims": lambda a, t, torch, F: a[0].permute(*(t["axes"] or range(a[0].dim() - 1, -1, -1))),
    "concat": lambda a, t, torch, F: torch.cat(a[0], dim=t["axis"]),
    "reshape": lambda a, t, torch, F: a[0].reshape(a[1]),
    "flatten": lambda a, t, torch, F: a[0].reshape(-1),
    "squeeze": lambda a, t, torch, F: a[0].squeeze(*(t["axis"] or [])),
    "expand_dims": lambda a, t, torch, F: a[0].unsqueeze(t["axis"][0]),
}


def _timed(call, runs: int, synchronize) -> Spread:
    """`call` timed to its device's end (`synchronize`), after five untimed calls."""
    from byoc.timing import spread, time_runs

    return spread(time_runs(lambda: (call(), synchronize()), runs, warmup=5))


def _index_range(graph: dict) -> int:
    """How many rows every table the graph looks up has (its integer inputs index them)."""
    tables = [graph["constants"][node["args"][0]["const"]]["shape"][0] for node in graph["nodes"]
              if node["op"] == "relax.take" and "const" in node["args"][0]]
    return min(tables, default=1)


def run_case(case: Path, runs: int, compile_budget_s: float, torch) -> dict:
    from byoc.codegen_cuda.engine import CudaEngine
    from byoc.timing import spread

    graph = json.loads((case / "graph.json").read_text())
    statistics = json.loads((case / "constants.json").read_text())
    constants = _constants(graph, statistics)
    inputs = _inputs(graph, _index_range(graph))
    engine = CudaEngine((case / "region.so").read_bytes(), constants, case.name)
    outputs = [np.empty(out["shape"], out["dtype"]) for out in
               (graph["nodes"][r["node"]]["outputs"][r.get("index", 0)] for r in graph["outputs"])]
    engine.run(inputs, outputs)

    device = torch.device("cuda")
    weights = [torch.from_numpy(c).to(device) for c in constants]
    given = [torch.from_numpy(x).to(device) for x in inputs]
    eager = torch_function(graph, weights, torch)
    with torch.no_grad():
        reference = [r.float().cpu().numpy() for r in eager(*given)]
    fp16 = case.name.endswith("fp16")
    errors = []
    for got, want in zip(outputs, reference):
        got = got.astype(np.float32)
        errors.append(float(np.linalg.norm(got - want) / np.linalg.norm(want)) if fp16 else
                      float(np.abs(got - want).max() / max(float(np.abs(want).max()), 1e-30)))
    bound = 1e-2 if fp16 else 1e-3
    device_times: list[float] = []

    def byoc_call():
        engine.run(inputs, outputs)
        device_times.append(engine.last_execution_s)

    synchronize = torch.cuda.synchronize
    row = {"case": case.name, "error": max(errors), "bound": bound, "passed": max(errors) <= bound}
    row["byoc_ms"] = _timed(byoc_call, runs, synchronize)
    row["byoc_device_ms"] = spread(device_times[-runs:])
    with torch.no_grad():
        row["eager_ms"] = _timed(lambda: eager(*given), runs, synchronize)
        if compile_budget_s > 0:
            start = time.perf_counter()
            compiled = torch.compile(eager)
            compiled(*given)
            row["compile_s"] = time.perf_counter() - start
            row["compiled_ms"] = _timed(lambda: compiled(*given), runs, synchronize)
    return row


def run(directory: Path, runs: int, table: Path | None, compile_budget_s: float) -> int:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    name = torch.cuda.get_device_name(0)
    rows, started = [], time.perf_counter()
    for model, batch, fp16 in CASES:
        case = directory / f"{model}-b{batch}-{'fp16' if fp16 else 'fp32'}"
        left = compile_budget_s - (time.perf_counter() - started)
        rows.append(run_case(case, runs, left, torch))
        print(json.dumps(rows[-1], default=vars), flush=True)
    lines = [f"GPU: {name}; torch {torch.__version__}; {runs} runs after warm-up; medians (p90) in ms; error: fp32 max over "
             "the output's range, fp16 relative L2, each against torch on the same graph and weights", "",
             "| case | error (bound) | byoc on the device | byoc with copies | torch eager | torch.compile | byoc / eager |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        def cell(key: str, r: dict = r) -> str:
            return f"{r[key].median_ms:.2f} ({r[key].p90_ms:.2f})" if key in r else "not run"

        lines.append(f"| {r['case']} | {r['error']:.1e} ({r['bound']:.0e}){'' if r['passed'] else ' FAIL'} | {cell('byoc_device_ms')} | "
                     f"{cell('byoc_ms')} | {cell('eager_ms')} | {cell('compiled_ms')} | {r['byoc_device_ms'].median_ms / r['eager_ms'].median_ms:.2f}x |")
    text = "\n".join(lines)
    print(text)
    if table is not None:
        table.parent.mkdir(parents=True, exist_ok=True)
        table.write_text(text + "\n")
    return 0 if all(r["passed"] for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    make = steps.add_parser("prepare", help="build and compile the regions here (needs byoc and nvcc, no GPU)")
    make.add_argument("--out", type=Path, default=Path("out/gpu-check"))
    make.add_argument("--arch", default="sm_90")
    check = steps.add_parser("run", help="run them on the GPU against torch (needs numpy, torch and a CUDA device)")
    check.add_argument("directory", type=Path)
    check.add_argument("--runs", type=int, default=30)
    check.add_argument("--table", type=Path, default=None)
    check.add_argument("--compile-budget", type=float, default=240.0, help="seconds torch.compile may take in all")
    args = parser.parse_args(argv)
    if args.step == "prepare":
        prepare(args.out, args.arch)
        return 0
    return run(args.directory, args.runs, args.table, args.compile_budget)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this repository's byoc, where it is not installed
    sys.exit(main())
