"""Vision models of torchvision, timm and Ultralytics through byoc against onnxruntime, as a user brings them.

Each model is built from its family's config with seeded random weights (nothing is downloaded),
exported with `torch.onnx.export(..., dynamo=True)` at batch 1 (Ultralytics' by its own exporter)
and cached by content (`byoc.models.vision`), imported with `byoc.from_onnx`, partitioned for
dnnl and for onnxruntime, checked against onnxruntime on the same file (within 1e-3 of the
output's range), then timed against it in one process (medians and p90). Each row says how many
regions the model became and what share of its MACs they hold, and which oneDNN primitives ran in
oneDNN's reference code (ONEDNN_VERBOSE in a child process): those are the slow ones.

    python -m benchmarks.vision [--models resnet50,lraspp_mobilenet_v3_large,...] [--runs 20] [--threads 2]

Needs the torch extra and torchvision (see byoc/models/vision.py for why it is installed without
its dependencies, and how its C++ ops are declared); timm's models need timm (installed without
its dependencies too: they are torch's, torchvision and the transformers extra's), and are left
out of the table, with a line that says so, where it is not installed; so are Ultralytics' models
where it is not. `make vision` installs them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

from byoc.models import vision
from byoc.timing import instruction_set, machine_description, pin_threads, spread, time_blocks

_REFERENCE_KERNELS = """
import sys, warnings, numpy as np, byoc
warnings.simplefilter("ignore")
compiled = byoc.build(byoc.partition_for(byoc.from_onnx(sys.argv[1]), "dnnl"))
image = np.load(sys.argv[2])
compiled.run(image); compiled.run(image)
print("MARK", flush=True)
compiled.run(image)
"""


def reference_kernels(path: str, image_path: str) -> str:
    """The oneDNN primitives one dnnl run executes in oneDNN's reference code, and their ms."""
    run = subprocess.run([sys.executable, "-c", _REFERENCE_KERNELS, path, image_path], capture_output=True, text=True,
                         env={**os.environ, "ONEDNN_VERBOSE": "profile_exec"}, timeout=1200)
    lines = run.stdout.split("MARK")[-1].splitlines()
    found = [line.split(",") for line in lines if line.startswith("onednn_verbose") and ",exec," in line and ",ref:" in line]
    if not found:
        return "none"
    total = sum(float(fields[-1]) for fields in found)
    kinds = sorted({f"{fields[3]} {fields[-2]}" for fields in found})[:3]
    return f"{len(found)} ({total:.1f} ms: {'; '.join(kinds)})"


def measure(name: str, directory: str, runs: int) -> tuple[str, dict[str, float]]:
    """The model's row of the table, and each byoc system's median over onnxruntime's."""
    import onnxruntime as ort

    import byoc

    path, image = vision.export(name)
    path = str(path)
    np.save(os.path.join(directory, f"{name}.npy"), image)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feeds = {session.get_inputs()[0].name: image}
    want = session.run(None, feeds)[0]
    runners = {"onnxruntime": lambda: session.run(None, feeds)}
    notes = []
    for vendor in ("dnnl", "onnxruntime"):
        partitioned = byoc.partition_for(byoc.from_onnx(path), vendor)
        report = byoc.report(partitioned)
        compiled = byoc.build(partitioned)
        got = compiled.run(image)[0]
        error = float(np.abs(got - want).max() / max(float(np.ptp(want)), 1e-12))
        notes.append(f"{vendor}: {len(report.regions)} region(s), {report.offload_ratio_macs:.0%} of MACs, error {error:.0e}")
        runners[f"byoc + {vendor}"] = lambda compiled=compiled: compiled.run(image)
    samples = time_blocks(runners, runs)
    base = spread(samples["onnxruntime"]).median_ms
    systems = ("byoc + dnnl", "byoc + onnxruntime")
    ratios = {k: spread(samples[k]).median_ms / base for k in systems}
    cells = [f"{ratios[k]:.2f}x (p90 {spread(samples[k]).p90_ms / base:.2f}x)" for k in systems]
    reference = reference_kernels(path, os.path.join(directory, f"{name}.npy"))
    return f"| {name} | {base:.1f} | {cells[0]} | {cells[1]} | {'; '.join(notes)} | {reference} |", ratios


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated (default: torchvision's, and timm's where installed)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    pin_threads(args.threads, "benchmarks.vision", argv)
    print(f"{machine_description()}; {instruction_set()}\n")
    print("| model | onnxruntime ms | byoc + dnnl | byoc + onnxruntime | partition | dnnl kernels in reference code |")
    print("| --- | ---: | ---: | ---: | --- | --- |")
    names = args.models.split(",") if args.models else [name for name in vision.names() if name not in vision.DETECTORS]
    ratios: dict[str, list[float]] = {"byoc + dnnl": [], "byoc + onnxruntime": []}
    with tempfile.TemporaryDirectory() as directory:
        for name in names:
            try:
                row, measured = measure(name, directory, args.runs)
            except Exception as error:  # one model's failure is a row of the table
                row = f"| {name} | failed: {type(error).__name__}: {str(error).splitlines()[0][:200]} | | | | |"
            else:
                for system, ratio in measured.items():
                    ratios[system].append(ratio)
            print(row, flush=True)
    for family in ("levit_128s", "yolov8n"):  # timm's, Ultralytics'
        reason = vision.available(family)
        if not args.models and reason is not None:
            print(f"\nleft out: {reason}")
    print()
    for system, values in ratios.items():
        if values:
            print(f"geometric mean of {system} / onnxruntime over {len(values)} model(s): "
                  f"{float(np.exp(np.mean(np.log(values)))):.2f}x (worst {max(values):.2f}x)")


if __name__ == "__main__":
    main()
