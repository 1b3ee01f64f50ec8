"""The `cuda` vendor: regions compiled by nvcc for a named GPU architecture, built and checked
here without a GPU (the code of the zoo's ResNet and BERT compiles for sm_90 and sm_80, in float32
and float16), and run against onnxruntime where a CUDA device is (skipped elsewhere, with the
reason)."""

import io
import json
import re
import subprocess
import warnings

import numpy as np
import pytest

import byoc
from byoc.codegen_cuda.compile import nvcc
from byoc.codegen_cuda.engine import device_missing
from byoc.errors import EngineError, OptionError
from byoc.runtime_metadata.artifact import read_artifact
from tests.conftest import small_model, small_module

needs_nvcc = pytest.mark.skipif(nvcc() is None, reason="nvcc (CUDA's toolkit) is not installed")
NO_DEVICE = device_missing()


def _build(name: str, **options):
    partitioned = byoc.partition_for(small_module(name), "cuda", **options)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore" if NO_DEVICE else "error")
        return partitioned, byoc.build(partitioned, strict=True)


def _payload(compiled, tmp_path) -> dict:
    compiled.export(tmp_path / "m.byoc")
    parts, _ = read_artifact(tmp_path / "m.byoc")
    (artifact,) = parts.artifacts
    from byoc.custom_formats.container import unwrap

    _, raw = unwrap(artifact.payload, "cuda-region", (1,), "test")
    with np.load(io.BytesIO(raw), allow_pickle=False) as arrays:
        return {"header": json.loads(arrays["header"].tobytes()), "library": arrays["library"].tobytes(),
                "constants": [arrays[f"c{k}"] for k in range(len(arrays.files) - 2)]}


@pytest.mark.parametrize("name", ["resnet18", "bert_encoder"])
def test_the_zoos_cnn_and_encoder_are_one_region_with_every_mac(name):
    report = byoc.report(byoc.partition_for(small_module(name), "cuda"))
    assert len(report.regions) == 1 and not report.host_ops, report


@needs_nvcc
@pytest.mark.parametrize("name,dtype", [("resnet18", "float32"), ("bert_encoder", "float16"), ("mlp", "bfloat16")])
def test_a_region_compiles_for_the_architecture_named_with_its_constants_in_the_device_dtype(name, dtype, tmp_path):
    _, compiled = _build(name, dtype=dtype)
    payload = _payload(compiled, tmp_path)
    assert payload["header"]["arch"] == "sm_90"
    library = tmp_path / "region.so"
    library.write_bytes(payload["library"])
    sections = subprocess.run(["readelf", "-S", "-W", str(library)], capture_output=True, text=True).stdout
    assert ".nv_fatbin" in sections  # the device code is in the library, not compiled where it runs
    symbols = subprocess.run(["readelf", "--dyn-syms", "-W", str(library)], capture_output=True, text=True).stdout
    assert all(f" {name}\n" in symbols or symbols.rstrip().endswith(name) for name in ("byoc_init", "byoc_run", "byoc_release"))
    itemsizes = {c.dtype.itemsize for c in payload["constants"] if c.ndim}  # bfloat16 is kept as its two bytes
    assert itemsizes == {2 if dtype != "float32" else 4}, itemsizes
    assert {c["dtype"] for c in payload["header"]["graph"]["constants"].values() if c["shape"]} == {dtype}


@needs_nvcc
def test_another_architecture_is_compiled_as_named_and_a_malformed_one_is_refused(tmp_path):
    _, compiled = _build("mlp", arch="sm_80")
    assert _payload(compiled, tmp_path)["header"]["arch"] == "sm_80"
    with pytest.raises(OptionError, match="sm_<major><minor>"):
        byoc.partition_for(small_module("mlp"), "cuda", arch="hopper")


@needs_nvcc
@pytest.mark.skipif(NO_DEVICE is None, reason="this machine has a CUDA device: the run is checked below")
def test_without_a_device_the_region_is_built_and_its_run_says_what_is_missing(tmp_path):
    partitioned = byoc.partition_for(small_module("mlp"), "cuda")
    with pytest.warns(UserWarning, match="region cuda_0 \\(cuda\\): its code is built, but not run or checked here"):
        compiled = byoc.build(partitioned, strict=True)
    compiled.export(tmp_path / "m.byoc")
    loaded = byoc.load(tmp_path / "m.byoc")
    x = np.zeros(loaded.parts.inputs[0].shape, np.float32)
    with pytest.raises(EngineError, match=re.escape(f"region cuda_0 (cuda, built for sm_90): {NO_DEVICE}")):
        loaded.run(x)


@needs_nvcc
@pytest.mark.skipif(NO_DEVICE is not None, reason=f"no CUDA device here ({NO_DEVICE})")
@pytest.mark.parametrize("name,dtype", [("resnet18", "float32"), ("resnet18", "float16"), ("bert_encoder", "float32"),
                                        ("bert_encoder", "float16"), ("bert_encoder", "bfloat16")])
def test_on_a_device_the_regions_match_onnxruntime(name, dtype):
    import onnxruntime as ort

    from byoc import models as zoo

    _, compiled = _build(name, dtype=dtype)
    model = small_model(name)
    inputs = zoo.sample_inputs(model, seed=3)
    got = compiled.run(inputs)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, inputs)
    for g, w in zip(got, want):
        if dtype != "float32":
            assert np.linalg.norm(g - w) <= {"float16": 0.01, "bfloat16": 0.08}[dtype] * np.linalg.norm(w)
        else:
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3 * float(np.abs(w).max()))
