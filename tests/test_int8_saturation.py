"""int8 on CPUs without VNNI: x86's int8 kernels then add pairs of u8 x s8 products in 16 bits,
which saturate with the full-range weights onnxruntime's tool writes. byoc computes such kernels
in float32 from the model's own weights and scales (byoc.processing.saturation), and quantizes
the weights it picks itself to +-64 (byoc.processing.quantize_model).

The reference is the QDQ graph as ONNX defines it, computed by numpy in float64: onnxruntime's
own int8 kernels saturate without VNNI as oneDNN's do. Tolerance: at most one step of the
result's scale on any element (a float32 sum may round an element near a step boundary the other
way) and 0.1% relative L2; saturation moves whole columns by tens of steps (9% relative L2 on the
dense layer).
On this machine the checks run as its CPU computes; `make test-avx2` runs them with oneDNN
limited to AVX2 without VNNI.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc.errors import SaturationWarning
from byoc.processing.saturation import Int8Product
from byoc.timing import onednn_has_vnni
from byoc.vendors.dnnl import int8

from conftest import onednn_executions

X_SCALE, Y_SCALE, Y_ZERO = 0.05, 0.5, 128


def _layer(kind: str, largest_weight: int) -> onnx.ModelProto:
    """x -> Q/DQ (u8) -> conv or dense with int8 weights up to `largest_weight` -> Q/DQ (u8)."""
    rng = np.random.default_rng(0)
    shape = (64, 29, 3, 3) if kind == "conv" else (256, 64)
    axis = 0 if kind == "conv" else 1
    initializers = [numpy_helper.from_array(np.float32(X_SCALE), "x_scale"), numpy_helper.from_array(np.uint8(0), "x_zero"),
                    numpy_helper.from_array(rng.integers(-largest_weight, largest_weight + 1, shape).astype(np.int8), "w"),
                    numpy_helper.from_array(rng.uniform(0.005, 0.02, shape[axis]).astype(np.float32), "w_scale"),
                    numpy_helper.from_array(np.zeros(shape[axis], np.int8), "w_zero"),
                    numpy_helper.from_array(np.float32(Y_SCALE), "y_scale"), numpy_helper.from_array(np.uint8(Y_ZERO), "y_zero")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zero"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zero"], ["xd"]),
             helper.make_node("DequantizeLinear", ["w", "w_scale", "w_zero"], ["wd"], axis=axis)]
    if kind == "conv":
        nodes.append(helper.make_node("Conv", ["xd", "wd"], ["y"], pads=[1, 1, 1, 1]))
        x_shape, y_shape = [1, 29, 14, 14], [1, 64, 14, 14]
    else:
        nodes.append(helper.make_node("MatMul", ["xd", "wd"], ["y"]))
        x_shape, y_shape = [32, 256], [32, 64]
    nodes += [helper.make_node("QuantizeLinear", ["y", "y_scale", "y_zero"], ["yq"]),
              helper.make_node("DequantizeLinear", ["yq", "y_scale", "y_zero"], ["out"])]
    graph = helper.make_graph(nodes, f"int8_{kind}", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, y_shape)], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    return model


def _reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The QDQ graph computed in float64: quantize and dequantize as ONNX defines them (round half
    to even, clip), the convolution (pad 1) or product exact."""
    arrays = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    source = np.clip(np.rint(x / arrays["x_scale"]), 0, 255) * arrays["x_scale"]
    weights = arrays["w"] * (arrays["w_scale"].reshape(-1, 1, 1, 1) if arrays["w"].ndim == 4 else arrays["w_scale"])
    if weights.ndim == 2:
        y = source @ weights
    else:
        padded, (height, width) = np.pad(source, ((0, 0), (0, 0), (1, 1), (1, 1))), source.shape[2:]
        y = sum(np.einsum("nchw,oc->nohw", padded[:, :, i:i + height, j:j + width], weights[:, :, i, j])
                for i in range(3) for j in range(3))
    return ((np.clip(np.rint(y / Y_SCALE) + Y_ZERO, 0, 255) - Y_ZERO) * Y_SCALE).astype(np.float32)


def _full_range_input(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(1).uniform(0.0, 255 * X_SCALE, shape).astype(np.float32)}  # the source's whole u8 range


@pytest.mark.parametrize("kind", ["dense", "conv"])
@pytest.mark.parametrize("largest_weight", [127, 64])
def test_an_int8_layer_is_exact_whatever_the_cpu(kind, largest_weight, tmp_path):
    model = _layer(kind, largest_weight)
    inputs = _full_range_input(model)
    partitioned = byoc.partition_for(byoc.from_onnx(model), "dnnl")
    assert byoc.report(partitioned).offload_ratio_nodes == 1.0
    compiled = byoc.build(partitioned)
    got, want = compiled.run(inputs)[0], _reference(model, inputs["x"])
    assert np.abs(got - want).max() <= Y_SCALE + 1e-6
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-3
    # in a fresh process as this CPU (or the lane's limit) runs it: int8 where it cannot saturate
    products = [e for e in onednn_executions(compiled, model, tmp_path) if e[3] in ("convolution", "matmul")]
    int8_here = onednn_has_vnni() or largest_weight <= int8.WEIGHT_LEVELS_WITHOUT_VNNI
    assert len(products) == 1 and ("src_u8" in products[0][6]) == int8_here, products


