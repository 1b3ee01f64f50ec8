"""A float32 dense product runs oneDNN's matmul or OpenBLAS's sgemm, whichever was measured faster
on this machine (byoc.codegen_c.onednn.product_choice): both give onnxruntime's results, the choice
is kept per machine and shape, and OpenBLAS's threads sleep between calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc import models as zoo
from byoc.codegen_c.onednn import openblas, product_choice
from byoc.errors import BuildError, OptionError

from conftest import assert_fp32_close, onednn_executions, onnxruntime_outputs, small_model

pytestmark = pytest.mark.skipif(not openblas.installed(), reason=f"{openblas.PACKAGE} is not installed")


def _dense_forms() -> onnx.ModelProto:
    """The dense products the dnnl vendor fuses, each over rows of a rank-3 input: none fused, a
    bias and ReLU, a bias and a residual of the result's shape, and a scale with no bias."""
    rng = np.random.default_rng(0)

    def weights(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "w0"], ["plain"]),
        helper.make_node("MatMul", ["plain", "w1"], ["p1"]), helper.make_node("Add", ["p1", "b1"], ["biased"]),
        helper.make_node("Relu", ["biased"], ["relu"]),
        helper.make_node("MatMul", ["relu", "w2"], ["p2"]), helper.make_node("Add", ["p2", "b2"], ["p2b"]),
        helper.make_node("Add", ["p2b", "plain"], ["residual"]),
        helper.make_node("MatMul", ["residual", "w3"], ["p3"]), helper.make_node("Mul", ["p3", "half"], ["y"]),
    ]
    initializers = [weights("w0", 64, 96), weights("w1", 96, 96), numpy_helper.from_array(rng.standard_normal(96).astype(np.float32), "b1"),
                    weights("w2", 96, 96), numpy_helper.from_array(rng.standard_normal(96).astype(np.float32), "b2"), weights("w3", 96, 32),
                    numpy_helper.from_array(np.array(0.5, np.float32), "half")]
    graph = helper.make_graph(nodes, "dense_forms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 24, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 24, 32])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("model", [_dense_forms(), small_model("bert_encoder")], ids=["dense_forms", "bert_encoder"])
def test_dense_products_by_openblas_give_onnxruntimes_results(model, tmp_path):
    inputs = zoo.sample_inputs(model, seed=0)
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl"), backend_options={"dnnl": {"dense_kernel": "openblas"}})
    assert_fp32_close([np.asarray(o) for o in compiled.run(inputs)], onnxruntime_outputs(model, inputs))
    # Each dense product is sgemm, so oneDNN runs no matmul but the attention's products of two
    # activations (BERT's scores), and the bias and post-ops as binary or element-wise primitives.
    executed = [fields[3] for fields in onednn_executions(compiled, model, tmp_path)]
    dense = sum(1 for node in model.graph.node if node.op_type in ("MatMul", "Gemm") and node.input[1] in {i.name for i in model.graph.initializer})
    by_onednn = byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl"), backend_options={"dnnl": {"dense_kernel": "onednn"}})
    assert executed.count("matmul") == [f[3] for f in onednn_executions(by_onednn, model, tmp_path)].count("matmul") - dense


def test_the_choice_is_measured_once_per_machine_and_shape(tmp_path, monkeypatch):
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "engines"))
    product = product_choice.Product(64, 512, 512, bias=True, post=False)
    assert product.m * product.k * product.n >= product_choice.MEASURED_MACS
    entry = product_choice.measured(product)
    assert entry["onednn"] > 0 and entry["openblas"] > 0
    assert entry["kernel"] == ("openblas" if entry["openblas"] <= product_choice.MARGIN * entry["onednn"] else "onednn")
    kept = json.loads(product_choice.choices_path().read_text())
    assert kept[product.key] == entry and kept["machine"] == product_choice.machine_key()

    def timed(product):
        raise AssertionError(f"{product.key} timed again")

    monkeypatch.setattr(product_choice, "_time", timed)
    assert product_choice.kernel_for(product) == entry["kernel"]  # from the cache
    # Another machine (here: another thread count) has choices of its own.
    monkeypatch.setenv("BYOC_NUM_THREADS", "1")
    with pytest.raises(AssertionError, match="timed again"):
        product_choice.measured(product)


def test_a_named_kernel_is_taken_as_named_and_a_wrong_one_is_an_error(monkeypatch):
    product = product_choice.Product(8, 8, 8, bias=False, post=False)
    monkeypatch.setattr(product_choice, "_time", lambda product: pytest.fail("a named kernel is not measured"))
    assert [product_choice.kernel_for(product, kernel) for kernel in product_choice.KERNELS] == list(product_choice.KERNELS)
    with pytest.raises(BuildError, match="dense_kernel='mkl': expected one of measured, onednn, openblas"):
        product_choice.kernel_for(product, "mkl")
    partitioned = byoc.partition_for(byoc.from_onnx(_dense_forms()), "dnnl")
    with pytest.raises(OptionError, match="dense_kernel='mkl' is not one of measured, onednn, openblas"):
        byoc.build(partitioned, backend_options={"dnnl": {"dense_kernel": "mkl"}})


