"""Shared fixtures: small zoo models, onnxruntime references, an isolated engine cache."""

from __future__ import annotations

import functools
import os
import sys

import numpy as np
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
