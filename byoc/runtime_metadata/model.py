"""`CompiledModel`: the metadata module (paper section 3.4).

It holds the constants of every region once, the host library (host code plus C regions), and
the accelerator sub-modules (JSON graphs, custom blobs) with their engines; it runs the model,
profiles it and writes it to one artifact file.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence

import numpy as np
import tvm
from tvm import relax

from byoc.backend.spec import Backend
from byoc.errors import ByocError, InputError
from byoc.partition.record import PartitionRecord
from byoc.partition.report import PartitionReport
from byoc.runtime_metadata.artifact_types import RegionArtifact, TensorSpec
from byoc.runtime_metadata.constants import ConstantStore
from byoc.runtime_metadata.dispatch import RegionRuntime, create_vm
from byoc.runtime_metadata.engine_cache import EngineCache
from byoc.runtime_metadata.host_library import load_host_library


class CompiledModel:
    def __init__(
        self,
        host_library: bytes,
        artifacts: list[RegionArtifact],
        backends: Mapping[str, Backend],
        store: ConstantStore,
        inputs: list[TensorSpec],
        outputs: list[TensorSpec],
        target: str,
        vendor_origins: Mapping[str, str],
        backend_options: Mapping[str, dict] | None = None,
        cache: EngineCache | None = None,
        partition: dict | None = None,
        build_fallbacks: Mapping[str, str] | None = None,
    ) -> None:
        self.host_library = host_library
        self.artifacts = artifacts
        self.store = store
        self.inputs = inputs
        self.outputs = outputs
        self.target = target
        self.vendor_origins = dict(vendor_origins)
        self.backend_options = {name: dict(opts) for name, opts in (backend_options or {}).items()}
        self.partition = partition  # the partition record, when the module came from partition_for
        self.build_fallbacks = dict(build_fallbacks or {})  # region symbol -> why it runs on the host
        self.regions = {
            a.symbol: RegionRuntime(a, backends[a.backend], store, self.backend_options.get(a.backend, {}), cache)
            for a in artifacts
            if a.codegen != "c"
        }
        self.host = load_host_library(host_library, artifacts, store)
        self._local = threading.local()

    # ------------------------------------------------------------------ running
    def virtual_machine(self) -> relax.VirtualMachine:
        """This thread's TVM VirtualMachine for the model (for callers that pass TVM tensors
        themselves and skip `run`'s input checks and numpy conversion)."""
        return self._vm()

    def _vm(self) -> relax.VirtualMachine:
        # A VirtualMachine is not safe to share between threads; each thread gets its own.
        vm = getattr(self._local, "vm", None)
        if vm is None:
            vm = self._local.vm = create_vm(self.host, self.regions.values())
        return vm

    def create_engines(self) -> None:
        """Build every engine now rather than on first use."""
        for region in self.regions.values():
            region.ensure_engine()

    def _arrange_inputs(self, args: Sequence, named: Mapping[str, object]) -> list[np.ndarray]:
        expected = self.inputs
        if args and named:
            raise InputError("give inputs either by position or by name, not both")
        if named:
            unknown = sorted(set(named) - {spec.name for spec in expected})
            if unknown:
                raise InputError(f"unknown input(s) {unknown}; the model's inputs are {[s.name for s in expected]}")
            missing = [spec.name for spec in expected if spec.name not in named]
            if missing:
                raise InputError(f"missing input(s) {missing}")
            args = [named[spec.name] for spec in expected]
        if len(args) != len(expected):
            raise InputError(f"the model takes {len(expected)} input(s) ({', '.join(s.name for s in expected)}), got {len(args)}")
        arrays = []
        for spec, value in zip(expected, args):
            array = value.numpy() if isinstance(value, tvm.runtime.Tensor) else np.asarray(value)
            if array.dtype != np.dtype(spec.dtype):
                raise InputError(f"input {spec.name!r}: expected dtype {spec.dtype}, got {array.dtype}")
            if tuple(array.shape) != spec.shape:
                raise InputError(f"input {spec.name!r}: expected shape {spec.shape}, got {tuple(array.shape)}")
            arrays.append(np.require(array, requirements="C"))
        return arrays

    def run(self, *inputs, **named_inputs) -> list[np.ndarray]:
        """Run the model; inputs by position or by name. Returns every output as numpy."""
        arrays = self._arrange_inputs(inputs, named_inputs)
        vm = self._vm()
        # Inputs are copied into buffers this thread keeps: a fresh allocation per run would pay
        # page faults on every call (0.1 ms or more for a 224x224 image).
        buffers = getattr(self._local, "inputs", None)
        if buffers is None:
            buffers = self._local.inputs = [tvm.runtime.empty(s.shape, s.dtype) for s in self.inputs]
        for buffer, array in zip(buffers, arrays):
            buffer.copyfrom(array)
        return _as_arrays(vm["main"](*buffers))

    def profile(self, *inputs, repeat: int = 10, **named_inputs):
        """Time spent per region and on the host (see `byoc.runtime_metadata.profile`)."""
        from byoc.runtime_metadata.profile import profile_model

        return profile_model(self, self._arrange_inputs(inputs, named_inputs), repeat)

    def report(self) -> PartitionReport:
        """The partition report, with what each vendor estimated for its regions at build time
        (cycles, memory) and the regions that fell back to the host during the build."""
        if self.partition is None:
            raise ByocError("this model was not partitioned by byoc.partition_for: it has no partition record")
        estimates = {a.symbol: a.info for a in self.artifacts if a.info}
        return PartitionReport.from_record(PartitionRecord.from_dict(self.partition), estimates, self.build_fallbacks)

    # ---------------------------------------------------------------- artifact
    def export(self, path: str | os.PathLike) -> None:
        """Write host library, accelerator sub-modules and constants to one artifact file."""
        from byoc.runtime_metadata.artifact import write_artifact

        write_artifact(self, path)

    def inspect(self) -> dict:
        return {
            "target": self.target,
            "inputs": [vars(s) for s in self.inputs],
            "outputs": [vars(s) for s in self.outputs],
            "host_library_bytes": len(self.host_library),
            "constants": {"count": len(self.store.names()), "unique": len(self.store.contents()), "bytes": self.store.nbytes},
            "regions": [
                {
                    **a.describe(),
                    "constant_bytes": sum(self.store.get(n).nbytes for n in a.constants),
                    "engine": _engine_state(self.regions.get(a.symbol)),
                }
                for a in self.artifacts
            ],
            "vendors": self.vendor_origins,
        }


def _engine_state(region: RegionRuntime | None) -> str:
    if region is None:
        return "linked into the host library"
    if region.record is None:
        return "not built yet"
    return f"{region.record.source} in {region.record.seconds:.3f} s"


def _as_arrays(result) -> list[np.ndarray]:
    """The model's outputs as numpy arrays: a shape the model returns (ONNX Shape of a static
    tensor) is an int64 vector, a scalar a 0-d array."""
    if isinstance(result, tvm.runtime.Tensor):
        return [np.from_dlpack(result).copy()]
    if isinstance(result, tvm.runtime.ShapeTuple):
        return [np.array(list(result), dtype=np.int64)]
    if isinstance(result, (int, float, bool)):
        return [np.array(result)]
    return [item for value in result for item in _as_arrays(value)]
