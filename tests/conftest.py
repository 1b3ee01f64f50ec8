"""Shared fixtures: small zoo models, onnxruntime references, an isolated engine cache."""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import byoc
from byoc import models as zoo

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

# fp32 paths: byoc and onnxruntime may order reductions differently, nothing more.
FP32_RTOL = 1e-4
FP32_ATOL = 1e-4


@pytest.fixture(scope="session", autouse=True)
def engine_cache(tmp_path_factory):
    """Keep engine caches and extracted libraries of the test run out of the user's home."""
    directory = tmp_path_factory.mktemp("engine-cache")
    os.environ["BYOC_CACHE_DIR"] = str(directory)
    return directory


@functools.cache
def small_model(name: str):
    return zoo.get(name, small=True)


@functools.cache
def small_module(name: str):
    return byoc.from_onnx(small_model(name))


def int8_product_formats() -> tuple[str, str]:
    """The source and weight formats oneDNN's log shows for an int8 convolution or product with
    the full-range weights onnxruntime's tool writes: u8 x s8 with VNNI; without it, float32, as
    its 16-bit sums of pairs of products would saturate (byoc.processing.saturation)."""
    from byoc.timing import onednn_has_vnni

    return ("src_u8", "wei_s8") if onednn_has_vnni() else ("src_f32", "wei_f32")


_RUN_TWICE = """
import sys, onnx, byoc
from byoc import models as zoo
compiled = byoc.load(sys.argv[1])
inputs = zoo.sample_inputs(onnx.load(sys.argv[2]), seed=0)
compiled.run(inputs)
print("MARK", flush=True)
compiled.run(inputs)
"""


def onednn_executions(compiled, model, tmp_path) -> list[list[str]]:
    """The fields of each oneDNN primitive execution (ONEDNN_VERBOSE: [3] the primitive, [4]
    its implementation, [6] its memory formats) in one run of `compiled` on `model`'s sample
    inputs, the second in a fresh process from the exported artifact (the first reorders the
    constant weights)."""
    compiled.export(tmp_path / "model.byoc")
    onnx.save(model, tmp_path / "model.onnx")
    stdout = onednn_verbose(_RUN_TWICE, [str(tmp_path / "model.byoc"), str(tmp_path / "model.onnx")], "1")
    return [line.split(",") for line in stdout.split("MARK")[1].splitlines() if line.startswith("onednn_verbose") and ",exec," in line]


def onednn_verbose(script: str, args: list[str], level: str = "profile") -> str:
    """What `script` prints, run in a fresh process with `args` and ONEDNN_VERBOSE at `level`:
    its own marks, and oneDNN's line for each primitive made and run."""
    run = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True,
                         env={**os.environ, "ONEDNN_VERBOSE": level}, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout


def onnxruntime_outputs(model, inputs) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def assert_fp32_close(actual: list[np.ndarray], expected: list[np.ndarray]) -> None:
    """Float outputs within the fp32 tolerance relative to the output's scale; integer outputs
    (indices) identical."""
    assert len(actual) == len(expected)
    for got, want in zip(actual, expected):
        assert got.shape == want.shape, (got.shape, want.shape)
        if np.issubdtype(want.dtype, np.floating):
            scale = max(1.0, float(np.max(np.abs(want))))
            np.testing.assert_allclose(got, want, rtol=FP32_RTOL, atol=FP32_ATOL * scale)
        else:
            np.testing.assert_array_equal(got, want)
