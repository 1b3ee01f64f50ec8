"""From the values a tensor took over the calibration set to the range int8 scales cover.

- `minmax`: the observed extremes. Nothing is clipped, but one outlier coarsens the step for
  every other value.
- `percentile`: the 99.99th percentile of |x| (PyTorch's and TensorRT's percentile
  calibrators use this neighbourhood): the rarest 0.01% of values are clipped.
- `entropy`: the threshold whose 128-level quantized histogram of |x| is closest, by
  Kullback-Leibler divergence, to the clipped one (TensorRT's entropy calibrator, after
  Migacz, "8-bit inference with TensorRT", GTC 2017).

Percentile and entropy need the distribution, not only the extremes: each tensor keeps a
bounded, seeded random sample of its absolute values (at most `_PER_CALL` per run and
`_KEPT` in all), which is enough to place a 99.99th percentile on tensors of a few thousand
values and a 2048-bin histogram on larger ones.
"""

from __future__ import annotations

import numpy as np

METHODS = ("minmax", "percentile", "entropy")
PERCENTILE = 99.99
_PER_CALL = 1 << 15
_KEPT = 1 << 17
_BINS = 2048
_LEVELS = 128
_STEP = 8  # candidate thresholds are every 8th bin edge from the 128th


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
        limit = float(np.percentile(values, PERCENTILE)) if self.method == "percentile" else entropy_threshold(values)
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


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    p = p / p.sum()
    q = q / q.sum() if q.sum() > 0 else q
    where = p > 0
    # A bin the quantized histogram left empty gets a tiny mass rather than an infinite cost.
    return float(np.sum(p[where] * np.log(p[where] / np.maximum(q[where], 1e-12))))
