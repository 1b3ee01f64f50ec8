"""An engine that compiles a region's JSON graph with TVM itself (LLVM, untuned).

It lets partitioned modules run before a real vendor exists, and it is the reference that
tests compare partitioned and unpartitioned results with.
"""

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
from tvm import relax

from byoc.backend.arrays import aligned
from byoc.backend.settings import BUILD, VendorSettings, setting
from byoc.codegen_json.to_relax import constants_as_inputs, graph_to_relax

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

    def _vm(self) -> relax.VirtualMachine:
        vm = getattr(self._local, "vm", None)
        if vm is None:
            with _VM_CREATION:
                vm = self._local.vm = relax.VirtualMachine(self.executable, tvm.cpu())
        return vm

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        result = self._vm()["main"](*[_tensor(x) for x in inputs], *self._constants)
        results = [result] if isinstance(result, tvm.runtime.Tensor) else list(result)
        for out, value in zip(outputs, results):
            np.copyto(out, np.from_dlpack(value))


def _constants_in_order(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    return [constants[name] for name in graph["constants"]]


def build_engine(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], settings: VendorSettings) -> TvmEngine:
    """The region compiled by TVM: for the target `settings` name (TvmSettings), else LLVM for
    this CPU (a vendor that runs its regions through TVM with settings of its own)."""
    func = graph_to_relax(constants_as_inputs(graph), {})
    target = settings.target if isinstance(settings, TvmSettings) else TARGET
    executable = relax.build(tvm.IRModule({"main": func}), target=target)
    return TvmEngine(executable, _constants_in_order(graph, constants))


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
        return TvmEngine(tvm.runtime.load_module(path), _constants_in_order(graph, constants))
