"""TensorRT engines for regions: the region's ONNX through `trt.OnnxParser`, a serialized plan
from `build_serialized_network`, and runs with `execute_async_v3` on a CUDA stream. Device
memory and streams go through NVIDIA's `cuda-python` (`cuda.bindings.runtime`), what NVIDIA's
own samples use; buffers are allocated once per engine and inputs and outputs are copied once
per call.

A region of a model with dynamic dimensions comes with symbolic shapes (its graph's `dims`, see
byoc.codegen_json.symbolic_dims): its engine is built with one optimization profile, each input's shape
at every dimension's low, opt and high value, and its buffers are allocated for the high ones.
Each run sets the inputs' shapes (where they changed) and copies what the shapes hold.

Nothing here runs without TensorRT and a CUDA device; `unavailable()` says what is missing.
"""

from __future__ import annotations

import platform
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from byoc.backend.settings import VendorSettings, setting
from byoc.codegen_json.symbolic_dims import is_symbolic, shape_at
from byoc.errors import EngineError
from byoc.ir.dim_range import OPEN
from byoc.vendors.tensorrt.versions import format_version, parse_version, resolve_version

INSTALL = ("pip install 'byoc[tensorrt]' --extra-index-url https://pypi.nvidia.com "
           "(TensorRT's wheels are on NVIDIA's index, not the public one), or JetPack on Jetson: see docs/vendors.md")


@dataclass(frozen=True)
class TensorRTSettings(VendorSettings):
    """What TensorRT regions are partitioned and built for. The backend records the version it
    resolved (the installed TensorRT's, else 11.4) with each region, and an engine is only built
    by a TensorRT of the same major version."""

    fp16: bool = setting(False, "compute regions in float16 (inputs and outputs stay float32)")
    workspace_bytes: int = setting(1 << 30, "scratch memory TensorRT's builder may use per engine", minimum=1)
    min_block_size: int = setting(3, "fewest ops a region may have; smaller ones stay on the host", minimum=1)
    remove_no_mac_subgraphs: bool = setting(True, "keep regions without MACs on the host")
    tensorrt_version: str | None = setting(None, "TensorRT version the op checks describe (default: installed, else 11.4)",
                                           hardware=True)

    @property
    def version(self) -> tuple[int, int]:
        return resolve_version(self.tensorrt_version)[0]


def _cuda():
    try:
        from cuda.bindings import runtime
    except ImportError:
        from cuda import cudart as runtime  # cuda-python before 12.6 spelled it this way
    return runtime


def unavailable() -> str | None:
    """Why TensorRT engines cannot be built on this machine, or None when they can."""
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        return f"TensorRT is not installed: {INSTALL}"
    try:
        cuda = _cuda()
    except ImportError:
        return f"cuda-python is not installed (TensorRT engines need it for device memory): {INSTALL}"
    error, count = cuda.cudaGetDeviceCount()
    if error != cuda.cudaError_t.cudaSuccess or count == 0:
        return f"no CUDA device is visible ({error}, {count} device(s))"
    return None


def _checked(result, what: str):
    cuda = _cuda()
    error, *values = result if isinstance(result, tuple) else (result,)
    if error != cuda.cudaError_t.cudaSuccess:
        raise EngineError(f"CUDA {what} failed: {error}")
    return values[0] if len(values) == 1 else values


def environment() -> dict[str, str]:
    """What a plan is bound to: TensorRT's release, the GPU (model and compute capability), the
    CUDA runtime and the platform. Part of the engine cache key, and compared with what an
    artifact's embedded plan was built for before it is deserialized."""
    import tensorrt as trt

    cuda = _cuda()
    device = _checked(cuda.cudaGetDevice(), "device query")
    properties = _checked(cuda.cudaGetDeviceProperties(device), "device properties query")
    name = properties.name.decode(errors="replace") if isinstance(properties.name, bytes) else str(properties.name)
    runtime = int(_checked(cuda.cudaRuntimeGetVersion(), "runtime version query"))
    return {
        "tensorrt": trt.__version__,
        "gpu": name.rstrip("\x00").strip(),
        "compute_capability": f"{properties.major}.{properties.minor}",
        "cuda": f"{runtime // 1000}.{runtime % 1000 // 10}",
        "platform": f"{platform.system()}-{platform.machine()}",
    }


Profile = dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]


