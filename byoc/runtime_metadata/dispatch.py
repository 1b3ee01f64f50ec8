"""How the host reaches regions that run through Python engines (JSON graphs, custom blobs).

RunCodegen turns each region call into `call_dps_packed("<symbol>", inputs..., outputs...)`; the
VM resolves such names in the global function registry when a VirtualMachine is created. Each
model registers its region callables under their symbols and creates its VM under one lock, so
two models with the same region symbols in one process each keep their own engines.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm.runtime.vm import VirtualMachine

from byoc.backend.engine import EngineContext
from byoc.backend.runtime import VendorRuntime
from byoc.backend.settings import BUILD, VendorSettings
from byoc.codegen_json.symbolic_dims import SymbolicDimError, is_symbolic, shape_at
from byoc.errors import ArtifactError, ByocError, EngineError
from byoc.runtime_metadata.artifact_types import EmbeddedEngine, RegionArtifact
from byoc.runtime_metadata.constants import ConstantStore
from byoc.runtime_metadata.engine_cache import EngineCache
from byoc.runtime_metadata.engines import EngineRecord, create_engine

_VM_CREATION = threading.Lock()
_MISSING_FUNCTION = re.compile(r"Cannot find ffi::Function (\S+)")


class RegionTimes:
    """Per-region time accumulated while profiling, in seconds."""

    def __init__(self) -> None:
        self.calls = 0
        self.transfer = 0.0
        self.execution = 0.0


class FailureRecord:
    """The error a region's last failed call on a thread raised. An exception raised in a call
    from the VM reaches the caller as a plain RuntimeError once it has crossed the VM: the
    original is kept for `CompiledModel.run`."""

    def __init__(self) -> None:
        self._local = threading.local()

    def remember(self, error: Exception, where: str) -> ByocError:
        """`error` as the caller gets it, kept: a byoc error as it is, any other wrapped in an
        EngineError that says `where` it happened."""
        kept = error if isinstance(error, ByocError) else EngineError(f"{where}: {type(error).__name__}: {error}")
        self._local.error = kept
        return kept

    def take(self) -> ByocError | None:
        """The error this thread's last failed call raised, once."""
        error = getattr(self._local, "error", None)
        self._local.error = None
        return error


def region_settings(backend: VendorRuntime, recorded: Mapping[str, Any] | None, values: Mapping[str, Any]) -> tuple[VendorSettings, bool]:
    """The vendor's settings a region's engine is made with: those its code was generated with
    (`recorded`, or the vendor's own in an artifact made before regions recorded them) under the
    build and load settings `values`; and whether they name the hardware the code must be bound
    to (recorded, or a hardware setting among `values`)."""
    settings = type(backend.settings).from_record(backend.name, recorded, ArtifactError) if recorded is not None else backend.settings
    hardware = {d.name for d in settings.declared(BUILD) if d.spec.hardware}
    return settings.replaced(backend.name, values, BUILD), recorded is not None or bool(hardware & set(values))


