"""`CompiledModel`: the metadata module (paper section 3.4).

It holds the constants of every region once, the host library (host code plus C regions), and
the accelerator sub-modules (JSON graphs, custom blobs) with their engines; it runs the model,
profiles it and writes it to one artifact file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
from tvm.runtime.vm import VirtualMachine

from byoc.backend.runtime import VendorRuntime, checked_backend_options, vendor_runtime
from byoc.cache_dirs import default_cache_dir
from byoc.compiler_presence import compiler_missing
from byoc.errors import ArtifactError, ByocError, MissingVendorError, UnknownBackendError
from byoc.host.index_ranges import engine_index_error, take_index_error
from byoc.partition.reasons import SHAPE_ONLY
from byoc.partition.record import PartitionRecord
from byoc.partition.report_table import PartitionReport
from byoc.processing.saturation import warn_where_inexact
from byoc.runtime_metadata.artifact import read_artifact, write_artifact
from byoc.runtime_metadata.artifact_types import ModelParts, RegionArtifact, SpecialisedRegion, TensorSpec
from byoc.runtime_metadata.constants import ConstantStore
from byoc.runtime_metadata.dispatch import RegionRuntime, region_settings
from byoc.runtime_metadata.engine_cache import EngineCache
from byoc.runtime_metadata.engines import EngineRecord, save_for_embedding
from byoc.runtime_metadata.host_library import load_host_library
from byoc.runtime_metadata.inputs import ModelInputs
from byoc.runtime_metadata.inspection import describe
from byoc.runtime_metadata.profile import ProfileReport, ProfileRow, profile_model
from byoc.runtime_metadata.runners import DirectRunner, DynamicRunner, StaticRunner, ThreadVMs
from byoc.runtime_metadata.shape_memory import ShapeMemory, check_shape_memory
from byoc.runtime_metadata.shape_values import SHAPE_VALUES, SHAPE_VALUES_FUNCTION, ShapeValues
from byoc.runtime_metadata.signing import PrivateKey, PublicKey
from byoc.runtime_metadata.tail import TailRunner, time_tail

if TYPE_CHECKING:
    from byoc.backend.spec import Backend
    from byoc.runtime_metadata.shapes import SpecialisedRuntime


class CompiledModel:
    """A compiled model: its parts (see `ModelParts`), the backends that run its regions, and
    the engines, host library and virtual machines made from them."""

    def __init__(self, parts: ModelParts, backends: Mapping[str, VendorRuntime], cache: EngineCache | None = None,
                 source: str = "this build", strict_engines: bool = False,
                 engines: Mapping[str, EngineRecord] | None = None, data_sheets: Mapping[str, Backend] | None = None) -> None:
        self.parts = parts
        # The backends that generate code for shapes met at run time (shape-specialised regions):
        # the build's, or looked up by name (which needs the compiler).
        self._data_sheets = dict(data_sheets or {})
        sole_work = one_region_only(parts.partition, parts.artifacts, parts.build_fallbacks)
        engines = engines or {}
        self.regions = {}
        for a in parts.artifacts:
            if not a.linked_into_host:
                settings, hardware_given = region_settings(backends[a.backend], a.settings, parts.backend_options.get(a.backend, {}))
                self.regions[a.symbol] = RegionRuntime(a, backends[a.backend], parts.store, settings, cache, parts.engines.get(a.symbol),
                                                       strict_engines, sole_work, engines.get(a.symbol), hardware_given)
        for backend in sorted({a.backend for a in parts.artifacts}):
            backends[backend].codegen.prepare_runtime()
        self.host = load_host_library(parts, f"{source}: the host library")
        self._backends = backends
        self._cache = cache
        self.shape_memory = ShapeMemory(parts.shape_memory)  # what is kept per shape met, within one limit
        self.specialised = {region.symbol: self._specialised_runtime(region) for region in parts.specialised}
        # What the host calls by name: the shape-specialised regions (C for every shape in the
        # host library directly, see `host_function`), and the values that depend on the shape
        # only (see byoc.runtime_metadata.shape_values).
        self._by_name: dict[str, Callable] = {symbol: runtime.host_function() or runtime for symbol, runtime in self.specialised.items()}
        self._vms = ThreadVMs(self.host, self.regions, parts.artifacts, self._by_name, dynamic=bool(parts.dims))
        if parts.dims:
            self._by_name[SHAPE_VALUES] = ShapeValues(lambda: self._vms.of_its_own()[SHAPE_VALUES_FUNCTION], self.shape_memory)
        self._inputs = ModelInputs(parts)
        # How a run goes, by what the model is (see byoc.runtime_metadata.runners); `run` picks
        # one by its parts at each call.
        self._static = StaticRunner(self._vms, parts.inputs)
        self._dynamic = DynamicRunner(self._vms, parts.inputs)
        self._direct = DirectRunner(parts, self.regions, self.host, self.specialised, self._by_name)
        self._tail = TailRunner(parts.tail, [s.name for s in parts.outputs], source) if parts.tail is not None else None

    def _specialised_runtime(self, region: SpecialisedRegion) -> SpecialisedRuntime:
        """The dispatcher of a shape-specialised region over its variants: those built ahead run
        as any region does (C in the host library, JSON through their engines)."""
        ahead = {key: self.regions[symbol] if symbol in self.regions else self.host.get_function(symbol, query_imports=True)
                 for key, symbol in region.variants.items()}
        by_symbol = {a.symbol: a for a in self.parts.artifacts}
        artifacts = {key: by_symbol[symbol] for key, symbol in region.variants.items()}
        recorded = next((a.settings for a in artifacts.values() if a.settings is not None), None)
        settings, hardware_given = region_settings(self._backends[region.backend], recorded,
                                                   self.parts.backend_options.get(region.backend, {}))
        # Variants made here are generated by the vendor's data sheet, with TVM's compiler: both
        # are imported only for a model with such regions (`load` refuses one where the
        # compiler is missing, see `needs_compiler`).
        from byoc.backend.registry import get_backend
        from byoc.runtime_metadata.shapes import SpecialisedRuntime

        if region.backend not in self._data_sheets:
            self._data_sheets[region.backend] = get_backend(region.backend)
        backend = self._data_sheets[region.backend].with_settings(settings)

        def make_runtime(artifact: RegionArtifact, store: ConstantStore) -> RegionRuntime:
            return RegionRuntime(artifact, backend, store, settings, self._cache, hardware_given=hardware_given)

        return SpecialisedRuntime(region, backend, self.parts.store, settings, self.parts.dims, ahead, make_runtime,
                                  self.parts.max_shapes, artifacts, self.shape_memory)

    @property
    def artifacts(self) -> list[RegionArtifact]:
        return self.parts.artifacts

    @property
    def store(self) -> ConstantStore:
        return self.parts.store

    @property
    def inputs(self) -> list[TensorSpec]:
        return self.parts.inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        """The model's outputs (a model with a tail: the tail's, see byoc.ir.tail)."""
        return self._tail.outputs if self._tail is not None else self.parts.outputs

    @property
    def build_fallbacks(self) -> dict[str, str]:
        return self.parts.build_fallbacks

    # ------------------------------------------------------------------ running
    def virtual_machine(self) -> VirtualMachine:
        """This thread's TVM VirtualMachine for the model (for callers that pass TVM tensors
        themselves and skip `run`'s input checks and numpy conversion)."""
        return self._vms.get()

    def create_engines(self) -> None:
        """Build every engine now rather than on first use."""
        for region in self.regions.values():
            region.ensure_engine()

    def embed_engines(self) -> list[str]:
        """Build every engine now and keep those their vendors can save, so that `export` writes
        them into the artifact and a load on a like machine skips the build (TensorRT: tens of
        seconds per engine). Returns the symbols of the regions whose engines are embedded."""
        self.create_engines()
        for symbol, region in self.regions.items():
            embedded = save_for_embedding(region.record, region.artifact, region.backend, region.store, region.settings)
            if embedded is not None:
                self.parts.engines[symbol] = embedded
        return sorted(self.parts.engines)

    def dims_of_inputs(self, arrays: Sequence[np.ndarray]) -> dict[str, int]:
        """The value of each named dimension in these inputs, checked (see `ModelInputs.dims_of`)."""
        return self._inputs.dims_of(arrays)

    def run(self, *inputs, **named_inputs) -> list[np.ndarray]:
        """Run the model; inputs by position or by name. Returns every output as numpy."""
        outputs = self._compiled_part(self._inputs.arranged(inputs, named_inputs))
        return self._tail.run(outputs) if self._tail is not None else outputs

    def _compiled_part(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """The outputs of the compiled model (of its head, for a model with a tail)."""
        try:
            if self.parts.direct_call is not None:  # its one region takes every shape
                return self._direct.run(arrays, self._inputs.dims_of(arrays) if self.parts.dims else None)
            if self.parts.dims:
                return self._dynamic.run(arrays, self._inputs.dims_of(arrays))
            return self._static.run(arrays)
        except Exception as error:
            _raise_what_failed(error, [*self.specialised.values(), *self.regions.values()])
            raise

    def profile(self, *inputs, repeat: int = 10, **named_inputs) -> ProfileReport:
        """Time spent per region and on the host (see `byoc.runtime_metadata.profile`)."""
        arrays = [np.require(a, requirements="C") for a in self._inputs.arranged(inputs, named_inputs)]
        self.create_engines()
        report = profile_model(self._vms.get(), self.parts.artifacts, self.regions, arrays, repeat, self.specialised)
        report.held = self.held()
        if self._tail is not None:
            tail_ms = time_tail(self._tail, self._compiled_part(arrays), repeat)
            report.rows.append(ProfileRow("tail", "onnxruntime", 1, 0.0, 0.0, tail_ms, 0.0))
            report.median_run_ms += tail_ms
        return report

    def held(self) -> dict[str, str]:
        """What this model keeps for the shapes it has met, and how its host allocates: a model
        with dynamic dimensions grows with the shapes it is called at, within these bounds."""
        if not self.parts.dims:
            return {}
        held = {"host memory": f"TVM's {self._vms.memory} allocator (each buffer allocated when needed)",
                "kept per shape": self.shape_memory.summary()}
        by_owner = self.shape_memory.held()
        values = self._by_name.get(SHAPE_VALUES)
        if isinstance(values, ShapeValues):
            held[ShapeValues.OWNER] = values.held()
        for symbol, runtime in self.specialised.items():
            if runtime.region.symbolic and runtime.host_function() is not None:
                continue  # one C library for every shape: nothing is made per shape
            counted = by_owner.get(runtime.where)
            weight = (f", {counted[1] / 2**20:.1f} MiB of constants" if counted else
                      ", C libraries that stay loaded" if runtime.made else "")
            held[f"{symbol} variants made at run time"] = f"{len(runtime.made)} (at most {runtime.max_shapes}){weight}"
        for name in sorted({artifact.backend for artifact in self.parts.artifacts}):
            library = self._backends[name].codegen
            if getattr(library, "held", None) is not None:
                held[f"{name}'s {library.name} library"] = library.held()
        return held

    def report(self) -> PartitionReport:
        """The partition report, with what each vendor estimated for its regions at build time
        (cycles, memory) and the regions that fell back to the host during the build."""
        if self.parts.partition is None:
            raise ByocError("this model was not partitioned by byoc.partition_for: it has no partition record")
        estimates = {a.symbol: a.info for a in self.artifacts if a.info}
        result = PartitionReport.from_record(PartitionRecord.from_dict(self.parts.partition), estimates, self.build_fallbacks)
        if self.parts.tail is not None:
            result.tail = self.parts.tail.describe()
        if self.parts.dims:
            result.note_dims(self.parts.dims, (region.symbol for region in self.parts.specialised if not region.symbolic),
                             (region.symbol for region in self.parts.specialised if region.symbolic), self.parts.dims_origin)
        return result

    # ---------------------------------------------------------------- artifact
    def export(self, path: str | os.PathLike, sign_key: PrivateKey | None = None) -> None:
        """Write host library, accelerator sub-modules and constants to one artifact file,
        signed with `sign_key` (an Ed25519 private key) when given."""
        write_artifact(self.parts, path, sign_key)

    def inspect(self) -> dict:
        return describe(self)


def _raise_what_failed(error: Exception, regions: list) -> None:
    """Raise what made a run fail, where byoc knows more than `error` says: an index out of its
    range (the host's check, or an engine's, named by its region), or the exception a region's
    engine raised, which TVM's FFI turned into a RuntimeError on the way out. Returns where it
    knows nothing more."""
    index_error = take_index_error()  # a stale one (from a profile run) does not match this error
    if index_error is not None and str(index_error) in str(error):
        raise index_error from None
    for region in regions:
        failure = region.take_failure()
        if failure is not None:
            artifact = getattr(region, "artifact", None)
            # A shape-specialised region has no one artifact: its variant's graph is of
            # one shape, and the engine's message gives the index and its range.
            if artifact is not None:
                where = f"in region {artifact.symbol} ({artifact.backend})"
                payload = artifact.payload if artifact.codegen == "json" else b"{}"
            else:
                where, payload = f"in {getattr(region, 'where', 'a region')}", b"{}"
            index_error = engine_index_error(str(failure), payload, where)
            if index_error is not None:
                raise index_error from failure
            # raise the original, with the vendor's exception (and its traceback) as its cause
            raise failure from failure.__cause__


def one_region_only(partition: dict | None, artifacts: Sequence[RegionArtifact], build_fallbacks: Mapping[str, str]) -> bool:
    """Whether the model is one region and nothing else per run: its partition left no op on the
    host but those a model with dynamic dimensions computes once per shape, and no region fell
    back at build (a model not partitioned by byoc says nothing: False)."""
    if partition is None or len(artifacts) != 1 or build_fallbacks:
        return False
    return all(host.reasons == [SHAPE_ONLY] for host in PartitionRecord.from_dict(partition).host_ops)


def engines_built_here(parts: ModelParts, backends: Mapping[str, VendorRuntime]) -> list[RegionArtifact]:
    """The regions whose engines this machine must build from their code with TVM's compiler: no
    engine embedded in the artifact, or one built for another machine."""
    def embedded_here(artifact: RegionArtifact) -> bool:
        embedded = parts.engines.get(artifact.symbol)
        return embedded is not None and embedded.environment == backends[artifact.backend].codegen.machine()

    return [a for a in parts.artifacts
            if not a.linked_into_host and backends[a.backend].codegen.builds_with_compiler and not embedded_here(a)]


def dispatched_per_shape(parts: ModelParts) -> list[str]:
    """The model's regions of dynamic dimensions, each as why running it needs TVM's compiler: their
    dispatch over shapes reads the vendor's data sheet, and a region not written symbolically is
    generated for each shape it meets."""
    return [f"region {region.symbol} ({region.backend}) "
            + ("takes its dynamic dimensions through a dispatch that reads its vendor's data sheet" if region.symbolic
               else "is generated for each shape it meets") for region in parts.specialised]


def needs_compiler(parts: ModelParts, backends: Mapping[str, VendorRuntime], label: str) -> None:
    """Where TVM's compiler is missing (a runtime-only install, see byoc.deploy), an ArtifactError
    before any region runs for each part of the model that would generate or compile code: a
    region of dynamic dimensions (`dispatched_per_shape`), and a region whose engine must be built
    here (`engines_built_here`)."""
    missing = compiler_missing()
    if missing is None:
        return
    needs = dispatched_per_shape(parts)
    needs += [f"region {a.symbol} ({a.backend}): its engine is built from the region's code"
              + (" (the one embedded was built for another machine)" if a.symbol in parts.engines else "")
              for a in engines_built_here(parts, backends)]
    if needs:
        raise ArtifactError(f"{label} cannot run without byoc's compiler: {'; '.join(needs)}. {missing}; or build the artifact "
                            "with engines='embed' (byoc deploy embeds them) on a machine like this one")


def _vendor(name: str, parts: ModelParts, label: str) -> VendorRuntime:
    """What running the artifact's regions of vendor `name` needs, checked against the artifact
    before any region runs."""
    try:
        runtime = vendor_runtime(name)
    except UnknownBackendError:
        origin = parts.vendor_origins.get(name, "an unknown package")
        raise MissingVendorError(f"{label} needs vendor {name!r}, registered by {origin}; install that package") from None
    except MissingVendorError as error:
        raise MissingVendorError(f"{label} needs vendor {name!r}: {error}") from None
    missing = runtime.missing_part()
    if missing:  # refused before any run, with the vendor's own reason (not an ImportError at the first call)
        raise MissingVendorError(f"{label} needs vendor {name!r}, which cannot run its regions here: {missing}")
    recorded = next(a.codegen for a in parts.artifacts if a.backend == name)
    if runtime.codegen.kind != recorded:
        raise ArtifactError(f"{label}: vendor {name!r} here generates {runtime.codegen.kind!r} code; the artifact's "
                            f"regions for it are {recorded!r}")
    return runtime


def load(
    path: str | os.PathLike,
    cache_dir: str | os.PathLike | None = None,
    engines: str = "lazy",
    backend_options: Mapping[str, dict] | None = None,
    trusted_keys: Iterable[PublicKey] | None = None,
    strict_engines: bool = False,
    shape_memory: int | None = None,
) -> CompiledModel:
    """Load an artifact written by `CompiledModel.export`, in this or any other process, after
    checking it (see `byoc.runtime_metadata.artifact`). `backend_options` override the build's
    per-backend options (e.g. the accelerator configuration this runtime drives). With
    `trusted_keys` (Ed25519 public keys), only an artifact one of them signed is loaded.
    Engines embedded in the artifact (`build(..., engines="embed")`) are used where this machine
    is like the one that built them; elsewhere they are rebuilt with a warning, or, with
    `strict_engines`, creating them raises an EngineError that says what differs.
    `shape_memory` (bytes) replaces the build's bound on what the model keeps for the shapes it
    meets (see byoc.runtime_metadata.shape_memory): the machine that serves knows its memory."""
    if engines not in ("lazy", "eager"):
        raise ByocError(f"engines must be 'lazy' or 'eager', not {engines!r}")
    check_shape_memory(shape_memory)
    parts, manifest = read_artifact(path, trusted_keys)
    if shape_memory is not None:
        parts.shape_memory = shape_memory
    label = f"artifact {os.fspath(path)!r}"
    backends = {name: _vendor(name, parts, label) for name in sorted({a.backend for a in parts.artifacts})}
    needs_compiler(parts, backends, label)
    if parts.partition is not None:
        try:
            PartitionRecord.from_dict(parts.partition)
        except (KeyError, TypeError, ValueError) as error:
            raise ArtifactError(f"{label}: the partition record is malformed ({type(error).__name__}: {error})") from error
    parts.backend_options = {**parts.backend_options, **checked_backend_options(backend_options or {}, backends)}
    warn_where_inexact(parts.artifacts, label)
    model = CompiledModel(parts, backends, EngineCache(cache_dir if cache_dir is not None else default_cache_dir()), label,
                          strict_engines)
    if engines == "eager":
        model.create_engines()
    return model
