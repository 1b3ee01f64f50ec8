"""Values that depend on a model's shape only, computed once per shape.

A compile for one shape folds into constants everything that depends only on the shape: position
ids, attention masks and the arange and broadcast arithmetic around them, T5's relative
position bias (`sequence` x `sequence` x heads). A model with dynamic dimensions cannot fold
them, and computing them on every run cost T5 2.3x at 1 x 512 tokens. So the host hoists them:

- `hoist_shape_values` (byoc.runtime_metadata.hoist_shape_values) moves every binding of `main` that reads only constants and the model's
  dimensions into a function of its own (`byoc_shape_values_compute`, taking the dimensions as
  a shape), and `main` asks for them by a packed call (`byoc_shape_values`);
- `ShapeValues` answers that call: it runs the function once per shape and keeps the results
  (at most `KEPT_SHAPES` shapes and `KEPT_BYTES` of tensors, and within the model's one limit of
  what it keeps per shape, `byoc.runtime_metadata.shape_memory`; least recently used first out).
  The results are tensors the VM only reads.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable

import numpy as np
import tvm

from byoc.runtime_metadata.numpy_views import numpy_view
from byoc.runtime_metadata.shape_memory import ShapeMemory

SHAPE_VALUES = "byoc_shape_values"  # the packed call `main` makes, answered by `ShapeValues`
SHAPE_VALUES_FUNCTION = "byoc_shape_values_compute"  # the host's function that computes them
# A generation loop meets a new cache length at every step, and a server meets them all again
# with every request: kept for 16 shapes only, a tiny GPT-2's 64-token generation computed its
# values again at every step of every request (23 us of a 150 us step). A decoding step's values
# are small (its positions and mask over the cache), a long prompt's mask is not: both bounds hold.
# An encoder's values are its masks, 1 MiB at batch 16 and 128 tokens: a tiny BERT called at
# random shapes kept 70 MiB of them under a 64 MiB bound, 32 MiB grew its memory to 1.6-1.7x
# onnxruntime's, and 16 MiB keeps it within 1.2x, each at the same speed: past 16 MiB, keeping
# them gains no time (benchmarks/shape_memory.py).
KEPT_SHAPES = 1024
KEPT_BYTES = 16 << 20


class ShapeValues:
    """Answers `main`'s call of `byoc_shape_values`: the values for these dimensions, computed
    once (by `compute`, the host's own function) and kept."""

    OWNER = "values of the shape alone"  # as the profile names them

    def __init__(self, compute: Callable[[], Callable], memory: ShapeMemory | None = None) -> None:
        self._compute = compute  # -> the host's byoc_shape_values, on a machine of its own
        self._function: Callable | None = None
        self._kept: collections.OrderedDict[tuple[int, ...], list] = collections.OrderedDict()  # [values, their bytes, (tensor, view) pairs or None]
        self._kept_bytes = 0
        self._memory = memory if memory is not None else ShapeMemory()
        self._lock = threading.Lock()

    def __call__(self, dims: tvm.runtime.ShapeTuple):
        return self._entry(tuple(int(d) for d in dims))[0]

    def held(self) -> str:
        """What is kept, as a profile says it."""
        with self._lock:
            count, nbytes = len(self._kept), self._kept_bytes
        return f"{count} shape(s), {nbytes / 2**20:.1f} MiB (at most {KEPT_SHAPES} within {KEPT_BYTES / 2**20:.0f} MiB)"

    def kept(self, dims: tuple[int, ...]) -> list[tuple[tvm.runtime.Tensor, np.ndarray]]:
        """The values for these dimensions, each a tensor and its numpy view, in the function's
        order, kept with them: a model that is one region is called with them directly (each
        view made per call, and the shape asked through the VM's types, took 10 us a decoding
        step)."""
        entry = self._entry(dims)
        if entry[2] is None:
            entry[2] = [(value, numpy_view(value)) for value in entry[0]]
        return entry[2]

    def _entry(self, key: tuple[int, ...]) -> list:
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                self._memory.used(self.OWNER, key)
                return kept
            if self._function is None:
                self._function = self._compute()
            values = self._function(tvm.runtime.ShapeTuple(key))
            kept = self._kept[key] = [values, _bytes(values), None]
            self._kept_bytes += kept[1]
            while len(self._kept) > 1 and (len(self._kept) > KEPT_SHAPES or self._kept_bytes > KEPT_BYTES):
                old, entry = self._kept.popitem(last=False)
                self._kept_bytes -= entry[1]
                self._memory.forget(self.OWNER, old)
        # Counted outside this lock: what the limit drops may be this object's
        self._memory.keep(self.OWNER, key, kept[1], lambda: self._drop(key))
        return kept

    def _drop(self, key: tuple[int, ...]) -> None:
        with self._lock:
            entry = self._kept.pop(key, None)
            if entry is not None:
                self._kept_bytes -= entry[1]


def _bytes(values) -> int:
    """The bytes of the tensors `byoc_shape_values` returns (tensors only: see `_hoisted`)."""
    return sum(math.prod(value.shape) * np.dtype(value.dtype).itemsize for value in values)
