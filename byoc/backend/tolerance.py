"""How close a backend's results are to float32 onnxruntime's, stated once in its spec.

The test kit (`byoc.testing`) and the vendor matrix (`byoc matrix`) hold every backend to its
own statement: float32 backends to a tight elementwise bound, float16 and int8 backends to a
bound on the relative L2 error and, for classifiers, on top-1 agreement.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PRECISIONS = ("fp32", "fp16", "bf16", "int8")


@dataclass(frozen=True)
class Tolerance:
    """`rtol`/`atol` bound every element (`atol` scaled by the output's largest magnitude, at
    least 1); `relative_l2` bounds ||got - want|| / ||want|| over all samples and outputs;
    `top1` is the least top-1 agreement on classifiers. A bound that is None is not checked.
    Integer outputs must be equal under an elementwise bound; without one (int8, fp16) they are
    selections made from perturbed scores (NonMaxSuppression's boxes), whose agreement is
    reported by `AccuracyReport.selection_agreement` rather than bounded: near-tied scores
    reorder under any quantization, and the code that selects is the float32 host's, checked
    exactly by the float vendors."""

    precision: str = "fp32"
    rtol: float | None = 1e-4
    atol: float | None = 1e-4
    relative_l2: float | None = None
    top1: float | None = None

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, not {self.precision!r}")

    def describe(self) -> str:
        parts = [self.precision]
        if self.rtol is not None or self.atol is not None:
            parts.append(f"rtol {self.rtol:g}, atol {self.atol:g} x output scale")
        if self.relative_l2 is not None:
            parts.append(f"relative L2 <= {self.relative_l2:.0%}")
        if self.top1 is not None:
            parts.append(f"top-1 agreement >= {self.top1:.0%}")
        return ", ".join(parts)

    def elementwise_violation(self, got: np.ndarray, want: np.ndarray) -> str | None:
        """Why `got` is outside the elementwise bound of `want`, or None."""
        bounded = self.rtol is not None or self.atol is not None
        if not np.issubdtype(want.dtype, np.floating):
            if not bounded:  # selections made from quantized scores: compared as sets (AccuracyReport)
                return None if got.ndim == want.ndim else f"rank {got.ndim}, expected {want.ndim}"
            if got.shape != want.shape:
                return f"shape {got.shape}, expected {want.shape}"
            return None if np.array_equal(got, want) else f"{int(np.sum(got != want))} of {want.size} values differ"
        if got.shape != want.shape:
            return f"shape {got.shape}, expected {want.shape}"
        if not bounded:
            return None
        scale = max(1.0, float(np.max(np.abs(want), initial=0.0)))
        allowed = (self.atol or 0.0) * scale + (self.rtol or 0.0) * np.abs(want)
        error = np.abs(got.astype(np.float64) - want)
        if np.all(error <= allowed) and np.array_equal(np.isnan(got), np.isnan(want)):
            return None
        return f"max abs error {float(np.nanmax(error)):.3g} over the bound ({self.describe()})"


FP32 = Tolerance()
FP16 = Tolerance("fp16", rtol=None, atol=None, relative_l2=0.01, top1=0.95)
# bfloat16 keeps 8 bits of mantissa to float16's 11: its bound is float16's, eight times wider
# (measured: see docs/vendors.md, the cuda vendor).
BF16 = Tolerance("bf16", rtol=None, atol=None, relative_l2=0.08, top1=0.90)
INT8 = Tolerance("int8", rtol=None, atol=None, relative_l2=0.10, top1=0.90)
