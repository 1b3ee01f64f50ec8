"""A compiled CUDA region as it runs: its shared library loaded, initialised on the device with its
constants, and called with the host's buffers (see `generate` for what the library does).

The libraries a region opens are found where NVIDIA's pip wheels install them (`nvidia-cublas`,
`nvidia-cudnn-cu13`), else by name on the loader's path. What is missing (the driver, a library,
a device of the architecture the region was compiled for, device memory) is an EngineError
naming the region and what failed; byoc's runtime then says which region, or falls back where
the build does.
"""

from __future__ import annotations

import ctypes
import tempfile
import threading
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import numpy as np

from byoc.cache_dirs import library_cache_dir
from byoc.errors import EngineError

# (pip distributions that may hold it, its file name)
CUBLAS = (("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12"), "libcublas.so.13")
CUDNN = (("nvidia-cudnn-cu13", "nvidia-cudnn-cu12"), "libcudnn.so.9")


def library_path(candidates: tuple[tuple[str, ...], str]) -> str:
    """Where the pip wheels put the library, else its name (the dynamic loader's search)."""
    distributions, name = candidates
    for distribution in distributions:
        try:
            files = metadata.distribution(distribution).files or []
        except metadata.PackageNotFoundError:
            continue
        for file in files:
            if Path(str(file)).name == name:
                return str(Path(file.locate()).resolve())
    return name


def device_missing() -> str | None:
    """Why no CUDA device can run regions here, or None."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "NVIDIA's driver (libcuda.so.1) is not installed"
    count = ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return "there is no CUDA device"
    return None


class CudaEngine:
    """One region on one device. Calls are serialised: the region's device memory is one set."""

    def __init__(self, library: bytes, constants: Sequence[np.ndarray], where: str, device: int = 0) -> None:
        self.where = where
        missing = device_missing()
        if missing is not None:
            raise EngineError(f"{where}: {missing}")
        # Each engine loads its own copy: the library keeps the region's device memory in
        # file-scope variables, and two models of one architecture compile to the same library.
        directory = library_cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix="cuda-region-", suffix=".so") as copy:
            copy.write(library)
            copy.flush()
            try:
                self._library = ctypes.CDLL(copy.name)  # mapped: the file may go once loaded
            except OSError as error:
                raise EngineError(f"{where}: the region's library cannot be loaded: {error}") from error
        self._library.byoc_error.restype = ctypes.c_char_p
        self._constants = [np.ascontiguousarray(c) for c in constants]
        pointers = (ctypes.c_void_p * max(1, len(self._constants)))(*[c.ctypes.data for c in self._constants])
        status = self._library.byoc_init(library_path(CUBLAS).encode(), library_path(CUDNN).encode(), pointers, ctypes.c_int(device))
        self._check(status, "initialising it on the device")
        self._lock = threading.Lock()
        self._times = (ctypes.c_float * 2)()
        self.last_transfer_s = 0.0  # moving the last call's inputs and outputs between host and device
        self.last_execution_s = 0.0  # the last call's ops on the device

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise EngineError(f"{self.where}: {what} failed: {self._library.byoc_error().decode(errors='replace')}")

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        given = [np.ascontiguousarray(x) for x in inputs]
        for out in outputs:
            if not out.flags.c_contiguous:
                raise EngineError(f"{self.where}: an output buffer is not contiguous")
        ins = (ctypes.c_void_p * max(1, len(given)))(*[x.ctypes.data for x in given])
        outs = (ctypes.c_void_p * max(1, len(outputs)))(*[o.ctypes.data for o in outputs])
        with self._lock:
            self._check(self._library.byoc_run(ins, outs, self._times), "running")
            self.last_transfer_s, self.last_execution_s = self._times[0] / 1000.0, self._times[1] / 1000.0

    def __del__(self) -> None:
        library = getattr(self, "_library", None)
        if library is not None and hasattr(self, "_lock"):
            library.byoc_release()  # the region's device memory and library handles
