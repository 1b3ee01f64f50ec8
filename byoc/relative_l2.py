"""Relative L2 error, the measure byoc states its accuracy bounds in (the accuracy check, the
error a device's requantization adds, precision chosen by measurement): the square root of the
sum of squared differences over the sum of squared reference values, over every element of every
tensor compared, in float64."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


class RelativeL2:
    """Relative L2 error accumulated tensor by tensor."""

    def __init__(self) -> None:
        self.squared_error = 0.0
        self.squared_norm = 0.0

    def add(self, got: np.ndarray, want: np.ndarray) -> np.ndarray:
        """Count one pair of tensors; returns their difference (in float64)."""
        difference = np.asarray(got, np.float64) - want
        self.squared_error += float(np.sum(difference**2))
        self.squared_norm += float(np.sum(np.asarray(want, np.float64) ** 2))
        return difference

    @property
    def value(self) -> float:
        return (self.squared_error / self.squared_norm) ** 0.5 if self.squared_norm else 0.0


def relative_l2(got: Iterable[np.ndarray], want: Iterable[np.ndarray]) -> float:
    """The relative L2 error of `got` against `want`, paired tensor by tensor."""
    measure = RelativeL2()
    for g, w in zip(got, want):
        measure.add(g, w)
    return measure.value


def samples_relative_l2(got: Iterable[Iterable[np.ndarray]], want: Iterable[Iterable[np.ndarray]]) -> float:
    """Over every output of every sample: `got[s]` the outputs of sample s, as `want[s]`."""
    return relative_l2((g for gs in got for g in gs), (w for ws in want for w in ws))
