"""torchvision's detectors, whose shapes depend on the image, through byoc against onnxruntime.

SSDlite320 MobileNetV3, Faster R-CNN MobileNetV3 320 FPN and RetinaNet ResNet-50 FPN at 320,
with random weights (nothing is downloaded) and a low score threshold, exported as users export
them and cached (`byoc.models.vision`: `torch.onnx.export(..., dynamo=False, opset_version=17)`;
the dynamo exporter and torch.export refuse them, the box count depends on the data). Each file is
imported with `byoc.from_onnx`: the head compiled for each vendor, the tail from the first
data-dependent node run in onnxruntime after it (see docs/models.md). Every output is compared
with onnxruntime's on the same file, then each system is timed against the others in one
process (blocks, medians and p90).

    python -m benchmarks.detectors [--runs 20] [--threads 2]

Needs the torch extra and torchvision (see byoc/models/vision.py for why it is installed without
its dependencies, and how its C++ ops are declared); `make vision` installs both.
"""

from __future__ import annotations

import argparse

import numpy as np

from byoc.models import vision
from byoc.timing import instruction_set, machine_description, pin_threads, spread, time_blocks


def measure(name: str, runs: int) -> list[str]:
    import onnxruntime as ort

    import byoc

    path, image = vision.export(name)
    path = str(path)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    want = session.run(None, {"image": image})
    runners = {"onnxruntime": lambda: session.run(None, {"image": image})}
    cells = {}
    for vendor in ("dnnl", "onnxruntime"):
        partitioned = byoc.partition_for(byoc.from_onnx(path), vendor)
        report = byoc.report(partitioned)
        compiled = byoc.build(partitioned)
        got = compiled.run(image=image)
        same = all(g.shape == w.shape and np.allclose(g, w, rtol=1e-4, atol=1e-4) for g, w in zip(got, want))
        cells[vendor] = f"{report.offload_ratio_macs:.0%} of {report.total_macs / 1e6:,.0f} M MACs, {len(report.regions)} region(s); " \
                        f"outputs {'equal onnxruntime' if same else 'DIFFER'}"
        runners[f"byoc + {vendor}"] = lambda compiled=compiled: compiled.run(image=image)
        tail = report.tail or "no tail"
    samples = time_blocks(runners, runs)
    base = spread(samples["onnxruntime"]).median_ms
    rows = [f"### {name}", f"tail: {tail}", "", "| system | median ms | p90 ms | over onnxruntime | partition |",
            "| --- | ---: | ---: | ---: | --- |"]
    for system, times in samples.items():
        s = spread(times)
        partition = cells[system.removeprefix("byoc + ")] if system.startswith("byoc + ") else "the whole file"
        rows.append(f"| {system} | {s.median_ms:.1f} | {s.p90_ms:.1f} | {s.median_ms / base:.2f}x | {partition} |")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(vision.DETECTORS))
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    pin_threads(args.threads, "benchmarks.detectors", argv)
    print(f"{machine_description()}; {instruction_set()}\n")
    for name in args.models.split(","):
        print("\n".join(measure(name, args.runs)) + "\n", flush=True)


if __name__ == "__main__":
    main()