def profile_shapes(graph: Mapping[str, Any]) -> Profile:
    """The optimization profile of a region with symbolic shapes: each input whose shape names a
    dimension, at every dimension's low, opt and high value (the ONNX it is given names its
    inputs `input0`, `input1`, ...); empty for a static region. Sizes grow with the dimensions
    (names, +, -, *, //), so the high values give the largest; `%` does not, and is refused."""
    dims = graph.get("dims") or {}
    if not dims:
        return {}
    unbounded = sorted(name for name, span in dims.items() if span["high"] >= OPEN)
    if unbounded:
        raise EngineError(f"{_where(graph)}: a TensorRT optimization profile needs the highest value of each dimension, and "
                          f"nothing bounds {', '.join(map(repr, unbounded))}: import the model with dims={{{unbounded[0]!r}: "
                          "(low, high)}} (on the command line: --dims NAME=LOW:HIGH)")
    at = {key: {name: span[key] for name, span in dims.items()} for key in ("low", "opt", "high")}
    profile: Profile = {}
    for position, spec in enumerate(graph["inputs"]):
        if not is_symbolic(spec["shape"]):
            continue
        if any(isinstance(d, str) and "%" in d for d in spec["shape"]):
            raise EngineError(f"{_where(graph)}: input {position} has the shape {spec['shape']}; an optimization profile "
                              "needs sizes that grow with the dimensions")
        low, opt, high = (shape_at(spec["shape"], at[key]) for key in ("low", "opt", "high"))
        profile[f"input{position}"] = (low, opt, high)
    return profile


