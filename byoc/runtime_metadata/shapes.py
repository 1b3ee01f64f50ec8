"""Shape-specialised regions: the regions of a model with dynamic dimensions.

The host code is compiled once, for every shape in range. A vendor's region is generated for
concrete shapes: its code (a JSON graph, C, a vendor binary) and its engine are specialised per
*variant*, one value for each named dimension the region's tensors use. Each variant is a
region of its own (`dnnl_0__batch1_sequence32`), with its own artifact entry and engine:

- variants for the shapes declared at build time (`shape_buckets=`, by default the `opt`
  values of the ranges) are generated then, checked, and kept in the artifact: C variants are
  linked into the host library, engines are built as for any region;
- any other shape in range gets its variant on first use, generated from the region's template
  (its Relax function, kept in the artifact with its weights in the constant store), then kept
  in memory (at most `max_shapes` per region, least recently used first out) and, where the
  vendor saves engines, in the engine cache on disk; C variants are compiled with the system's
  C compiler and kept on disk by content.

The host calls such a region by its symbol; `SpecialisedRuntime` reads the dimensions off the
tensors it is given and calls the variant for them.

A vendor whose engines take symbolic shapes (`Backend.symbolic_shapes`) gets one variant for
every shape instead (`SYMBOLIC`): its code written once with the dimensions as expressions
(byoc.codegen_json.symbolic_dims), its engine built and checked at build time; a region that vendor does
not take so is generated per shape as above (`SpecialisedRegion.per_shape_reason`).
"""

from __future__ import annotations

import collections
import hashlib
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence

import tvm
import tvm_ffi
from tvm import relax

from byoc.backend.codegen import Codegen
from byoc.backend.settings import VendorSettings
from byoc.backend.spec import Backend
from byoc.codegen_c.generate import init_symbol
from byoc.errors import ByocError, EngineError, InputError, ShapeVariantWarning
from byoc.ir.dims import DimRange
from byoc.runtime_metadata.artifact_types import DEFAULT_MAX_SHAPES, SYMBOLIC, RegionArtifact, SpecialisedRegion
from byoc.runtime_metadata.compiler import compiler, export_shared, link_flags
from byoc.runtime_metadata.constants import ConstantStore
from byoc.runtime_metadata.current_dims import current_dims
from byoc.runtime_metadata.dispatch import FailureRecord
from byoc.runtime_metadata.host_library import initialise, libraries_directory, load_library
from byoc.runtime_metadata.shape_memory import ShapeMemory
from byoc.runtime_metadata.shape_variants import generate_variant, load_template


def _compiled(artifact: RegionArtifact, codegen: Codegen, where: str) -> bytes:
    """The C variant compiled into a shared library: once per source, flags and compiler, kept
    on disk."""
    recipe = [*link_flags([codegen]), compiler(codegen.source_language)]
    digest = hashlib.sha256(artifact.payload + "\0".join(recipe).encode()).hexdigest()[:32]
    path = libraries_directory() / f"variant-{digest}.so"
    if not path.exists():
        module = tvm.get_global_func("runtime.CSourceModuleCreate")(
            artifact.payload.decode(), "c", [artifact.symbol, init_symbol(artifact.symbol)], [])
        with tempfile.TemporaryDirectory() as tmp:
            built = os.path.join(tmp, "variant.so")
            try:
                export_shared(module, built, [codegen])
            except Exception as error:
                raise EngineError(f"{where}: compiling the region's C code for this shape failed: "
                                  f"{str(error).strip().splitlines()[0]}") from error
            with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as out, open(built, "rb") as f:
                out.write(f.read())
            os.replace(out.name, path)
    return path.read_bytes()


class _CVariant:
    """A C variant built on first use: its own shared library, loaded and initialised as the
    host library is (byoc.runtime_metadata.host_library): one loaded copy per set of
    constants, initialised once, so two models of one architecture keep their own weights."""

    def __init__(self, artifact: RegionArtifact, backend: Backend, store: ConstantStore, where: str) -> None:
        self.artifact = artifact
        module, path = load_library(_compiled(artifact, backend.codegen, where), [artifact], store, where)
        initialise(module, path, [artifact], store)
        self.function = module.get_function(artifact.symbol)

    def __call__(self, *args) -> None:
        self.function(*args)


