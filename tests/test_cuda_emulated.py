"""The CUDA the `cuda` vendor generates, run on the host (tests/cuda_emulation: CUDA's runtime,
cuBLAS and cuDNN as the host emulates them) and compared with onnxruntime: its indexing,
broadcasting, fusion, block reductions, views and library calls are checked here, where there is
no GPU. The same source compiles with nvcc for the GPU (tests/test_cuda_vendor.py); what the host
cannot show (the device's own arithmetic and the libraries' kernels) the GPU check does
(benchmarks/gpu_check.py)."""

import ctypes
import io
import json
import re
import shutil
import subprocess
import warnings
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import byoc
from byoc import models as zoo
from byoc.custom_formats.container import unwrap
from byoc.runtime_metadata.artifact import read_artifact
from tests.conftest import small_model, small_module

EMULATION = Path(__file__).parent / "cuda_emulation"
pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")


def _host_source(source: str) -> str:
    """The generated source with each kernel launch made a call of the emulation's launcher: a
    kernel that synchronises its block runs its threads at once, two warps of them rather than
    eight (each is a host thread; the kernels read their block's size, and two warps still
    reduce across warps)."""
    blocking = set(re.findall(r"__global__ void (\w+)\([^)]*\) \{\n  __shared__", source))

    def launch(match: re.Match) -> str:
        kernel, blocks, threads, args = match.groups()
        if kernel in blocking:
            return f"byoc_launch_block({kernel}, {blocks}, 64, {args});"
        return f"byoc_launch({kernel}, {blocks}, {threads}, {args});"

    return re.sub(r"(\w+)<<<(\d+), (\d+), 0, byoc_stream>>>\((.*?)\);", launch, source)


@pytest.fixture(scope="module")
def libraries(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("emulation") / "libcuda_libraries.so"
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-o", str(path), str(EMULATION / "libraries.cpp")], check=True)
    return str(path)


def _region(name: str, dtype: str, tmp_path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no device here: the build leaves the engine to the machine that loads it
        byoc.build(byoc.partition_for(small_module(name), "cuda", dtype=dtype), strict=True).export(tmp_path / "m.byoc")
    parts, _ = read_artifact(tmp_path / "m.byoc")
    (artifact,) = parts.artifacts
    _, raw = unwrap(artifact.payload, "cuda-region", (1,), name)
    with np.load(io.BytesIO(raw), allow_pickle=False) as arrays:
        header = json.loads(arrays["header"].tobytes())
        return header["graph"], [arrays[f"c{k}"] for k in range(len(header["constants"]))]


def _host_region(graph, tmp_path: Path, arch: int = 90) -> ctypes.CDLL:
    from byoc.codegen_cuda.generate import region_source

    unit = tmp_path / "region.cpp"
    unit.write_text(_host_source(region_source(graph, arch)))
    library = tmp_path / f"region{arch}.so"
    built = subprocess.run(["g++", "-std=c++20", "-O1", "-shared", "-fPIC", f"-I{EMULATION}", "-o", str(library), str(unit), "-ldl",
                            "-lpthread"], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    region = ctypes.CDLL(str(library))
    region.byoc_error.restype = ctypes.c_char_p
    return region


def _init(region: ctypes.CDLL, constants, cublas: str, cudnn: str) -> int:
    kept = [np.ascontiguousarray(c) for c in constants]
    pointers = (ctypes.c_void_p * max(1, len(kept)))(*[c.ctypes.data for c in kept])
    return region.byoc_init(cublas.encode(), cudnn.encode(), pointers, 0)


def _run_on_host(graph, constants, inputs, libraries: str, tmp_path: Path) -> list[np.ndarray]:
    region = _host_region(graph, tmp_path)
    assert _init(region, constants, libraries, libraries) == 0, region.byoc_error()
    given = [np.ascontiguousarray(x) for x in inputs]
    outputs = [np.empty(graph["nodes"][r["node"]]["outputs"][0]["shape"], graph["nodes"][r["node"]]["outputs"][0]["dtype"])
               for r in graph["outputs"]]
    times = (ctypes.c_float * 2)()
    ins = (ctypes.c_void_p * len(given))(*[x.ctypes.data for x in given])
    outs = (ctypes.c_void_p * len(outputs))(*[o.ctypes.data for o in outputs])
    assert region.byoc_run(ins, outs, times) == 0, region.byoc_error()
    region.byoc_release()
    return outputs


BOUNDS = {"float16": 0.01, "bfloat16": 0.08}  # relative L2 (byoc.backend.tolerance's FP16 and BF16)


@pytest.mark.parametrize("name,dtype", [("mlp", "float32"), ("resnet18", "float32"), ("bert_encoder", "float16"),
                                        ("mobilenet_v2", "float32"), ("resnet18", "bfloat16")])
def test_the_generated_cuda_computes_what_onnxruntime_does(name, dtype, libraries, tmp_path):
    graph, constants = _region(name, dtype, tmp_path)
    model = small_model(name)
    inputs = zoo.sample_inputs(model, seed=2)
    got = _run_on_host(graph, constants, list(inputs.values()), libraries, tmp_path)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    for g, w in zip(got, want):
        g = g.astype(np.float32)
        if dtype in BOUNDS:
            error = np.linalg.norm(g - w) / np.linalg.norm(w)
            print(f"{name} {dtype}: relative L2 {error:.2e}")
            assert error <= BOUNDS[dtype], error
        else:
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(np.abs(w).max()))


def test_what_a_region_lacks_on_the_device_is_said_naming_the_region_and_what_failed(libraries, tmp_path, monkeypatch):
    """Another architecture than the device's, a library that will not load, and a device out of
    memory: `byoc_init` fails with a message naming the region and what is missing (the engine
    raises it as an EngineError)."""
    graph, constants = _region("mlp", "float32", tmp_path)
    newer = _host_region(graph, tmp_path, arch=100)
    assert _init(newer, constants, libraries, libraries) == 1
    assert newer.byoc_error().decode() == "region cuda_0 (cuda) is built for sm_100; device 0 (host emulation) is sm_90"
    region = _host_region(graph, tmp_path)
    assert _init(region, constants, str(tmp_path / "libcublas.so.13"), libraries) == 1
    assert region.byoc_error().decode().startswith(f"cuBLAS cannot be loaded ({tmp_path / 'libcublas.so.13'})")
    monkeypatch.setenv("BYOC_EMULATED_MEMORY", "1000")
    (tmp_path / "full").mkdir()
    full = _host_region(graph, tmp_path / "full")  # its own copy: a library loaded twice from one file is one
    assert _init(full, constants, libraries, libraries) == 1
    assert re.fullmatch(r"region cuda_0 \(cuda\): allocating .* on the device: out of memory \(emulated\)", full.byoc_error().decode())
