"""How a compiled model runs, by what it is: a model of static shapes through TVM's VM (`StaticRunner`),
one with dynamic dimensions through the VM at any shape in range (`DynamicRunner`), and a model
that is one region called directly, without the VM (`DirectRunner`). `CompiledModel.run` checks
the inputs and hands them to one of them.

Each keeps per-thread state (a VM, input buffers, the shapes met most recently): a VM is not safe
to share between threads, and buffers kept across runs save an allocation and its page faults
on every call.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import tvm
import tvm_ffi
from tvm.runtime.vm import VirtualMachine

from byoc.codegen_json.symbolic_dims import shape_at
from byoc.runtime_metadata.artifact_types import ModelParts, RegionArtifact, TensorSpec
from byoc.runtime_metadata.current_dims import reset_current_dims, set_current_dims
from byoc.runtime_metadata.dispatch import RegionRuntime, create_vm
from byoc.runtime_metadata.numpy_views import numpy_view
from byoc.runtime_metadata.shape_values import SHAPE_VALUES

if TYPE_CHECKING:
    from byoc.runtime_metadata.shapes import SpecialisedRuntime

# Input buffers a model with dynamic dimensions keeps per thread, for its most recent shapes.
KEPT_INPUT_SHAPES = 8


class ThreadVMs:
    """Each thread's TVM VirtualMachine of the model (a VM is not safe to share between threads),
    over its host library, regions and what the host calls by name."""

    def __init__(self, host: tvm.runtime.Module, regions: Mapping[str, RegionRuntime], artifacts: list[RegionArtifact],
                 by_name: Mapping[str, Callable], dynamic: bool = False) -> None:
        self._host, self._regions, self._artifacts, self._by_name = host, regions, artifacts, by_name
        # TVM's pooled allocator keeps every buffer it frees for a later one of the same size: one
        # set of sizes for a model of static shapes, but one set per shape met for a model with
        # dynamic dimensions, without bound (a tiny BERT at 1,000 random shapes: +336 MiB, against
        # +167 MiB allocating each buffer when needed, at the same speed).
        self.memory = "naive" if dynamic else "pooled"
        self._local = threading.local()

    def get(self) -> VirtualMachine:
        vm = getattr(self._local, "vm", None)
        if vm is None:
            vm = self._local.vm = self.of_its_own()
        return vm

    def made(self) -> bool:
        """Whether this thread made its VM (a model run directly makes none)."""
        return getattr(self._local, "vm", None) is not None

    def of_its_own(self) -> VirtualMachine:
        """A VirtualMachine of its own, for calls made while another runs `main`."""
        return create_vm(self._host, self._regions.values(), self._artifacts, self._by_name, self.memory)


def _met_before(local: threading.local, values: Mapping[str, int]) -> bool:
    """Whether this thread ran the model at these dimensions before (the most recent kept)."""
    met = getattr(local, "met", None)
    if met is None:
        met = local.met = collections.OrderedDict()
    key = tuple(values.items())
    if key in met:
        met.move_to_end(key)
        return True
    met[key] = None
    while len(met) > 4 * KEPT_INPUT_SHAPES:
        met.popitem(last=False)
    return False


def _allocated_outputs(local: threading.local) -> list[bool]:
    """This thread's record of which outputs of `main` a run allocates (see `_outputs`): one
    for every shape, found on the first run (a decoder's every step is a shape of its own)."""
    allocated = getattr(local, "allocated", None)
    if allocated is None:
        allocated = local.allocated = []
    return allocated


class StaticRunner:
    """A model of static shapes: `main` in this thread's VM, on input buffers kept across runs."""

    def __init__(self, vms: ThreadVMs, inputs: list[TensorSpec]) -> None:
        self._vms, self._inputs = vms, inputs
        self._local = threading.local()

    def run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        main, buffers, views, fresh = self._entry()
        return _outputs(main, _fed(buffers, views, arrays), fresh)

    def _entry(self) -> tuple[Callable, list[tvm.runtime.Tensor], list[np.ndarray], list[bool]]:
        """This thread's `main`, the input buffers it keeps, numpy views of them, and which of its
        outputs a run allocates (see `_outputs`). Inputs are
        copied into kept buffers (a fresh allocation per run pays page faults: 0.1 ms or more for
        a 224x224 image; TVM takes no numpy memory that is not 64-byte aligned), through views
        (Tensor.copyfrom took 7 us a call, looking `main` up 16 us: a fifth of a tiny GPT-2's run)."""
        entry = getattr(self._local, "entry", None)
        if entry is None:
            buffers = [tvm.runtime.empty(s.shape, s.dtype) for s in self._inputs]
            entry = self._local.entry = (self._vms.get()["main"], buffers, [numpy_view(b) for b in buffers],
                                         _allocated_outputs(self._local))
        return entry


class DynamicRunner:
    """A model with dynamic dimensions: the host code takes any shape in range, each
    shape-specialised region the variant for these dimensions."""

    def __init__(self, vms: ThreadVMs, inputs: list[TensorSpec]) -> None:
        self._vms, self._inputs = vms, inputs
        self._local = threading.local()

    def run(self, arrays: list[np.ndarray], values: Mapping[str, int]) -> list[np.ndarray]:
        token = set_current_dims(values)
        try:
            entry = self._entry(tuple(a.shape for a in arrays), values)
            if entry is None:  # shapes met for the first time: the caller's arrays, as they are where TVM can take them
                return _outputs(self._local.main, [_wrapped(a) for a in arrays], _allocated_outputs(self._local))
            main, buffers, views, fresh = entry
            return _outputs(main, _fed(buffers, views, arrays), fresh)
        finally:
            reset_current_dims(token)

    def _entry(self, shapes: tuple, values: Mapping[str, int]) -> tuple[Callable, list[tvm.runtime.Tensor], list[np.ndarray], list[bool]] | None:
        """This thread's `main` and input buffers for these input shapes (of these dimension
        `values`), kept for the shapes run most recently (as `StaticRunner` keeps them); None for
        shapes met for the first time (`_met_before`). A decoder's every step
        has a cache one longer: buffers allocated for each new shape cost their allocation and
        page faults (0.15 ms a step of tiny GPT-2, as much as onnxruntime's whole step), where
        wrapping the caller's arrays costs 3 us each."""
        entries = getattr(self._local, "dynamic", None)
        if entries is None:
            entries = self._local.dynamic = collections.OrderedDict()
            self._local.main = self._vms.get()["main"]
        entry = entries.get(shapes)
        if entry is not None:
            entries.move_to_end(shapes)
            return entry
        if not _met_before(self._local, values):
            return None
        buffers = [tvm.runtime.empty(shape, spec.dtype) for shape, spec in zip(shapes, self._inputs)]
        entry = entries[shapes] = (self._local.main, buffers, [numpy_view(b) for b in buffers], _allocated_outputs(self._local))
        while len(entries) > KEPT_INPUT_SHAPES:
            entries.popitem(last=False)
        return entry


class DirectRunner:
    """A model that is one region called with its inputs: an engine, or C in the host library (a
    region generated per shape: its variant for the dimensions), without the VM."""

    def __init__(self, parts: ModelParts, regions: Mapping[str, RegionRuntime], host: tvm.runtime.Module,
                 specialised: Mapping[str, SpecialisedRuntime], by_name: Mapping[str, Callable]) -> None:
        self.parts, self._regions, self._host, self._specialised, self._by_name = parts, regions, host, specialised, by_name
        self._local = threading.local()

    def run(self, arrays: list[np.ndarray], values: Mapping[str, int] | None = None) -> list[np.ndarray]:
        # A shape met for the first time runs on the caller's arrays where one engine runs every
        # shape; one met again gets kept buffers, whose bindings the engine reuses (a decoding
        # step's shape is new at every step, a server's shapes repeat).
        if values and not _met_before(self._local, values):
            plan = self._engine_plan(values)
            if plan is not None:
                return plan.run(arrays)
        call, inputs, outputs = self._entry(values)
        for buffer, index in zip(inputs, self.parts.direct_call.inputs):
            np.copyto(buffer, arrays[index])
        call()
        return [outputs[index].copy() for index in self.parts.direct_call.outputs]

    def _entry(self, values: Mapping[str, int] | None = None) -> tuple[Callable[[], None], list[np.ndarray], list[np.ndarray]]:
        """This thread's direct call and its buffers: numpy views of TVM-allocated tensors,
        aligned as engines are promised, the same ones run after run (for a region with symbolic
        shapes, per set of dimension `values`, the most recent kept)."""
        entries = getattr(self._local, "direct", None)
        if entries is None:
            entries = self._local.direct = collections.OrderedDict()
        key = tuple(values.items()) if values else None
        entry = entries.get(key)
        if entry is None:
            entry = entries[key] = self._call(values or {})
            while len(entries) > KEPT_INPUT_SHAPES:
                entries.popitem(last=False)
        elif values:
            entries.move_to_end(key)
        return entry[:3]

    def _call(self, values: Mapping[str, int]) -> tuple:
        direct = self.parts.direct_call
        symbol = direct.symbol
        if symbol in self._specialised:  # generated per shape: the variant for these dimensions
            function, artifact = self._specialised[symbol].variant_and_artifact(values)
        else:
            artifact = next(a for a in self.parts.artifacts if a.symbol == symbol)
            function = self._regions.get(symbol) or self._host.get_function(symbol, query_imports=True)
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

    def _engine_plan(self, values: Mapping[str, int]) -> _EnginePlan | None:
        """How to run the direct call once at these dimensions where one engine runs every shape
        (None where the region is C or generated per shape)."""
        direct = self.parts.direct_call
        function = self._regions.get(direct.symbol)  # not a region generated per shape (those are in `specialised`)
        if not isinstance(function, RegionRuntime):
            return None
        fixed = {position: view for position, (_, view) in self._shape_values(values).items()}
        fed = iter(direct.inputs)
        feeds = [(None, fixed[p]) if p in fixed else (next(fed), None) for p in range(len(function.artifact.inputs))]
        outputs = [(shape_at(s.shape, values), np.dtype(s.dtype)) for s in function.artifact.outputs]
        return _EnginePlan(function, feeds, outputs, direct.outputs)


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
