"""Why an int8 vendor's top-1 agreement misses its bound on a model whose error is small: for each
evaluation input, the float32 top-2 margin of the class scores against the int8 error on the
five best scores (RMS; over all 1000 the near-zero probabilities of a softmax would hide it).

Random-weight classifiers often nearly tie between their two best classes. A flip on an input
whose margin is below the int8 noise says nothing about the arithmetic. A flip on an input with
a wide margin would. Runs through `byoc.testing.evaluate`, as `byoc matrix` does.

    python benchmarks/int8_margins.py --vendors vitis_ai ethos_u --models resnet50 light_squeezenet --samples 16
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from byoc.testing.kit import evaluate, model_case


def margins(vendor: str, name: str, samples: int, calibration: int) -> tuple[list[tuple[float, float, float, bool]], float]:
    """Per input (top-2 margin, RMS error on the five best scores, score std, flipped), sorted
    by margin / error, and the relative L2 error over all inputs."""
    result = evaluate(vendor, model_case(name), samples=samples, calibration_samples=calibration)
    if result.error:
        raise SystemExit(f"{vendor} x {name}: {result.error}")
    rows = []
    for got, want in zip(result.outputs, result.reference):
        scores, reference = got[0].reshape(-1), want[0].reshape(-1)
        best = np.argsort(reference)[::-1][:5]
        first, second = best[:2]
        rms = float(np.sqrt(np.mean((scores[best] - reference[best]) ** 2)))
        rows.append((float(reference[first] - reference[second]), rms, float(reference.std()), bool(np.argmax(scores) != first)))
    rows.sort(key=lambda row: row[0] / row[1])
    return rows, result.accuracy.relative_l2


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vendors", nargs="+", default=["vitis_ai", "ethos_u"])
    parser.add_argument("--models", nargs="+", default=["resnet50", "light_squeezenet", "light_shufflenet"])
    parser.add_argument("--samples", type=int, default=16, help="evaluation inputs")
    parser.add_argument("--calibration", type=int, default=4, help="calibration inputs")
    parser.add_argument("--verbose", action="store_true", help="print every input")
    args = parser.parse_args(argv)
    print("| model | vendor | rel. L2 | top-1 | median margin / score std | flips at margin / top-5 error | agree above |")
    print("| --- | --- | ---: | ---: | ---: | --- | ---: |")
    for name in args.models:
        for vendor in args.vendors:
            rows, relative_l2 = margins(vendor, name, args.samples, args.calibration)
            ratios = [margin / rms for margin, rms, _, _ in rows]
            flips = [ratio for ratio, row in zip(ratios, rows) if row[3]]
            spread = float(np.median([margin / std for margin, _, std, _ in rows]))
            agreement = 1 - len(flips) / len(rows)
            flipped = f"{min(flips):.2f} to {max(flips):.2f}" if flips else "none"
            print(f"| {name} | {vendor} | {relative_l2:.2%} | {agreement:.0%} | {spread:.2f} | {flipped} | "
                  f"{max(flips) if flips else 0:.2f} |", flush=True)
            if args.verbose:
                for (margin, rms, std, flip), ratio in zip(rows, ratios):
                    print(f"    margin {margin:.4g}  RMS error {rms:.4g}  ratio {ratio:6.2f}  score std {std:.4g}"
                          f"{'  flipped' if flip else ''}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
