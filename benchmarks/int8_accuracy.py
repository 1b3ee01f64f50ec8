"""Accuracy, offload and estimated cycles of the int8 vendors (simulated Vitis-AI DPU, Arm
Ethos-U through Vela) on the zoo's classifiers and on onnx's light CNN graphs, per calibration
method.

Zoo models are the reduced ("small") ones; light graphs carry seeded random weights scaled to
unit activation variance (`byoc.testing.onnx_models`). Each is calibrated on N seeded random
inputs and evaluated on N others of the same distribution against float32 onnxruntime.
Estimated cycles are the vendors' own (the DPU throughput model, Vela's performance model).
"Gain" is the float32 model's own sensitivity, measured with onnxruntime: the relative change of
its output per unit of relative Gaussian noise added to its input (1e-3). Quantization is noise
on every layer's input, so a network that amplifies noise cannot keep int8 error small, however
the scales are chosen; trained networks, and the zoo's, have gains under 1.

    python benchmarks/int8_accuracy.py                        # zoo, both vendors, every method
    python benchmarks/int8_accuracy.py --light squeezenet resnet50 --methods entropy
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import byoc
from byoc.accuracy import measure_accuracy
from byoc.processing.ranges import METHODS
from byoc.testing.kit import onnxruntime_session
from byoc.testing.onnx_models import light_model, light_model_names

TARGETS = [
    ("vitis_ai", {"dpu": "DPUCZDX8G-B4096"}),
    ("ethos_u", {"accelerator": "ethos-u55-256"}),
]


def _models(args: argparse.Namespace):
    for name in args.models:
        yield name, byoc.models.get(name, small=not args.full_size)
    for name in args.light:
        yield f"light {name}", light_model(name)


def noise_gain(model, samples, level: float = 1e-3) -> float:
    """Median over `samples` of ||f(x + n) - f(x)|| / ||f(x)|| / level, n Gaussian with
    ||n|| = level * ||x|| on the first input, f the float32 model under onnxruntime."""
    session, rng, gains = onnxruntime_session(model), np.random.default_rng(0), []
    for sample in samples:
        name = next(iter(sample))
        x = sample[name]
        noise = (rng.standard_normal(x.shape) * level * np.linalg.norm(x) / np.sqrt(x.size)).astype(x.dtype)
        clean, noisy = session.run(None, sample)[0], session.run(None, {**sample, name: x + noise})[0]
        gains.append(float(np.linalg.norm(noisy - clean) / np.linalg.norm(clean)) / level)
    return float(np.median(gains))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=["resnet18", "mobilenet_v2", "vgg19"], help="zoo models")
    parser.add_argument("--light", nargs="*", default=[], help=f"onnx light graphs ({', '.join(light_model_names())})")
    parser.add_argument("--vendors", nargs="+", default=[v for v, _ in TARGETS], choices=[v for v, _ in TARGETS])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--samples", type=int, default=8, help="calibration inputs, and as many evaluation inputs")
    parser.add_argument("--full-size", action="store_true", help="published input sizes for the zoo (slow calibration)")
    args = parser.parse_args()
    header = (f"{'model':<20}{'vendor':<10}{'method':<12}{'MACs':>7}{'regions':>8}{'est. cycles':>13}"
              f"{'rel L2':>8}{'SQNR dB':>9}{'top-1':>7}{'gain':>7}")
    print(header)
    print("-" * len(header), flush=True)
    for name, model in _models(args):
        mod = byoc.from_onnx(model)
        calibration = [byoc.models.sample_inputs(model, seed=s) for s in range(args.samples)]
        evaluation = [byoc.models.sample_inputs(model, seed=1000 + s) for s in range(args.samples)]
        gain = noise_gain(model, evaluation)
        for vendor, options in TARGETS:
            if vendor not in args.vendors:
                continue
            for method in args.methods:
                start = time.perf_counter()
                partitioned = byoc.partition_for(mod, vendor, calibration=calibration, calibration_method=method, **options)
                compiled = byoc.build(partitioned, strict=True)
                report = compiled.report()
                accuracy = measure_accuracy(compiled, model, evaluation)
                cycles = sum(e["cycles"] for e in report.estimates.values())
                top1 = f"{accuracy.top1_agreement:.0%}" if accuracy.top1_agreement is not None else "n/a"
                print(f"{name:<20}{vendor:<10}{method:<12}{report.offload_ratio_macs:>7.1%}{len(report.regions):>8}"
                      f"{cycles:>13,}{accuracy.relative_l2:>8.2%}{accuracy.sqnr_db:>9.1f}{top1:>7}{gain:>7.1f}", flush=True)
                print(f"{name} {vendor} {method}: {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