class SpecialisedRuntime:
    """The callable the host invokes for a shape-specialised region: the variant for the shapes
    of the tensors it is given, made on first use where none was built ahead."""

    def __init__(self, region: SpecialisedRegion, backend: Backend, store: ConstantStore, settings: VendorSettings,
                 ranges: Mapping[str, DimRange], ahead: Mapping[str, Callable], make_runtime: Callable[[RegionArtifact, ConstantStore], Callable],
                 max_shapes: int = DEFAULT_MAX_SHAPES, ahead_artifacts: Mapping[str, RegionArtifact] | None = None,
                 memory: ShapeMemory | None = None) -> None:
        self.region = region
        self.backend = backend  # made for `settings`, with which variants are generated
        self.store = store
        self.settings = settings
        self.ranges = {name: ranges[name] for name in region.dims if name in ranges}
        self.ahead = dict(ahead)  # variant key -> callable, built with the model
        self.ahead_artifacts = dict(ahead_artifacts or {})  # variant key -> its artifact
        self.made: collections.OrderedDict[str, Callable] = collections.OrderedDict()  # built here, most recent last
        self.make_runtime = make_runtime  # an engine-backed region's runtime for a variant artifact
        self.max_shapes = max_shapes
        # Variants run by engines count against the model's shape_memory with the constants they
        # were generated with, and go when it drops them (C variants stay loaded: see _make).
        self.memory = memory if memory is not None else ShapeMemory()
        self.where = f"region {region.symbol} ({region.backend})"
        self._function: relax.Function | None = None
        self._aliases: dict[str, str] = {}
        # Told of each variant generated here before its engine is made (calibration maps the
        # variant's symbol to the region's).
        self.on_variant: Callable[[RegionArtifact], None] | None = None
        self._lock = threading.Lock()
        self._failure = FailureRecord()
        self._values_by_shapes: dict[tuple, dict[str, int]] = {}
        self._warned = False  # ShapeVariantWarning, once
        self._warned_memory = False  # the same, for a variant shape_memory dropped
        self._dropped: set[str] = set()  # keys of the variants shape_memory dropped
        self._stays_loaded: int | None = None  # bytes of constants per variant, once one is a C library (never unloaded)

    def values_of(self, args: Sequence) -> dict[str, int]:
        """The named dimensions, read off the tensors' shapes (then the model's run), checked
        against their ranges. Those the shapes alone give are kept by the shapes: reading and
        checking them again cost 5 us a call."""
        shapes = tuple(tuple(tensor.shape) for tensor in args)
        known = self._values_by_shapes.get(shapes)
        if known is not None:
            return known
        values: dict[str, int] = {}
        for pattern, tensor in zip(self.region.input_dims, args):
            shape = tensor.shape
            for dim, size in zip(pattern, shape):
                if isinstance(dim, str):
                    values.setdefault(dim, int(size))
        from_shapes = all(name in values for name in self.region.dims)
        current = current_dims() or {}
        for name in self.region.dims:
            if name not in values and name in current:
                values[name] = current[name]
        missing = [name for name in self.region.dims if name not in values]
        if missing:
            raise EngineError(f"{self.where}: cannot tell dimension(s) {missing} from its inputs; run the model through "
                              "CompiledModel.run")
        for name, value in values.items():
            if name in self.ranges and value not in self.ranges[name]:
                raise InputError(f"dimension {name!r} is {value}, outside the range {self.ranges[name]} the model was compiled for")
        if from_shapes:
            if len(self._values_by_shapes) >= 4 * self.max_shapes:
                self._values_by_shapes.clear()
            self._values_by_shapes[shapes] = values
        return values

    def host_function(self) -> Callable | None:
        """The region's one variant for every shape where it is C in the host library, which the
        host may call directly, with no Python between: it reads every dimension off its
        tensors (`byoc.codegen_c.generate`; a region whose dimension no input has is generated
        per shape), checks them, and names the region in its errors. Through this dispatcher, a
        call cost 5-8 us more than a static region's, a tenth of a small model's run. None
        for any other region."""
        function = self.ahead.get(SYMBOLIC) if self.region.symbolic else None
        return function if isinstance(function, tvm_ffi.Function) else None

    def variant(self, values: Mapping[str, int]) -> Callable:
        key = self.region.key(values)
        runtime = self.ahead.get(key)
        if runtime is not None:
            return runtime
        with self._lock:
            runtime = self.made.get(key)
            if runtime is not None:
                self.made.move_to_end(key)
                self.memory.used(self.where, key)
                return runtime
            if self._stays_loaded is not None and len(self.made) >= self.max_shapes:
                raise EngineError(
                    f"{self.where}: {key} would be shape {len(self.made) + 1} generated here, over max_shapes={self.max_shapes}: "
                    f"its variants are C libraries that stay loaded with their weights (about {self._stays_loaded / 1e6:.0f} MB "
                    "each), so more would only grow memory. Declare the shapes in shape_buckets, raise max_shapes, or give the "
                    "region to a vendor that takes symbolic shapes (onnxruntime: one session for every shape; a decoder's cache "
                    "length is new at every step)")
            if key in self._dropped and not self._warned_memory:
                self._warned_memory = True
                warnings.warn(f"{self.where}: its variant for {key} was made before and dropped to keep the model within "
                              f"shape_memory={self.memory.limit} bytes; it is generated again. Raise shape_memory (build or "
                              "load) to keep more, or declare the shapes in shape_buckets", ShapeVariantWarning, stacklevel=2)
            start = time.perf_counter()
            runtime, nbytes = self._make(values)
            self.made[key] = runtime
            if len(self.made) > self.max_shapes and not self._warned:
                self._warned = True
                varying = ", ".join(self.region.dims)
                warnings.warn(f"{self.where}: more shapes than the {self.max_shapes} it keeps (max_shapes) were met on first use; "
                              f"each new value of {varying} generates and compiles it again ({time.perf_counter() - start:.2f} s the "
                              "last). For shapes that change on every call (a decoder's cache length), give the region to a vendor "
                              "that takes symbolic shapes (onnxruntime: one session for every shape), or declare the shapes in "
                              "shape_buckets", ShapeVariantWarning, stacklevel=2)
            while len(self.made) > self.max_shapes:
                self.memory.forget(self.where, self.made.popitem(last=False)[0])
        if nbytes is not None:  # counted outside the lock: what the limit drops may be this region's
            self.memory.keep(self.where, key, nbytes, lambda: self._drop(key))
        return runtime

    def _drop(self, key: str) -> None:
        with self._lock:
            if self.made.pop(key, None) is not None:
                self._dropped.add(key)

    def variant_and_artifact(self, values: Mapping[str, int]) -> tuple[Callable, RegionArtifact]:
        """The variant for these dimensions (made here where none was built ahead) and the
        artifact it runs: its tensors' shapes."""
        runtime = self.variant(values)
        artifact = self.ahead_artifacts.get(self.region.key(values)) or getattr(runtime, "artifact", None)
        if artifact is None:
            raise EngineError(f"{self.where}: no artifact is known for the variant {self.region.key(values)}")
        return runtime, artifact

    def _make(self, values: Mapping[str, int]) -> tuple[Callable, int | None]:
        """The variant for these dimensions, and the bytes of the constants it holds (None for
        a C variant, which stays loaded)."""
        if self.region.template is None:
            raise EngineError(f"{self.where}: built for {sorted(self.ahead)} only (its code cannot be generated again from "
                              f"the artifact); {self.region.key(values)} needs a build with it in shape_buckets")
        if self._function is None:
            self._function, self._aliases = load_template(self.region, self.store)
        store = ConstantStore()
        try:
            named = {**values, **{alias: values[base] for alias, base in self._aliases.items()}}
            artifact = generate_variant(self._function, self.region, named, self.backend, store, self.settings)
        except ByocError:
            raise
        except Exception as error:
            raise EngineError(f"{self.where}: code generation for {self.region.key(values)} failed: "
                              f"{type(error).__name__}: {error}") from error
        if self.on_variant is not None:
            self.on_variant(artifact)
        if artifact.linked_into_host:
            # A loaded library cannot be unloaded (its file-scope state points into its constants):
            # evicting the variant would free nothing, so such variants are bounded, not evicted.
            self._stays_loaded = store.nbytes
            return _CVariant(artifact, self.backend, store, f"{self.where} at {self.region.key(values)}"), None
        return self.make_runtime(artifact, store), store.nbytes

    def __call__(self, *args) -> None:
        try:
            # The region's dimensions may come as a shape among its arguments (see
            # byoc.partition.outline): its variants take tensors only.
            tensors = [a for a in args if not isinstance(a, tvm.runtime.ShapeTuple)]
            self.variant(self.values_of(tensors))(*tensors)
        except Exception as error:
            failure = self._failure.remember(error, self.where)
            if failure is error:
                raise
            raise failure from error

    def take_failure(self) -> ByocError | None:
        error = self._failure.take()
        if error is None:  # a variant's own runtime may hold the engine's failure
            for runtime in [*self.ahead.values(), *self.made.values()]:
                take = getattr(runtime, "take_failure", None)
                error = take() if take is not None else None
                if error is not None:
                    break
        return error

    def describe(self) -> dict:
        described = {"dims": {name: str(r) for name, r in self.ranges.items()}, "symbolic": self.region.symbolic,
                     "built_ahead": sorted(self.ahead), "built_here": list(self.made), "max_shapes": self.max_shapes}
        if self.region.per_shape_reason:
            described["per_shape_reason"] = self.region.per_shape_reason
        return described

