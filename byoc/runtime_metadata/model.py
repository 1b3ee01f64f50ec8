"""`CompiledModel`: the metadata module (paper section 3.4).

It holds the constants of every region once, the host library (host code plus C regions), and
the accelerator sub-modules (JSON graphs, custom blobs) with their engines; it runs the model,
profiles it and writes it to one artifact file.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from byoc.backend.registry import checked_backend_options, get_backend, list_backends
from byoc.backend.spec import Backend
from byoc.cache_dirs import default_cache_dir
from byoc.codegen_json.symbolic_dims import shape_at
from byoc.errors import ArtifactError, ByocError, InputError, MissingVendorError, UnknownBackendError
from byoc.host.index_ranges import engine_index_error, take_index_error
from byoc.partition.reasons import SHAPE_ONLY
from byoc.partition.record import PartitionRecord
from byoc.partition.report import PartitionReport
from byoc.processing.saturation import warn_where_inexact
from byoc.runtime_metadata.artifact import read_artifact, write_artifact
from byoc.runtime_metadata.artifact_types import EmbeddedEngine, ModelParts, RegionArtifact, SpecialisedRegion, TensorSpec
from byoc.runtime_metadata.constants import ConstantStore
from byoc.runtime_metadata.dispatch import RegionRuntime, create_vm
from byoc.runtime_metadata.engine_cache import EngineCache
from byoc.runtime_metadata.engines import EngineRecord, save_for_embedding
from byoc.runtime_metadata.host_library import load_host_library
from byoc.runtime_metadata.numpy_views import numpy_view
from byoc.runtime_metadata.profile import ProfileReport, profile_model
from byoc.runtime_metadata.shape_values import SHAPE_VALUES, SHAPE_VALUES_FUNCTION, ShapeValues
from byoc.runtime_metadata.shapes import SpecialisedRuntime, reset_current_dims, set_current_dims
from byoc.runtime_metadata.signing import PrivateKey, PublicKey

# Input buffers a model with dynamic dimensions keeps per thread, for its most recent shapes.
_KEPT_INPUT_SHAPES = 8
# Input shapes whose dimension values are kept (a few numbers each): every cache length of a
# generation loop, met again by the next request.
_KEPT_DIMS = 1024


class CompiledModel:
    """A compiled model: its parts (see `ModelParts`), the backends that run its regions, and
    the engines, host library and virtual machines made from them."""

    def __init__(self, parts: ModelParts, backends: Mapping[str, Backend], cache: EngineCache | None = None,
                 source: str = "this build", strict_engines: bool = False,
                 engines: Mapping[str, EngineRecord] | None = None) -> None:
        self.parts = parts
        sole_work = one_region_only(parts.partition, parts.artifacts, parts.build_fallbacks)
        engines = engines or {}
        self.regions = {
            a.symbol: RegionRuntime(a, backends[a.backend], parts.store, parts.backend_options.get(a.backend, {}), cache,
                                    parts.engines.get(a.symbol), strict_engines, sole_work, engines.get(a.symbol))
            for a in parts.artifacts
            if not a.linked_into_host
        }
        for backend in sorted({a.backend for a in parts.artifacts}):
            backends[backend].codegen.prepare_runtime()
        self.host = load_host_library(parts, f"{source}: the host library")
        self._backends = backends
        self._cache = cache
        self.specialised = {region.symbol: self._specialised_runtime(region) for region in parts.specialised}
        # What the host calls by name: the shape-specialised regions (C for every shape in the
        # host library directly, see `host_function`), and the values that depend on the shape
        # only (see byoc.runtime_metadata.shape_values).
        self._by_name: dict[str, Callable] = {symbol: runtime.host_function() or runtime for symbol, runtime in self.specialised.items()}
        if parts.dims:
            self._by_name[SHAPE_VALUES] = ShapeValues(lambda: self._vm_of_its_own()[SHAPE_VALUES_FUNCTION])
        self._input_kinds = [(spec.name, tuple(spec.shape), np.dtype(spec.dtype)) for spec in parts.inputs]
        self._local = threading.local()
        self._dims_of_shapes: dict[tuple, dict[str, int]] = {}  # see dims_of_inputs

    def _specialised_runtime(self, region: SpecialisedRegion) -> SpecialisedRuntime:
        """The dispatcher of a shape-specialised region over its variants: those built ahead run
        as any region does (C in the host library, JSON through their engines)."""
        backend = self._backends[region.backend]
        options = self.parts.backend_options.get(region.backend, {})
        ahead = {key: self.regions[symbol] if symbol in self.regions else self.host.get_function(symbol, query_imports=True)
                 for key, symbol in region.variants.items()}
        by_symbol = {a.symbol: a for a in self.parts.artifacts}
        artifacts = {key: by_symbol[symbol] for key, symbol in region.variants.items()}

        def make_runtime(artifact: RegionArtifact, store: ConstantStore) -> RegionRuntime:
            return RegionRuntime(artifact, backend, store, options, self._cache)

        return SpecialisedRuntime(region, backend, self.parts.store, options, self.parts.dims, ahead, make_runtime,
                                  self.parts.max_shapes, artifacts)

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
        return self.parts.outputs

    @property
    def build_fallbacks(self) -> dict[str, str]:
        return self.parts.build_fallbacks

    # ------------------------------------------------------------------ running
    def virtual_machine(self) -> relax.VirtualMachine:
        """This thread's TVM VirtualMachine for the model (for callers that pass TVM tensors
        themselves and skip `run`'s input checks and numpy conversion)."""
        return self._vm()

    def _vm(self) -> relax.VirtualMachine:
        # A VirtualMachine is not safe to share between threads; each thread gets its own.
        vm = getattr(self._local, "vm", None)
        if vm is None:
            vm = self._local.vm = create_vm(self.host, self.regions.values(), self.parts.artifacts, self._by_name)
        return vm

    def _entry(self) -> tuple[Callable, list[tvm.runtime.Tensor], list[np.ndarray], list[bool]]:
        """This thread's `main`, the input buffers it keeps, numpy views of them, and which of its
        outputs a run allocates (see `_outputs`). Inputs are
        copied into kept buffers (a fresh allocation per run pays page faults: 0.1 ms or more for
        a 224x224 image; TVM takes no numpy memory that is not 64-byte aligned), through views
        (Tensor.copyfrom took 7 us a call, looking `main` up 16 us: a fifth of a tiny GPT-2's run)."""
        entry = getattr(self._local, "entry", None)
        if entry is None:
            buffers = [tvm.runtime.empty(s.shape, s.dtype) for s in self.inputs]
            entry = self._local.entry = (self._vm()["main"], buffers, [numpy_view(b) for b in buffers], self._allocated_outputs())
        return entry

    def _direct_entry(self, values: Mapping[str, int] | None = None) -> tuple[Callable[[], None], list[np.ndarray], list[np.ndarray]]:
        """This thread's direct call (the model is one region) and its buffers: numpy views of
        TVM-allocated tensors, aligned as engines are promised, the same ones run after run (for
        a region with symbolic shapes, per set of dimension `values`, the most recent kept)."""
        entries = getattr(self._local, "direct", None)
        if entries is None:
            entries = self._local.direct = collections.OrderedDict()
        key = tuple(values.items()) if values else None
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = self._direct_call(values or {})
            while len(entries) > _KEPT_INPUT_SHAPES:
                entries.popitem(last=False)
        elif values:
            entries.move_to_end(key)
        return entry[:3]

    def _direct_call(self, values: Mapping[str, int]) -> tuple:
        direct = self.parts.direct_call
        symbol = direct.symbol
        if symbol in self.specialised:  # generated per shape: the variant for these dimensions
            function, artifact = self.specialised[symbol].variant_and_artifact(values)
        else:
            artifact = next(a for a in self.parts.artifacts if a.symbol == symbol)
            function = self.regions.get(symbol) or self.host.get_function(symbol, query_imports=True)
        tensors = [tvm.runtime.empty(shape_at(s.shape, values), s.dtype) for s in [*artifact.inputs, *artifact.outputs]]
        views = [numpy_view(t) for t in tensors]
        count = len(artifact.inputs)
        for position, (tensor, view) in self._shape_values(values).items():
            tensors[position], views[position] = tensor, view
        fed = [view for position, view in enumerate(views[:count]) if position not in direct.shape_values]
        if isinstance(function, RegionRuntime):  # an engine, on numpy views of the same buffers
            inputs, outputs = views[:count], views[count:]

            def call() -> None:
                function.run_arrays(inputs, outputs)
        else:  # C (in the host library, or a variant's own library), called as the VM calls it: inputs, then outputs

            def call() -> None:
                function(*tensors)
        return call, fed, views[count:], tensors

    def _shape_values(self, values: Mapping[str, int]) -> dict[int, tuple[tvm.runtime.Tensor, np.ndarray]]:
        """The direct call's inputs that are values of the shape alone, by region input position:
        the host's, computed for these dimensions and kept, each a tensor and its numpy view."""
        direct = self.parts.direct_call
        if not direct.shape_values:
            return {}
        kept = self._by_name[SHAPE_VALUES].kept(tuple(values[name] for name in direct.dims))
        return {position: kept[index] for position, index in direct.shape_values.items()}

    def _met_before(self, values: Mapping[str, int]) -> bool:
        """Whether this thread ran the model at these dimensions before (the most recent kept)."""
        met = getattr(self._local, "met", None)
        if met is None:
            met = self._local.met = collections.OrderedDict()
        key = tuple(values.items())
        if key in met:
            met.move_to_end(key)
            return True
        met[key] = None
        while len(met) > 4 * _KEPT_INPUT_SHAPES:
            met.popitem(last=False)
        return False

    def _engine_plan(self, values: Mapping[str, int]) -> _EnginePlan | None:
        """How to run the direct call once at these dimensions where one engine runs every shape
        (None where the region is C or generated per shape)."""
        direct = self.parts.direct_call
        function = self.regions.get(direct.symbol)  # not a region generated per shape (those are in `specialised`)
        if not isinstance(function, RegionRuntime):
            return None
        fixed = {position: view for position, (_, view) in self._shape_values(values).items()}
        fed = iter(direct.inputs)
        feeds = [(None, fixed[p]) if p in fixed else (next(fed), None) for p in range(len(function.artifact.inputs))]
        outputs = [(shape_at(s.shape, values), np.dtype(s.dtype)) for s in function.artifact.outputs]
        return _EnginePlan(function, feeds, outputs, direct.outputs)

    def _run_direct(self, arrays: list[np.ndarray], values: Mapping[str, int] | None = None) -> list[np.ndarray]:
        # A shape met for the first time runs on the caller's arrays where one engine runs every
        # shape; one met again gets kept buffers, whose bindings the engine reuses (a decoding
        # step's shape is new at every step, a server's shapes repeat).
        if values and not self._met_before(values):
            plan = self._engine_plan(values)
            if plan is not None:
                return plan.run(arrays)
        call, inputs, outputs = self._direct_entry(values)
        for buffer, index in zip(inputs, self.parts.direct_call.inputs):
            np.copyto(buffer, arrays[index])
        call()
        return [outputs[index].copy() for index in self.parts.direct_call.outputs]

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
            embedded = save_for_embedding(region.record, region.artifact, region.backend, region.store, region.options)
            if embedded is not None:
                self.parts.engines[symbol] = embedded
        return sorted(self.parts.engines)

    def _arrange_inputs(self, args: Sequence, named: Mapping[str, object]) -> list[np.ndarray]:
        """The inputs in the model's order, each checked against its name, dtype and shape.
        Run on every call: a tiny model runs in a few hundred microseconds, so the common case
        (numpy arrays of the right kind) costs a few comparisons per input."""
        expected = self.inputs
        if len(args) == 1 and isinstance(args[0], Mapping) and not named:  # run({"input": x}), as onnxruntime takes them
            args, named = (), dict(args[0])
        if args and named:
            raise InputError("give inputs either by position or by name, not both")
        if named:
            if self.parts.ignored_inputs:
                named = {name: value for name, value in named.items() if name not in self.parts.ignored_inputs}
            if len(named) != len(expected) or not all(spec.name in named for spec in expected):
                unknown = sorted(set(named) - {spec.name for spec in expected})
                if unknown:
                    raise InputError(f"unknown input(s) {unknown}; the model's inputs are {[s.name for s in expected]}")
                raise InputError(f"missing input(s) {[spec.name for spec in expected if spec.name not in named]}")
            args = [named[spec.name] for spec in expected]
        if len(args) != len(expected):
            raise InputError(f"the model takes {len(expected)} input(s) ({', '.join(s.name for s in expected)}), got {len(args)}")
        arrays = []
        for (name, shape, dtype), value in zip(self._input_kinds, args):
            array = value.numpy() if isinstance(value, tvm.runtime.Tensor) else np.asarray(value)
            if array.dtype != dtype:
                raise InputError(f"input {name!r}: expected dtype {dtype}, got {array.dtype}")
            if array.shape != shape and not self.parts.dims:
                raise InputError(f"input {name!r}: expected shape {shape}, got {tuple(array.shape)}")
            arrays.append(array)
        return arrays

    def dims_of_inputs(self, arrays: Sequence[np.ndarray]) -> dict[str, int]:
        """The value of each named dimension in these inputs, each checked against its range
        and across inputs (a model with dynamic dimensions); kept for the shapes met most
        recently (the checks took a quarter of byoc's own time in a decoding step)."""
        shapes = tuple(a.shape for a in arrays)
        known = self._dims_of_shapes.get(shapes)
        if known is None:
            known = self._dims_of_shapes[shapes] = self._check_dims(arrays)
            while len(self._dims_of_shapes) > _KEPT_DIMS:
                self._dims_of_shapes.pop(next(iter(self._dims_of_shapes)), None)
        return dict(known)

    def _check_dims(self, arrays: Sequence[np.ndarray]) -> dict[str, int]:
        values: dict[str, tuple[int, str]] = {}
        for (name, shape, _), array in zip(self._input_kinds, arrays):
            if len(array.shape) != len(shape):
                raise InputError(f"input {name!r}: expected {len(shape)} dimensions {_shape_text(shape)}, got shape "
                                 f"{tuple(array.shape)}")
            for index, (dim, size) in enumerate(zip(shape, array.shape)):
                if isinstance(dim, str):
                    limits = self.parts.dims[dim]
                    if size not in limits:
                        raise InputError(f"input {name!r} dim {index} ({dim}) is {size}, outside the range {limits} the model "
                                         "was compiled for")
                    seen = values.setdefault(dim, (size, f"input {name!r} dim {index}"))
                    if seen[0] != size:
                        raise InputError(f"dimension {dim!r} is {seen[0]} in {seen[1]} but {size} in input {name!r} dim {index}")
                elif dim != size:
                    raise InputError(f"input {name!r}: expected shape {_shape_text(shape)}, got {tuple(array.shape)}")
        return {dim: value for dim, (value, _) in values.items()}

    def run(self, *inputs, **named_inputs) -> list[np.ndarray]:
        """Run the model; inputs by position or by name. Returns every output as numpy."""
        arrays = self._arrange_inputs(inputs, named_inputs)
        try:
            if self.parts.dims:
                if self.parts.direct_call is not None:  # its one region takes every shape
                    return self._run_direct(arrays, self.dims_of_inputs(arrays))
                return self._run_dynamic(arrays)
            if self.parts.direct_call is not None:
                return self._run_direct(arrays)
            main, buffers, views, fresh = self._entry()
            return _outputs(main, _fed(buffers, views, arrays), fresh)
        except Exception as error:
            index_error = take_index_error()  # a stale one (from a profile run) does not match this error
            if index_error is not None and str(index_error) in str(error):
                raise index_error from None
            for region in [*self.specialised.values(), *self.regions.values()]:
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
                    # TVM's FFI made a RuntimeError of it on the way out: raise the original,
                    # with the vendor's exception (and its traceback) as its cause.
                    raise failure from failure.__cause__
            raise

    def _run_dynamic(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """A run of a model with dynamic dimensions: the host code takes any shape in range,
        each shape-specialised region the variant for these dimensions."""
        values = self.dims_of_inputs(arrays)
        token = set_current_dims(values)
        try:
            entry = self._dynamic_entry(tuple(a.shape for a in arrays), values)
            if entry is None:  # shapes met for the first time: the caller's arrays, as they are where TVM can take them
                return _outputs(self._local.main, [_wrapped(a) for a in arrays], self._allocated_outputs())
            main, buffers, views, fresh = entry
            return _outputs(main, _fed(buffers, views, arrays), fresh)
        finally:
            reset_current_dims(token)

    def _vm_of_its_own(self) -> relax.VirtualMachine:
        """A VirtualMachine of its own, for calls made while another runs `main`."""
        return create_vm(self.host, self.regions.values(), self.parts.artifacts, self._by_name)

    def _allocated_outputs(self) -> list[bool]:
        """This thread's record of which outputs of `main` a run allocates (see `_outputs`): one
        for every shape, found on the first run (a decoder's every step is a shape of its own)."""
        allocated = getattr(self._local, "allocated", None)
        if allocated is None:
            allocated = self._local.allocated = []
        return allocated

    def _dynamic_entry(self, shapes: tuple, values: Mapping[str, int]) -> tuple[Callable, list[tvm.runtime.Tensor], list[np.ndarray], list[bool]] | None:
        """This thread's `main` and input buffers for these input shapes (of these dimension
        `values`), kept for the shapes run most recently (as `_entry` keeps them for a static
        model); None for shapes met for the first time (`_met_before`). A decoder's every step
        has a cache one longer: buffers allocated for each new shape cost their allocation and
        page faults (0.15 ms a step of tiny GPT-2, as much as onnxruntime's whole step), where
        wrapping the caller's arrays costs 3 us each."""
        entries = getattr(self._local, "dynamic", None)
        if entries is None:
            entries = self._local.dynamic = collections.OrderedDict()
            self._local.main = self._vm()["main"]
        entry = entries.get(shapes)
        if entry is not None:
            entries.move_to_end(shapes)
            return entry
        if not self._met_before(values):
            return None
        buffers = [tvm.runtime.empty(shape, spec.dtype) for shape, spec in zip(shapes, self.inputs)]
        entry = entries[shapes] = (self._local.main, buffers, [numpy_view(b) for b in buffers], self._allocated_outputs())
        while len(entries) > _KEPT_INPUT_SHAPES:
            entries.popitem(last=False)
        return entry

    def profile(self, *inputs, repeat: int = 10, **named_inputs) -> ProfileReport:
        """Time spent per region and on the host (see `byoc.runtime_metadata.profile`)."""
        arrays = [np.require(a, requirements="C") for a in self._arrange_inputs(inputs, named_inputs)]
        self.create_engines()
        return profile_model(self._vm(), self.parts.artifacts, self.regions, arrays, repeat, self.specialised)

    def report(self) -> PartitionReport:
        """The partition report, with what each vendor estimated for its regions at build time
        (cycles, memory) and the regions that fell back to the host during the build."""
        if self.parts.partition is None:
            raise ByocError("this model was not partitioned by byoc.partition_for: it has no partition record")
        estimates = {a.symbol: a.info for a in self.artifacts if a.info}
        result = PartitionReport.from_record(PartitionRecord.from_dict(self.parts.partition), estimates, self.build_fallbacks)
        if self.parts.dims:
            result.note_dims(self.parts.dims, (region.symbol for region in self.parts.specialised if not region.symbolic),
                             (region.symbol for region in self.parts.specialised if region.symbolic))
        return result

    # ---------------------------------------------------------------- artifact
    def export(self, path: str | os.PathLike, sign_key: PrivateKey | None = None) -> None:
        """Write host library, accelerator sub-modules and constants to one artifact file,
        signed with `sign_key` (an Ed25519 private key) when given."""
        write_artifact(self.parts, path, sign_key)

    def inspect(self) -> dict:
        return {
            "target": self.parts.target,
            "inputs": [vars(s) for s in self.inputs],
            "outputs": [vars(s) for s in self.outputs],
            "host_library_bytes": len(self.parts.host_library),
            "constants": {"count": len(self.store.names()), "unique": len(self.store.contents()), "bytes": self.store.nbytes},
            "regions": [
                {
                    **a.describe(),
                    "constant_bytes": sum(self.store.get(n).nbytes for n in a.constants),
                    "engine": _engine_state(self.regions.get(a.symbol)),
                    "embedded_engine": _embedded_state(self.parts.engines.get(a.symbol)),
                }
                for a in self.artifacts
            ],
            "vendors": self.parts.vendor_origins,
            **({"dims": {name: str(r) for name, r in self.parts.dims.items()},
                "shape_specialised": {symbol: runtime.describe() for symbol, runtime in self.specialised.items()}}
               if self.parts.dims else {}),
        }


def _shape_text(shape: Sequence[int | str]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _engine_state(region: RegionRuntime | None) -> str:
    if region is None:
        return "linked into the host library"
    if region.record is None:
        return "not built yet"
    return f"{region.record.source} in {region.record.seconds:.3f} s"


def _embedded_state(embedded: EmbeddedEngine | None) -> dict | None:
    if embedded is None:
        return None
    return {"bytes": len(embedded.plan), "environment": embedded.environment}


def one_region_only(partition: dict | None, artifacts: Sequence[RegionArtifact], build_fallbacks: Mapping[str, str]) -> bool:
    """Whether the model is one region and nothing else per run: its partition left no op on the
    host but those a model with dynamic dimensions computes once per shape, and no region fell
    back at build (a model not partitioned by byoc says nothing: False)."""
    if partition is None or len(artifacts) != 1 or build_fallbacks:
        return False
    return all(host.reasons == [SHAPE_ONLY] for host in PartitionRecord.from_dict(partition).host_ops)


_ARRAY_SIZE = tvm_ffi.get_global_func("ffi.ArraySize")
_ARRAY_GET_ITEM = tvm_ffi.get_global_func("ffi.ArrayGetItem")


def _values(result) -> list:
    """The model's outputs, flat: TVM tensors as the VM returned them, a shape the model returns
    (ONNX Shape of a static tensor) as an int64 vector, a scalar as a 0-d array."""
    if isinstance(result, tvm.runtime.Tensor):
        return [result]
    if isinstance(result, tvm.runtime.ShapeTuple):
        return [np.array(list(result), dtype=np.int64)]
    if isinstance(result, (int, float, bool)):
        return [np.array(result)]
    values = []
    # A tuple, the common case: items fetched by index (iterating an FFI Array asks its size
    # again for each item; three calls per item cost 7 us a run of a two-output model).
    for index in range(_ARRAY_SIZE(result)):
        value = _ARRAY_GET_ITEM(result, index)
        values.extend([value] if isinstance(value, tvm.runtime.Tensor) else _values(value))
    return values


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array 64-byte aligned, as engines are promised, from numpy's allocator
    (which reuses freed blocks: TVM's maps fresh pages for each large tensor)."""
    nbytes = math.prod(shape) * dtype.itemsize
    block = np.empty(nbytes + 64, np.uint8)
    start = -block.ctypes.data % 64
    return block[start:start + nbytes].view(dtype).reshape(shape)


def _taken_as_is(array: np.ndarray) -> bool:
    """Whether engines and TVM can take `array` without a copy: contiguous and 64-byte aligned."""
    return array.flags.c_contiguous and array.ctypes.data % 64 == 0


def _aligned_copy(array: np.ndarray) -> np.ndarray:
    copy = _aligned_empty(array.shape, array.dtype)
    np.copyto(copy, array)
    return copy


def _as_fed(array: np.ndarray) -> np.ndarray:
    return array if _taken_as_is(array) else _aligned_copy(array)


@dataclasses.dataclass(frozen=True)
class _EnginePlan:
    """A model that is one region whose one engine runs every shape, at one shape: the caller's
    arrays go to the engine as they are (copied only where not aligned), and its outputs are new
    arrays handed over. A decoding step has a shape of its own at every step, so buffers kept
    per shape were allocated, filled and copied out every time: 1.0 ms a token on tiny GPT-2
    where onnxruntime takes 0.23."""

    function: RegionRuntime
    feeds: list[tuple[int | None, np.ndarray | None]]  # per region input: (model input, None) or (None, a shape value)
    outputs: list[tuple[tuple[int, ...], np.dtype]]
    order: tuple[int, ...]  # the region output of each model output

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        inputs = [fixed if index is None else _as_fed(arrays[index]) for index, fixed in self.feeds]
        outputs = self.function.run_new_arrays(inputs, self.outputs)
        if outputs is None:
            outputs = [_aligned_empty(shape, dtype) for shape, dtype in self.outputs]
            self.function.run_arrays(inputs, outputs, shaped_here=True)
        handed: set[int] = set()
        result = []
        for index in self.order:
            result.append(outputs[index].copy() if index in handed else outputs[index])
            handed.add(index)
        return result


# An input this large that TVM can take as it is (64-byte aligned, contiguous, writable: a
# previous run's output, a decoder's cache) is passed without a copy; below it, a copy into the
# kept buffer costs less than wrapping the array (about 3 us).
_UNCOPIED_BYTES = 1 << 16


def _fed(buffers: list[tvm.runtime.Tensor], views: list[np.ndarray], arrays: list[np.ndarray]) -> list[tvm.runtime.Tensor]:
    """What `main` runs on: each input copied into its kept buffer, or, where large and aligned,
    the caller's array itself (copying a decoder's 1 MB cache in took a sixth of its step)."""
    fed = buffers
    for index, (view, array) in enumerate(zip(views, arrays)):
        if array.nbytes >= _UNCOPIED_BYTES and array.flags.writeable and _taken_as_is(array):
            fed = list(buffers) if fed is buffers else fed
            fed[index] = tvm.runtime.from_dlpack(array)
        else:
            np.copyto(view, array)
    return fed


def _wrapped(array: np.ndarray) -> tvm.runtime.Tensor:
    """`array` as a TVM tensor without a copy where TVM can take it as it is (writable too:
    DLPack cannot mark an array read-only), else a copy of it."""
    return tvm.runtime.from_dlpack(array if array.flags.writeable and _taken_as_is(array) else _aligned_copy(array))


def _outputs(main: Callable, buffers: list[tvm.runtime.Tensor], fresh: list[bool]) -> list[np.ndarray]:
    """A run of `main` on `buffers`, its outputs as numpy arrays. An output the run allocated is
    handed over as it is; one that is not (a kept input buffer, a constant, a view of either, or
    memory another output already holds) is copied, since the next run or the model itself
    would change it. Copying every output took as long as a decoder's region on its new cache
    (1 MB a step). Which outputs are allocated is found on the first run (`fresh` empty) by
    running again while holding the first run's outputs: what the VM allocates then lies
    elsewhere, what it shares does not move."""
    values = _values(main(*buffers))
    if not fresh:
        again = _values(main(*buffers))
        fresh.extend(isinstance(a, tvm.runtime.Tensor) and a.data_ptr() != b.data_ptr() for a, b in zip(values, again))
        values = again
    arrays, held = [], set()
    for value, allocated in zip(values, fresh):
        if not isinstance(value, tvm.runtime.Tensor):
            arrays.append(value)
            continue
        pointer = value.data_ptr()
        arrays.append(numpy_view(value) if allocated and pointer not in held else numpy_view(value).copy())
        held.add(pointer)
    return arrays


def load(
    path: str | os.PathLike,
    cache_dir: str | os.PathLike | None = None,
    engines: str = "lazy",
    backend_options: Mapping[str, dict] | None = None,
    trusted_keys: Iterable[PublicKey] | None = None,
    strict_engines: bool = False,
) -> CompiledModel:
    """Load an artifact written by `CompiledModel.export`, in this or any other process, after
    checking it (see `byoc.runtime_metadata.artifact`). `backend_options` override the build's
    per-backend options (e.g. the accelerator configuration this runtime drives). With
    `trusted_keys` (Ed25519 public keys), only an artifact one of them signed is loaded.
    Engines embedded in the artifact (`build(..., engines="embed")`) are used where this machine
    is like the one that built them; elsewhere they are rebuilt with a warning, or, with
    `strict_engines`, creating them raises an EngineError that says what differs."""
    if engines not in ("lazy", "eager"):
        raise ByocError(f"engines must be 'lazy' or 'eager', not {engines!r}")
    parts, manifest = read_artifact(path, trusted_keys)
    label = f"artifact {os.fspath(path)!r}"
    backends = {}
    for name in sorted({a.backend for a in parts.artifacts}):
        try:
            backends[name] = get_backend(name)
        except UnknownBackendError:
            origin = parts.vendor_origins.get(name, "an unknown package")
            raise MissingVendorError(
                f"{label} needs vendor {name!r}, registered by {origin}; install that package. "
                f"Registered vendors here: {', '.join(list_backends())}"
            ) from None
        recorded = next(a.codegen for a in parts.artifacts if a.backend == name)
        if backends[name].codegen.kind != recorded:
            raise ArtifactError(f"{label}: vendor {name!r} here generates {backends[name].codegen.kind!r} code; the artifact's "
                                f"regions for it are {recorded!r}")
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