def test_without_vnni_a_kernel_that_would_saturate_is_named(monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    partitioned = byoc.partition_for(byoc.from_onnx(_layer("dense", 127)), "dnnl")
    with pytest.warns(SaturationWarning, match=r"region dnnl_0 \(dnnl\): 1 int8 kernel\(s\) computed in float32.*MatMul.*"
                                               r"weights reach \+-127"):
        byoc.build(partitioned)


def test_the_saturation_rule_reads_the_kernel():
    """What saturates without VNNI, as measured kernel by kernel with oneDNN 3.2 limited to AVX2
    (see byoc.vendors.dnnl.int8.saturates)."""
    full, within = np.array([127, -3], np.int8), np.array([64, -64], np.int8)
    assert "weights reach +-127" in int8.saturates(Int8Product("relax.matmul", "uint8", full))
    assert int8.saturates(Int8Product("relax.matmul", "uint8", within)) is None
    assert int8.saturates(Int8Product("relax.matmul", "int8", within)) is None  # the GEMM's s8 source: exact within +-64
    assert "halves the weights" in int8.saturates(Int8Product("relax.nn.conv2d", "int8", within))
    assert int8.saturates(Int8Product("relax.nn.conv2d", "uint8", within)) is None
    assert "two activations" in int8.saturates(Int8Product("relax.matmul", "uint8", None))


def test_without_vnni_byoc_quantizes_weights_within_64(monkeypatch):
    """precision='int8' picks its own weight scales: +-64 where the kernels have no VNNI, so that
    they run in int8 and cannot saturate (onnxruntime's reduce_range), +-127 with VNNI."""
    from byoc import models as zoo
    from byoc.ir.types import constant_array, is_tensor_constant, op_name
    from byoc.processing.quantize_model import int8_plan, quantize_model

    mod = byoc.from_onnx(zoo.get("resnet18", small=True))
    plan = int8_plan(mod)
    ranges = {i: [-4.0, 4.0] for i in plan.calibrated}

    def largest_weight() -> int:
        quantized = quantize_model(mod, plan, ranges)
        weights = [constant_array(b.value.args[0]) for block in quantized["main"].body.blocks for b in block.bindings
                   if op_name(b.value) == "relax.dequantize" and is_tensor_constant(b.value.args[0])]
        return max(int(np.abs(w.astype(np.int32)).max()) for w in weights)

    if onednn_has_vnni():
        assert largest_weight() == 127
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert largest_weight() == int8.WEIGHT_LEVELS_WITHOUT_VNNI


def test_a_dense_layer_quantized_per_call_is_exact_whatever_the_cpu():
    """`quantize_dynamic`'s dense layer (DynamicQuantizeLinear, MatMulInteger): its input is
    quantized per call over its whole range, so without VNNI the int8 product saturates (0.6%
    relative L2 here with the int8 kernel kept); byoc then reads the quantized input back as
    float32 for a float product."""
    from byoc.models.quantized import quantize_dynamic

    rng = np.random.default_rng(2)
    weights = rng.standard_normal((256, 64)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "dense",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 256])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 64])], [numpy_helper.from_array(weights, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    model.ir_version = 9
    quantized = quantize_dynamic(model)
    arrays = {i.name: numpy_helper.to_array(i) for i in quantized.graph.initializer}
    (w_int8,) = [a for a in arrays.values() if a.dtype == np.int8 and a.shape == weights.shape]
    (w_scale,) = [a for name, a in arrays.items() if name.endswith("scale") and a.dtype == np.float32]
    x = rng.uniform(-3.0, 5.0, (32, 256)).astype(np.float32)
    # DynamicQuantizeLinear as ONNX defines it, then the product exact
    low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = np.float32((high - low) / 255)
    zero = np.clip(np.rint(-low / scale), 0, 255)
    source = (np.clip(np.rint(x / scale) + zero, 0, 255) - zero) * np.float64(scale)
    want = source @ (w_int8.astype(np.float64) * np.float64(w_scale))
    got = byoc.build(byoc.partition_for(byoc.from_onnx(quantized), "dnnl")).run({"x": x})[0]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5


_LOAD = """
import sys, warnings
import byoc
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    byoc.load(sys.argv[1])
print("WARNED" if any("may saturate here" in str(w.message) for w in caught) else "QUIET")
"""


def test_an_artifact_built_with_vnni_warns_where_it_is_loaded_without(tmp_path):
    """Built on a CPU with VNNI, an int8 region keeps its int8 kernels, and the artifact records
    which of them need VNNI to be exact: loaded where oneDNN has none (here: limited to AVX2 in a
    fresh process), a SaturationWarning names the region and kernels; loaded with VNNI, none."""
    if not onednn_has_vnni():
        pytest.skip("this CPU (or its oneDNN limit) has no VNNI: its builds compute such kernels in float32 already")
    model = _layer("dense", 127)
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl"))
    compiled.export(tmp_path / "model.byoc")

    def load(**env) -> str:
        run = subprocess.run([sys.executable, "-c", _LOAD, str(tmp_path / "model.byoc")], capture_output=True, text=True,
                             env={**os.environ, **env}, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        return run.stdout.strip().splitlines()[-1]

    assert load() == "QUIET"
    assert load(ONEDNN_MAX_CPU_ISA="AVX2") == "WARNED"