_SPIN = """
import os
from byoc.codegen_c.onednn import openblas
openblas.prepare(1)
print(os.environ[openblas.SPIN_ENV], openblas.core())
"""


@pytest.mark.parametrize("given, expected", [(None, openblas.SPIN_LEAST), ("12", "12")])
def test_openblas_threads_sleep_between_calls_unless_the_user_says(given, expected):
    env = {k: v for k, v in os.environ.items() if k != openblas.SPIN_ENV}
    if given is not None:
        env[openblas.SPIN_ENV] = given
    run = subprocess.run([sys.executable, "-c", _SPIN], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    spin, core = run.stdout.split()
    assert spin == expected and core != "not installed"



_IDLE_AFTER_SGEMM = """
import ctypes, os, time
import numpy as np
from byoc.codegen_c.onednn import openblas
openblas.library_dirs()  # what a region's link flags ask first
openblas.prepare(2)
library = ctypes.CDLL(os.path.join(openblas.library_dir(), "libscipy_openblas.so"))
n = 768
a, b, c = (np.ones((n, n), np.float32) for _ in range(3))
pointer = lambda x: x.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
library.scipy_cblas_sgemm(101, 111, 111, n, n, n, ctypes.c_float(1), pointer(a), n, pointer(b), n, ctypes.c_float(0), pointer(c), n)
start = time.process_time()
time.sleep(0.4)
print(time.process_time() - start)
"""


def test_openblas_threads_sleep_after_a_call_whatever_loaded_the_library_first():
    # A spinning OpenBLAS thread took a core from every oneDNN primitive run after it: each dnnl
    # model built after the first in a process ran at half speed. Idle, the process uses no CPU.
    env = {k: v for k, v in os.environ.items() if k != openblas.SPIN_ENV}
    run = subprocess.run([sys.executable, "-c", _IDLE_AFTER_SGEMM], capture_output=True, text=True, env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    assert float(run.stdout) < 0.02, f"{float(run.stdout):.3f} s of CPU while idle: OpenBLAS's threads spin"

_LOAD_WITH_CHOICE = """
import json, sys, numpy as np, byoc
from byoc.codegen_c.onednn import product_choice
key, kernel = sys.argv[2], sys.argv[3]
path = product_choice.choices_path()
path.parent.mkdir(parents=True, exist_ok=True)
path.write_text(json.dumps({key: {"onednn": 1.0, "openblas": 1.0, "kernel": kernel}, "machine": product_choice.machine_key()}))
model = byoc.load(sys.argv[1])
x = np.load(sys.argv[4])
np.save(sys.argv[5], model.run(x)[0])
print("MARK", flush=True)
model.run(x)
"""


def _wide_dense() -> onnx.ModelProto:
    """One dense layer with a bias and GELU, large enough (64 x 512 x 512) for its kernel to be chosen."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["p"]), helper.make_node("Add", ["p", "b"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    initializers = [numpy_helper.from_array((rng.standard_normal((512, 512)) / 23).astype(np.float32), "w"),
                    numpy_helper.from_array(rng.standard_normal(512).astype(np.float32), "b")]
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 512])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 512])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("built, here", [("onednn", "openblas"), ("openblas", "onednn")])
def test_the_kernel_is_the_loading_machines_choice(built, here, tmp_path, monkeypatch):
    """An artifact carries both kernels of a product large enough to choose for; the one that runs
    is the choice of the machine that loads it (here seeded into its cache), not the builder's."""
    model = _wide_dense()
    product = product_choice.Product(64, 512, 512, bias=True, post=True)
    assert product.m * product.k * product.n >= product_choice.MEASURED_MACS
    monkeypatch.setenv("BYOC_CACHE_DIR", str(tmp_path / "build" / "engines"))
    monkeypatch.setattr(product_choice, "_time", lambda p: {"onednn": 1.0, "openblas": 0.5 if built == "openblas" else 2.0})
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl"))
    compiled.export(tmp_path / "wide.byoc")
    x = np.random.default_rng(2).standard_normal((1, 64, 512)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "BYOC_CACHE_DIR": str(tmp_path / "load" / "engines"), "ONEDNN_VERBOSE": "1"}
    run = subprocess.run([sys.executable, "-c", _LOAD_WITH_CHOICE, str(tmp_path / "wide.byoc"), product.key, here,
                          str(tmp_path / "x.npy"), str(tmp_path / "y.npy")], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    executed = [line.split(",")[3] for line in run.stdout.split("MARK")[1].splitlines() if ",exec," in line]
    assert ("matmul" in executed) == (here == "onednn"), executed
    assert_fp32_close([np.load(tmp_path / "y.npy")], onnxruntime_outputs(model, {"x": x}))