class RegionRuntime:
    """The callable the VM invokes for one region; creates the engine on first use."""

    def __init__(
        self,
        artifact: RegionArtifact,
        backend: VendorRuntime,
        store: ConstantStore,
        settings: VendorSettings,
        cache: EngineCache | None,
        embedded: EmbeddedEngine | None = None,
        strict_engines: bool = False,
        sole_work: bool = False,
        record: EngineRecord | None = None,
        hardware_given: bool = True,
    ) -> None:
        self.artifact = artifact
        self.context = EngineContext(artifact.symbol, sole_work)
        self.embedded = embedded
        self.strict_engines = strict_engines
        self.backend = backend
        self.store = store
        self.settings, self.hardware_given = settings, hardware_given  # see `region_settings`
        self.cache = cache
        self.record = record  # made and checked by `build`, or made on first use
        self.times: RegionTimes | None = None  # set while profiling
        self._num_inputs = len(artifact.inputs)
        self._lock = threading.Lock()
        self._where = f"region {artifact.symbol} ({artifact.backend})"
        self._expected = [(s.shape, np.dtype(s.dtype)) for s in [*artifact.inputs, *artifact.outputs]]
        # A region written with symbolic shapes is checked once per set of shapes it is given.
        self._symbolic = any(is_symbolic(shape) for shape, _ in self._expected)
        self._seen_shapes: set[tuple] = set()
        self._checked = False
        self._failure = FailureRecord()

    def ensure_engine(self) -> EngineRecord:
        if self.record is None:
            with self._lock:
                if self.record is None:
                    self.record = create_engine(self.artifact, self.backend, self.store, self.settings, self.cache,
                                                self.context, self.embedded, self.strict_engines, self.hardware_given)
        return self.record

    def _check(self, arrays: list[np.ndarray]) -> None:
        """The host's tensors against what the region was built for, on the first call (shapes
        are static) or the first with each set of shapes (symbolic ones): an engine must never
        read or write past what it was given."""
        got = [(a.shape, a.dtype) for a in arrays]
        if not self._symbolic:
            expected = self._expected
        elif tuple(got) in self._seen_shapes:
            return
        else:
            expected = self._at(got)
        if got != expected:
            raise ArtifactError(f"{self._where}: the host passes {[(s, str(d)) for s, d in got]}; the region was built for "
                              f"{[(s, str(d)) for s, d in expected]}")
        if self._symbolic:
            self._seen_shapes.add(tuple(got))
        else:
            self._checked = True

    def _at(self, got: list[tuple[tuple[int, ...], np.dtype]]) -> list[tuple[tuple[int, ...], np.dtype]]:
        """The symbolic shapes at the dimensions the given tensors hold plainly; a dimension
        that is an expression of others only is taken as given."""
        values: dict[str, int] = {}
        for (pattern, _), (shape, _) in zip(self._expected, got):
            if len(pattern) == len(shape):
                values.update({d: n for d, n in zip(pattern, shape) if isinstance(d, str) and d.isidentifier() and d not in values})
        expected = []
        for (pattern, dtype), (shape, _) in zip(self._expected, got):
            try:
                expected.append((shape_at(pattern, values), dtype))
            except SymbolicDimError:
                expected.append((shape if len(shape) == len(pattern) else tuple(pattern), dtype))
        return expected

    def __call__(self, *args: tvm.runtime.Tensor) -> None:
        times = self.times
        if times is None:
            arrays = [np.from_dlpack(a) for a in args]
            self.run_arrays(arrays[: self._num_inputs], arrays[self._num_inputs :])
            return
        start = time.perf_counter()
        arrays = [np.from_dlpack(a) for a in args]
        wrapped = time.perf_counter()
        self.run_arrays(arrays[: self._num_inputs], arrays[self._num_inputs :])
        done = time.perf_counter()
        # An engine on a device says how long the call's copies between host and device took.
        moved = getattr(self.record.engine, "last_transfer_s", 0.0) if self.record is not None else 0.0
        times.calls += 1
        times.transfer += wrapped - start + moved
        times.execution += done - wrapped - moved

    def run_arrays(self, inputs: list[np.ndarray], outputs: list[np.ndarray], shaped_here: bool = False) -> None:
        """The engine on the host's buffers (the VM's, or those `CompiledModel` keeps for a model
        that is this region alone: see byoc.runtime_metadata.direct). `shaped_here`: the caller
        made the outputs from this region's own shapes at dimensions it checked, so the check of
        every new set of shapes (a decoding step's, 0.13 ms) is not made again."""
        try:
            record = self.record or self.ensure_engine()
            if not self._checked and not shaped_here:  # always False for symbolic shapes
                self._check([*inputs, *outputs])
            record.engine.run(inputs, outputs)
        except Exception as error:
            failure = self._failure.remember(error, f"{self._where}: the engine failed")
            if failure is error:
                raise
            raise failure from error

    def run_new_arrays(self, inputs: list[np.ndarray], outputs: list[tuple[tuple[int, ...], np.dtype]]) -> list[np.ndarray] | None:
        """The engine on `inputs` into outputs it allocates (`run_new`, see byoc.backend.engine),
        checked against the `outputs` (shape, dtype) the caller computed; None where the engine
        does not allocate."""
        try:
            record = self.record or self.ensure_engine()
            run_new = getattr(record.engine, "run_new", None)
            if run_new is None:
                return None
            made = list(run_new(inputs))
            if [(tuple(a.shape), a.dtype) for a in made] != [(tuple(shape), dtype) for shape, dtype in outputs]:
                raise EngineError(f"{self._where}: run_new gave outputs {[(a.shape, str(a.dtype)) for a in made]}, "
                                  f"not the region's {[(shape, str(dtype)) for shape, dtype in outputs]}")
            return made
        except Exception as error:
            failure = self._failure.remember(error, f"{self._where}: the engine failed")
            if failure is error:
                raise
            raise failure from error

    def take_failure(self) -> ByocError | None:
        """The error this thread's last failed call raised, once."""
        return self._failure.take()


def create_vm(host: tvm.runtime.Module, regions: Iterable[RegionRuntime], artifacts: Iterable[RegionArtifact],
              others: Mapping[str, Callable] | None = None, memory: str = "pooled") -> VirtualMachine:
    """A VirtualMachine whose region calls reach these `regions` (and `others`, callables by
    symbol: shape-specialised regions), allocating with TVM's `memory` allocator. A region the
    host code calls but that the model does not have (an inconsistent artifact) is an
    ArtifactError."""
    with _VM_CREATION:
        symbols = []
        for symbol, callable_ in [*((region.artifact.symbol, region) for region in regions), *(others or {}).items()]:
            tvm_ffi.register_global_func(symbol, callable_, override=True)
            symbols.append(symbol)
        try:
            return VirtualMachine(host, tvm.cpu(), memory_cfg=memory)
        except Exception as error:  # TVM errors share no base class
            missing = _MISSING_FUNCTION.search(str(error))
            if missing is None:
                raise
            known = sorted(a.symbol for a in artifacts)
            raise ArtifactError(f"the host code calls region {missing.group(1)}, which the model does not have "
                                f"(its regions: {', '.join(known) or 'none'})") from None
        finally:
            # The VM holds the functions it resolved; the registry must not keep this model alive.
            for symbol in symbols:
                tvm_ffi.registry.remove_global_func(symbol)
