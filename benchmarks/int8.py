"""int8 on the CPU: byoc + dnnl on models quantized by onnxruntime's `quantize_static` (QDQ,
per-channel int8 weights, calibrated on 8 seeded inputs), against onnxruntime and OpenVINO running
the same files, and against the fp32 model; byoc + onnxruntime on the same files beside, and
byoc + dnnl quantizing the fp32 model itself (`precision="int8"`, calibrated on the same 8 inputs), and for
every model the file `quantize_dynamic` makes (activations quantized at run time). Both activation types are made (u8 and s8); for each
int8 system the faster counts. All systems run in one process, timed against each other in
alternating blocks (see `byoc.timing.time_blocks`). Prints a Markdown table per model, then the
ratios the targets are stated in.

    python -m benchmarks.int8 [--models resnet50,mobilenet_v2,bert_encoder] [--runs 40] [--threads 2] [--small]

A model named `hf:<architecture>:<size>` is the exported suite's file (`byoc.models.exported`, the
`torch` extra): a model exported from PyTorch, quantized the same way.

Error is relative L2 against onnxruntime running the same file (the fp32 systems: the fp32 model).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from byoc.benchmarking.systems import openvino_runner
from byoc.benchmarking.table import describe_machine
from byoc.timing import onednn_has_vnni, pin_threads, spread, time_blocks

MODELS = ("resnet50", "mobilenet_v2", "bert_encoder")
ACTIVATIONS = {"u8": "uint8", "s8": "int8"}
PEERS = ("onnxruntime", "openvino")
PRECISION_INT8 = "byoc + dnnl, precision=int8 (fp32 model)"
SATURATING = "int8_without_vnni=int8"


@dataclass
class Row:
    system: str
    median_ms: float = 0.0
    p90_ms: float = 0.0
    build_s: float = 0.0
    relative_l2: float = 0.0
    regions: int | None = None


def _relative_l2(got, want) -> float:
    return max(float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30)) for g, w in zip(got, want))


def _session(model, threads: int):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _byoc(model, inputs: dict, want: list, name: str, runners: dict, rows: dict, threads: int, vendor: str = "dnnl",
          build_options: dict | None = None, **options) -> None:
    import byoc

    start = time.perf_counter()
    partitioned = byoc.partition_for(byoc.from_onnx(model), vendor, **options)
    if vendor == "onnxruntime":
        build_options = {"intra_op_num_threads": threads, **(build_options or {})}
    compiled = byoc.build(partitioned, backend_options={vendor: build_options} if build_options else None)
    got = compiled.run(inputs)
    rows[name] = Row(name, build_s=time.perf_counter() - start, relative_l2=_relative_l2(got, want),
                     regions=len(byoc.report(partitioned).regions))
    runners[name] = lambda: compiled.run(inputs)


def _model(name: str, small: bool):
    """The fp32 model and its seeded inputs (a function of the seed)."""
    from byoc import models as zoo
    from byoc.models import exported

    if name.startswith(exported.SPEC_PREFIX):
        model = exported.export(*exported.parse_spec(name))
        return model, lambda seed: exported.sample_inputs(model, seed=seed)
    model = zoo.get(name, small=small)
    return model, lambda seed: zoo.sample_inputs(model, seed=seed)


def benchmark(name: str, threads: int, runs: int, small: bool) -> list[Row]:
    from byoc.models.quantized import quantize_dynamic, quantize_static

    model, sample = _model(name, small)
    calibration = [sample(s) for s in range(8)]
    inputs = sample(1000)
    runners: dict[str, Callable[[], object]] = {}
    rows: dict[str, Row] = {}
    fp32 = _session(model, threads)
    want = fp32.run(None, inputs)
    runners["onnxruntime fp32"], rows["onnxruntime fp32"] = lambda: fp32.run(None, inputs), Row("onnxruntime fp32")
    _byoc(model, inputs, want, "byoc + dnnl fp32", runners, rows, threads)
    _byoc(model, inputs, want, PRECISION_INT8, runners, rows, threads, precision="int8", calibration=calibration)
    for label, activations in ACTIVATIONS.items():
        quantized = quantize_static(model, calibration, activations)
        session = _session(quantized, threads)
        want = session.run(None, inputs)
        runners[f"onnxruntime int8 {label}"] = lambda session=session: session.run(None, inputs)
        rows[f"onnxruntime int8 {label}"] = Row(f"onnxruntime int8 {label}")
        openvino = openvino_runner(quantized, threads, inputs)
        if openvino is not None:
            runners[f"openvino int8 {label}"] = openvino
            rows[f"openvino int8 {label}"] = Row(f"openvino int8 {label}", relative_l2=_relative_l2(openvino(), want))
        _byoc(quantized, inputs, want, f"byoc + dnnl int8 {label}", runners, rows, threads)
        if not onednn_has_vnni():  # the int8 kernels kept where they could saturate (the option's other choice)
            _byoc(quantized, inputs, want, f"byoc + dnnl int8 {label}, {SATURATING}", runners, rows, threads,
                  build_options={"int8_without_vnni": "int8"})
        _byoc(quantized, inputs, want, f"byoc + onnxruntime int8 {label}", runners, rows, threads, "onnxruntime")
    if any(n.op_type in ("MatMul", "Conv") for n in model.graph.node):  # as quantize_dynamic makes it too (activations quantized per call)
        dynamic = quantize_dynamic(model)
        session = _session(dynamic, threads)
        want = session.run(None, inputs)
        runners["onnxruntime dynamic int8"], rows["onnxruntime dynamic int8"] = (lambda: session.run(None, inputs)), Row("onnxruntime dynamic int8")
        _byoc(dynamic, inputs, want, "byoc + dnnl dynamic int8", runners, rows, threads)
        _byoc(dynamic, inputs, want, "byoc + onnxruntime dynamic int8", runners, rows, threads, "onnxruntime")
    for system, samples in time_blocks(runners, runs).items():
        timing = spread(samples)
        rows[system].median_ms, rows[system].p90_ms = timing.median_ms, timing.p90_ms
    return list(rows.values())


def _fastest(rows: list[Row], prefix: str) -> Row | None:
    found = [r for r in rows if r.system.startswith(prefix)]
    return min(found, key=lambda r: r.median_ms) if found else None


def markdown(name: str, rows: list[Row]) -> str:
    base = next(r for r in rows if r.system == "onnxruntime fp32").median_ms
    lines = [f"### {name}", "", "| system | median ms | p90 ms | vs onnxruntime fp32 | rel. L2 | regions | build s |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r.system} | {r.median_ms:.2f} | {r.p90_ms:.2f} | {r.median_ms / base:.2f}x | {r.relative_l2:.2%} | "
                     f"{'' if r.regions is None else r.regions} | {r.build_s:.1f} |")
    exact = [r for r in rows if SATURATING not in r.system]  # the default build; the option's rows are read apart
    byoc_int8, byoc_fp32 = _fastest(exact, "byoc + dnnl int8"), _fastest(rows, "byoc + dnnl fp32")
    peers = [p for p in (_fastest(rows, f"{peer} int8") for peer in PEERS) if p is not None]
    best = min(peers, key=lambda r: r.median_ms)
    lines += ["", f"byoc + dnnl int8 ({byoc_int8.system.removeprefix('byoc + dnnl int8 ')}): {byoc_int8.median_ms / best.median_ms:.2f}x the fastest peer int8 "
              f"({best.system}), {byoc_fp32.median_ms / byoc_int8.median_ms:.2f}x faster than byoc + dnnl fp32"]
    kept = _fastest([r for r in rows if SATURATING in r.system], "byoc + dnnl int8")
    if kept is not None:
        lines.append(f"with {SATURATING}: {kept.median_ms / best.median_ms:.2f}x the fastest peer int8, "
                     f"{byoc_int8.median_ms / kept.median_ms:.2f}x faster than the default build, rel. L2 {kept.relative_l2:.2%}")
    own = next(r for r in rows if r.system == PRECISION_INT8)
    lines += [f"byoc + dnnl, precision=int8 on the fp32 model: {own.median_ms / best.median_ms:.2f}x the fastest peer int8, "
              f"{byoc_fp32.median_ms / own.median_ms:.2f}x faster than byoc + dnnl fp32"]
    dynamic = {r.system: r for r in rows if "dynamic" in r.system}
    if dynamic:
        ours, theirs = dynamic["byoc + dnnl dynamic int8"], dynamic["onnxruntime dynamic int8"]
        lines += [f"byoc + dnnl on the quantize_dynamic file: {ours.median_ms / theirs.median_ms:.2f}x onnxruntime on it"]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated zoo models or hf:<architecture>:<size> (default: {','.join(MODELS)})")
    parser.add_argument("--runs", type=int, default=40, help="timed runs per system (default: 40)")
    parser.add_argument("--threads", type=int, default=2, help="threads for every system (default: 2)")
    parser.add_argument("--small", action="store_true", help="the zoo's small configurations (a quick check)")
    args = parser.parse_args(argv)
    pin_threads(args.threads, "benchmarks.int8", argv)
    print(f"int8 on the CPU: {describe_machine(args.threads, busy=False)}\n")
    for name in args.models.split(","):
        print(markdown(name, benchmark(name, args.threads, args.runs, args.small)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
