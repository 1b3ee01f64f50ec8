"""Accuracy, offload and estimated cycles of the int8 vendors (simulated Vitis-AI DPU, Arm
Ethos-U through Vela) on the zoo's classifiers.

Accuracy is measured on the reduced ("small") models, calibrated on N seeded random inputs and
evaluated on N others of the same distribution against float32 onnxruntime. Estimated cycles
are the vendors' own (the DPU throughput model, Vela's performance model) at the size given.
"""

from __future__ import annotations

import argparse
import sys
import time

import byoc
from byoc.accuracy import measure_accuracy
from byoc.vendors.ethos_u import partition_for_ethos_u
from byoc.vendors.vitis_ai import partition_for_vitis_ai

TARGETS = [
    ("vitis_ai", "DPUCZDX8G-B4096", lambda mod, cal, t: partition_for_vitis_ai(mod, dpu=t, calibration=cal)),
    ("vitis_ai", "DPUCZDX8G-B1024", lambda mod, cal, t: partition_for_vitis_ai(mod, dpu=t, calibration=cal)),
    ("ethos_u", "ethos-u55-256", lambda mod, cal, t: partition_for_ethos_u(mod, accelerator=t, calibration=cal)),
    ("ethos_u", "ethos-u65-512", lambda mod, cal, t: partition_for_ethos_u(mod, accelerator=t, calibration=cal)),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v2", "vgg19"])
    parser.add_argument("--samples", type=int, default=8, help="calibration inputs, and as many evaluation inputs")
    parser.add_argument("--full-size", action="store_true", help="published input sizes (slow calibration with untuned TVM)")
    args = parser.parse_args()
    header = f"{'model':<14}{'vendor':<10}{'target':<17}{'ops':>7}{'MACs':>7}{'regions':>8}{'est. cycles':>13}{'est. ms':>9}"
    header += f"{'max abs':>9}{'rel L2':>8}{'top-1':>7}"
    rows = [header, "-" * len(header)]
    for name in args.models:
        model = byoc.models.get(name, small=not args.full_size)
        mod = byoc.from_onnx(model)
        calibration = [byoc.models.sample_inputs(model, seed=s) for s in range(args.samples)]
        evaluation = [byoc.models.sample_inputs(model, seed=1000 + s) for s in range(args.samples)]
        for vendor, target, partition in TARGETS:
            start = time.perf_counter()
            compiled = byoc.build(partition(mod, calibration, target), strict=True)
            report = compiled.report()
            accuracy = measure_accuracy(compiled, model, evaluation)
            cycles = sum(e["cycles"] for e in report.estimates.values())
            milliseconds = sum(e["ms_at_clock"] for e in report.estimates.values())
            rows.append(
                f"{name:<14}{vendor:<10}{target:<17}{report.offload_ratio_nodes:>7.1%}{report.offload_ratio_macs:>7.1%}{len(report.regions):>8}"
                f"{cycles:>13,}{milliseconds:>9.3f}{accuracy.max_abs_error:>9.3f}{accuracy.relative_l2:>8.2%}{accuracy.top1_agreement:>7.0%}"
            )
            print(f"{name} {target}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
