"""From the values a tensor took over the calibration set to the range int8 scales cover.

- `minmax`: the observed extremes. Nothing is clipped, but one outlier coarsens the step for
  every other value.
- `percentile`: the 99.99th percentile of |x| (PyTorch's and TensorRT's percentile
  calibrators use this neighbourhood): the rarest 0.01% of values are clipped.
- `entropy`: the threshold whose 128-level quantized histogram of |x| is closest, by
  Kullback-Leibler divergence, to the clipped one (TensorRT's entropy calibrator, after
  Migacz, "8-bit inference with TensorRT", GTC 2017).
- `min_diffs`, for power-of-two scales: of the step that clips nothing and the next four finer
  powers of two, the one that quantizes the values with the least squared error (Vitis AI's
  quantizer, `diffs` in vai_q_pytorch and `--method 1` in vai_q_tensorflow, its default). Rounding
  the step up to a power of two wastes up to a bit; a finer step that clips a few of the largest
  values often loses less (ViT on the DPU: the residual stream went from 2**-5 to 2**-6, the
  relative error of the output from 11.9% to 6.4%). Scores a classifier ranks are the exception:
  a few saturated values are little squared error and a tie for top-1 (the reduced ResNet-50's
  random-weight logits, near-Gaussian, all saturate at the top: top-1 75% -> 0%).

Percentile, entropy and min_diffs need the distribution, not only the extremes: each tensor keeps a
bounded, seeded random sample of its absolute values (at most `_PER_CALL` per run and
`_KEPT` in all), which is enough to place a 99.99th percentile on tensors of a few thousand
values and a 2048-bin histogram on larger ones.
"""

from __future__ import annotations

import math

import numpy as np

METHODS = ("minmax", "percentile", "entropy", "min_diffs")
PERCENTILE = 99.99
_PER_CALL = 1 << 15
_KEPT = 1 << 17
_BINS = 2048
_LEVELS = 128
_STEP = 8  # candidate thresholds are every 8th bin edge from the 128th
_QMAX = 127  # int8, the one type quantization writes
_FINER_STEPS = 4  # min_diffs: powers of two tried below the one that clips nothing, as Vitis AI does


class TensorRange:
    """The values one tensor took: its extremes, and a sample of |x| when the method needs it."""

    def __init__(self, method: str, seed: int) -> None:
        self.method = method
        self.low, self.high = np.inf, -np.inf
        self.kept: list[np.ndarray] = []
        self.rng = np.random.default_rng(seed)

    def add(self, array: np.ndarray) -> None:
        if not (array.size and np.issubdtype(array.dtype, np.floating)):
            return
        self.low = min(self.low, float(array.min()))
        self.high = max(self.high, float(array.max()))
        if self.method == "minmax":
            return
        flat = np.abs(array.reshape(-1)).astype(np.float32)
        if flat.size > _PER_CALL:
            flat = flat[self.rng.integers(0, flat.size, _PER_CALL)]
        self.kept.append(flat)
        if sum(k.size for k in self.kept) > _KEPT:
            joined = np.concatenate(self.kept)
            self.kept = [joined[self.rng.integers(0, joined.size, _KEPT)]]

    def bounds(self) -> list[float]:
        """[low, high] the scales cover: the observed range, clipped to the method's threshold."""
        if self.low > self.high:  # never saw a value
            return [0.0, 0.0]
        if self.method == "minmax" or not self.kept:
            return [self.low, self.high]
        values = np.concatenate(self.kept)
        if self.method == "percentile":
            limit = float(np.percentile(values, PERCENTILE))
        elif self.method == "min_diffs":
            limit = min_diffs_threshold(values, max(-self.low, self.high))
        else:
            limit = entropy_threshold(values)
        if limit <= 0.0:
            return [self.low, self.high]
        return [max(self.low, -limit), min(self.high, limit)]


def entropy_threshold(magnitudes: np.ndarray) -> float:
    """The clipping threshold for |x| values `magnitudes` that loses the least information.
    Zeros are left out: int8 holds them exactly, and after a ReLU their mass in the first bin
    would make every coarser quantization look costly and pull the threshold in."""
    magnitudes = magnitudes[magnitudes > 0]
    peak = float(magnitudes.max()) if magnitudes.size else 0.0
    if peak <= 0.0:
        return 0.0
    histogram, edges = np.histogram(magnitudes, bins=_BINS, range=(0.0, peak))
    histogram = histogram.astype(np.float64)
    best, best_divergence = peak, np.inf
    for stop in range(_LEVELS, _BINS + 1, _STEP):
        reference = histogram[:stop].copy()
        reference[-1] += histogram[stop:].sum()  # the clipped values land on the threshold
        present = histogram[:stop] > 0
        level = np.arange(stop) * _LEVELS // stop
        totals = np.bincount(level, weights=histogram[:stop], minlength=_LEVELS)
        counts = np.bincount(level, weights=present, minlength=_LEVELS)
        expanded = np.where(present, totals[level] / np.maximum(counts[level], 1), 0.0)
        divergence = _kl(reference, expanded)
        if divergence < best_divergence:
            best, best_divergence = float(edges[stop]), divergence
    return best


def min_diffs_threshold(magnitudes: np.ndarray, peak: float) -> float:
    """The range (127 steps) of the power-of-two step, of the one that clips nothing at `peak`
    and the next `_FINER_STEPS` finer, that quantizes `magnitudes` (|x|) with the least squared
    error; ties go to the coarser step. The range is exact, so the power-of-two scale made from
    it (`QuantizationConfig.scale`) is that step."""
    if peak <= 0.0:
        return 0.0
    coarsest = math.ceil(math.log2(peak / _QMAX))
    values = magnitudes.astype(np.float64)
    best, best_error = coarsest, math.inf
    for position in range(coarsest, coarsest - _FINER_STEPS - 1, -1):
        step = 2.0**position
        error = float(np.sum((np.minimum(np.round(values / step), _QMAX) * step - values) ** 2))
        if error < best_error:
            best, best_error = position, error
    return _QMAX * 2.0**best


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    p = p / p.sum()
    q = q / q.sum() if q.sum() > 0 else q
    where = p > 0
    # A bin the quantized histogram left empty gets a tiny mass rather than an infinite cost.
    return float(np.sum(p[where] * np.log(p[where] / np.maximum(q[where], 1e-12))))
