"""A region compiled by TVM, as it runs: the engine, and its saving and loading. Loading needs
TVM's runtime alone (a compiled region is a shared library); compiling it is `tvm_engine`'s."""

from __future__ import annotations

import os
import platform
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from byoc.backend.arrays import aligned
from byoc.backend.settings import BUILD, VendorSettings, setting

TARGET = "llvm"


@dataclass(frozen=True)
class TvmSettings(VendorSettings):
    """The settings of regions TVM compiles (the reference vendor's)."""

    target: str = setting(TARGET, "the TVM target regions are compiled for", applies=BUILD)


DEFAULT_SETTINGS = TvmSettings()
# TVM's VirtualMachine constructor is not thread-safe: threads creating VMs at once aborted the
# process (SIGABRT in _setup_device). Creation is once per thread, so one lock costs nothing.
_VM_CREATION = threading.Lock()


def _tensor(array: np.ndarray) -> tvm.runtime.Tensor:
    """`array` as a TVM tensor: a view where TVM takes one (the host's buffers), an aligned copy
    where its DLPack import refuses the memory (a slice, a transposed or read-only array,
    memory numpy allocated) or its kernels the strides (an empty array: numpy's are not dense)."""
    if array.size:
        try:
            return tvm.runtime.from_dlpack(array)
        except (RuntimeError, BufferError):
            pass
    return tvm.runtime.from_dlpack(aligned(array))


class TvmEngine:
    """A region compiled by TVM, its constants read as inputs after the region's own: the code
    holds no weight, so an embedded engine does not store the constants the artifact already
    holds (ResNet-18's regions on the reference vendor embedded 44 MiB of weights twice)."""

    def __init__(self, executable: tvm.runtime.Module, constants: Sequence[np.ndarray]) -> None:
        self.executable = executable
        self._constants = [_tensor(array) for array in constants]  # views of byoc's store where TVM takes them
        self._local = threading.local()

    def _vm(self) -> VirtualMachine:
        vm = getattr(self._local, "vm", None)
        if vm is None:
            with _VM_CREATION:
                vm = self._local.vm = VirtualMachine(self.executable, tvm.cpu())
        return vm

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        result = self._vm()["main"](*[_tensor(x) for x in inputs], *self._constants)
        results = [result] if isinstance(result, tvm.runtime.Tensor) else list(result)
        for out, value in zip(outputs, results):
            np.copyto(out, np.from_dlpack(value))


def constants_in_order(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    return [constants[name] for name in graph["constants"]]


def environment() -> dict[str, str]:
    """A saved engine is a shared library of machine code for this TVM, CPU architecture and OS,
    that reads its constants as inputs (one saved before took none, and is rebuilt)."""
    return {"tvm": tvm.__version__, "platform": f"{platform.system()}-{platform.machine()}", "constants": "inputs"}


def save_engine(engine: TvmEngine) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "engine.so")
        engine.executable.export_library(path)
        with open(path, "rb") as f:
            return f.read()


def load_engine(blob: bytes, graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], settings: VendorSettings) -> TvmEngine:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "engine.so")
        with open(path, "wb") as f:
            f.write(blob)
        return TvmEngine(tvm.runtime.load_module(path), constants_in_order(graph, constants))
