"""The int8 devices on models quantized by onnxruntime's `quantize_static` (QDQ, per-channel int8
weights, calibrated on 8 seeded inputs), beside the float vendors on the same files.

For each model and activation type (u8, s8) and vendor: regions, relative L2 against onnxruntime
running the same file (mean over the evaluation inputs), what the device changed of the model's
quantization (the build's RequantizationWarning: activation scales and weight tensors quantized
again) and the build time. The float model's own calibration path on the int8 devices (the only
path before they took a model's quantization) is beside, against the same onnxruntime int8
output: "own calibration".

    python benchmarks/int8_vendors_quantized.py [--models resnet18 resnet50 mobilenet_v2 vgg19 inception_v3]
        [--vendors dnnl onnxruntime vitis_ai ethos_u] [--samples 4] [--full-size]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np

import byoc
from byoc.errors import RequantizationWarning
from byoc.models.quantized import quantize_static
from byoc.testing.kit import onnxruntime_session
from byoc.timing import instruction_set

INT8_DEVICES = ("vitis_ai", "ethos_u")


def _relative_l2(compiled, session, samples) -> float:
    errors = []
    for sample in samples:
        want, got = session.run(None, sample)[0], compiled.run(sample)[0]
        errors.append(float(np.linalg.norm(got - want) / np.linalg.norm(want)))
    return float(np.mean(errors))


def _row(model_name: str, activations: str, vendor: str, path: str, mod, session, evaluation, calibration) -> str:
    start = time.perf_counter()
    options = {"calibration": calibration} if calibration is not None else {}
    partitioned = byoc.partition_for(mod, vendor, **options)
    regions = len(byoc.report(partitioned).regions)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        compiled = byoc.build(partitioned)
    build_s = time.perf_counter() - start
    changed = [str(w.message) for w in warned if issubclass(w.category, RequantizationWarning)]
    note = changed[0].split("quantized again (")[1].split("):")[0] if changed else "none"
    error = _relative_l2(compiled, session, evaluation)
    return f"| {model_name} | {activations} | {vendor} | {path} | {regions} | {error:.2%} | {note} | {build_s:.1f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50", "mobilenet_v2", "vgg19", "inception_v3"])
    parser.add_argument("--vendors", nargs="+", default=["dnnl", "onnxruntime", *INT8_DEVICES])
    parser.add_argument("--activations", nargs="+", default=["uint8", "int8"], choices=["uint8", "int8"])
    parser.add_argument("--samples", type=int, default=4, help="evaluation inputs (8 others calibrate the quantization)")
    parser.add_argument("--full-size", action="store_true", help="the zoo's published input sizes (slow on the simulators)")
    args = parser.parse_args()

    print(f"accuracy only (no timing); {instruction_set()}")
    print()
    print("| model | activations | vendor | path | regions | rel. L2 vs onnxruntime int8 | re-quantized | build s |")
    print("| --- | --- | --- | --- | ---: | ---: | --- | ---: |")
    for name in args.models:
        model = byoc.models.get(name, small=not args.full_size)
        calibration = [byoc.models.sample_inputs(model, seed=s) for s in range(8)]
        evaluation = [byoc.models.sample_inputs(model, seed=100 + s) for s in range(args.samples)]
        float_mod = byoc.from_onnx(model)
        for activations in args.activations:
            quantized = quantize_static(model, calibration, activations)
            session, mod = onnxruntime_session(quantized), byoc.from_onnx(quantized)
            for vendor in args.vendors:
                print(_row(name, activations, vendor, "model's quantization", mod, session, evaluation, None), flush=True)
                if vendor in INT8_DEVICES:
                    print(_row(name, activations, vendor, "own calibration (float model)", float_mod, session, evaluation,
                               calibration), flush=True)


if __name__ == "__main__":
    sys.exit(main())
