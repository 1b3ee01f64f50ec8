"""Arrays as TVM takes them: what an engine hands to TVM, and what byoc's constant store keeps."""

from __future__ import annotations

import numpy as np

ALIGNMENT = 64  # what TVM's DLPack import requires, and what vector kernels like


def _dense_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    """The strides, in bytes, of a dense row-major array: what TVM's kernels check their
    arguments against, also where a dimension is 0 (numpy gives an empty array other strides)."""
    strides, step = [], itemsize
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def aligned(array: np.ndarray) -> np.ndarray:
    """A dense, writable copy of `array` whose data starts on a 64-byte boundary (or `array`
    itself when it already is one), so that TVM can use it without another copy: its DLPack
    import refuses other memory (unaligned, strided, read-only), and its kernels refuse an
    empty array with numpy's strides ((0, 0) for shape (2, 0), where they want (0, 1))."""
    if (array.flags.c_contiguous and array.flags.writeable and array.ctypes.data % ALIGNMENT == 0
            and (array.size or array.strides == _dense_strides(array.shape, array.itemsize))):
        return array
    raw = np.empty(array.nbytes + ALIGNMENT, dtype=np.uint8)
    offset = -raw.ctypes.data % ALIGNMENT
    # Made on the buffer rather than sliced from it: numpy leaves an empty slice at its base's address.
    result = np.ndarray(array.shape, array.dtype, buffer=raw, offset=offset, strides=_dense_strides(array.shape, array.itemsize))
    np.copyto(result, array)
    return result