def build_plan(onnx_bytes: bytes, settings: TensorRTSettings, where: str, profile: Profile | None = None) -> bytes:
    """A serialized TensorRT plan for one region's ONNX model (with `profile`, for every input
    shape from its low to its high)."""
    import tensorrt as trt

    installed = parse_version(trt.__version__)
    if installed[0] != settings.version[0]:
        raise EngineError(f"{where} was partitioned for TensorRT {format_version(settings.version)}, "
                          f"and TensorRT {trt.__version__} is installed: partition again with tensorrt_version={trt.__version__!r}")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    if installed < (10, 0):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.EXPLICIT_BATCH)
    strongly_typed = settings.fp16 and hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED")
    if strongly_typed:  # float16 is in the graph (cast at the region's boundary); TensorRT 11 knows no other way
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    # The parser holds the weights by reference: onnx_bytes and the parser live until the build ends.
    if not parser.parse(onnx_bytes):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineError(f"{where}: TensorRT's ONNX parser refused the region: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, settings.workspace_bytes)
    if hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)  # float32 means float32, as onnxruntime computes it
    if settings.fp16 and not strongly_typed:  # TensorRT 8.x: half-typed tensors need the builder flag too
        config.set_flag(trt.BuilderFlag.FP16)
    if profile:
        shapes = builder.create_optimization_profile()
        for name, (low, opt, high) in profile.items():
            shapes.set_shape(name, low, opt, high)
        config.add_optimization_profile(shapes)
    start = time.perf_counter()
    print(f"byoc: building the TensorRT engine of {where} ...", file=sys.stderr, flush=True)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise EngineError(f"{where}: TensorRT could not build an engine (see TensorRT's log above)")
    print(f"byoc: TensorRT engine of {where} built in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return bytes(plan)


class TensorRTEngine:
    """One deserialized engine, its execution context, a stream and one device buffer per tensor
    (for an engine with an optimization profile, sized for the profile's largest shapes)."""

    def __init__(self, plan: bytes, where: str, profile: Profile | None = None) -> None:
        import tensorrt as trt

        cuda = _cuda()
        self.plan, self.where = plan, where
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self.runtime.deserialize_cuda_engine(plan)
        if self.engine is None:
            raise EngineError(f"{where}: TensorRT could not load the plan (built by another TensorRT version or for another GPU)")
        self.context = self.engine.create_execution_context()
        self.stream = _checked(cuda.cudaStreamCreate(), "stream creation")
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        by_mode = {mode: sorted((n for n in names if self.engine.get_tensor_mode(n) == mode), key=_position)
                   for mode in (trt.TensorIOMode.INPUT, trt.TensorIOMode.OUTPUT)}
        self.inputs, self.outputs = by_mode[trt.TensorIOMode.INPUT], by_mode[trt.TensorIOMode.OUTPUT]
        # Symbolic shapes: the context set to the profile's largest shapes gives every tensor's
        # largest shape, which its buffer holds; each run sets the shapes it is given.
        self.dynamic = bool(profile)
        self._shapes: tuple | None = None
        for name, (_, _, high) in (profile or {}).items():
            self.context.set_input_shape(name, high)
        self.dtypes: dict[str, np.dtype] = {}
        self.buffers: dict[str, tuple[int, int]] = {}
        for name in names:
            dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype(name)))
            shape = tuple(self.context.get_tensor_shape(name)) if self.dynamic else tuple(self.engine.get_tensor_shape(name))
            if any(d < 0 for d in shape):
                raise EngineError(f"{where}: TensorRT leaves {name}'s shape {shape} open at the profile's largest inputs")
            size = int(np.prod(shape)) * dtype.itemsize
            pointer = _checked(cuda.cudaMalloc(max(size, 1)), f"allocation of {size} bytes for {name}")
            self.dtypes[name], self.buffers[name] = dtype, (int(pointer), size)
            self.context.set_tensor_address(name, int(pointer))

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        cuda = _cuda()
        to_device, to_host = cuda.cudaMemcpyKind.cudaMemcpyHostToDevice, cuda.cudaMemcpyKind.cudaMemcpyDeviceToHost
        if self.dynamic:
            shapes = tuple(array.shape for array in inputs)
            if shapes != self._shapes:
                for name, shape in zip(self.inputs, shapes):
                    if not self.context.set_input_shape(name, shape):
                        raise EngineError(f"{self.where}: TensorRT refused the shape {shape} for {name} (outside the profile)")
                self._shapes = shapes
        staged = []  # host copies in the engine's dtype (TensorRT takes int64 indices as int32)
        for name, array in zip(self.inputs, inputs):
            host = np.ascontiguousarray(array, dtype=self.dtypes[name])
            staged.append(host)
            pointer, size = self.buffers[name]
            _checked(cuda.cudaMemcpyAsync(pointer, host.ctypes.data, min(host.nbytes, size), to_device, self.stream),
                     f"copy of {name} to the device")
        if not self.context.execute_async_v3(int(self.stream)):
            raise EngineError(f"{self.where}: TensorRT's execute_async_v3 failed")
        results = []
        for name, array in zip(self.outputs, outputs):
            host = array if array.dtype == self.dtypes[name] and array.flags.c_contiguous else np.empty(array.shape, self.dtypes[name])
            results.append((host, array))
            pointer, size = self.buffers[name]
            _checked(cuda.cudaMemcpyAsync(host.ctypes.data, pointer, min(host.nbytes, size), to_host, self.stream),
                     f"copy of {name} to the host")
        _checked(cuda.cudaStreamSynchronize(self.stream), "stream synchronisation")
        for host, array in results:
            if host is not array:
                array[...] = host

    def __del__(self) -> None:
        try:
            cuda = _cuda()
            for pointer, _ in getattr(self, "buffers", {}).values():
                cuda.cudaFree(pointer)
            if getattr(self, "stream", None) is not None:
                cuda.cudaStreamDestroy(self.stream)
        except Exception:  # at interpreter shutdown CUDA may be gone already
            pass


def _position(name: str) -> int:
    """input3 -> 3: the ONNX the region is handed as names its tensors by position."""
    digits = re.search(r"(\d+)$", name)
    return int(digits.group(1)) if digits else 0


def _where(graph: Mapping[str, Any]) -> str:
    return f"region {graph['symbol']} (tensorrt)"


def region_onnx(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> bytes:
    """The ONNX model TensorRT's parser is given for a region (after its processing: float16
    casts included)."""
    # The translation reads byoc's IR: imported where an engine is built, never where the plans
    # come embedded and only TVM's runtime is installed.
    from byoc.codegen_json.to_onnx import graph_to_onnx

    return graph_to_onnx(graph, constants).SerializeToString()


def build_engine(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], settings: TensorRTSettings) -> TensorRTEngine:
    profile = profile_shapes(graph)
    plan = build_plan(region_onnx(graph, constants), settings, _where(graph), profile)
    return TensorRTEngine(plan, _where(graph), profile)


def save_engine(engine: TensorRTEngine) -> bytes:
    return engine.plan


def load_engine(plan: bytes, graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], settings: TensorRTSettings) -> TensorRTEngine:
    return TensorRTEngine(plan, _where(graph), profile_shapes(graph))
