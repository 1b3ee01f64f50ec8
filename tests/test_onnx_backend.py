"""byoc as an ONNX backend (`onnx.backend.base.Backend`), and how ONNX inputs become run-time
inputs or constants."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import byoc
from byoc.errors import InputError, ModelLoadError
from byoc.onnx_backend import backend_for, supports_device
from byoc.testing.kit import onnxruntime_session
from byoc.testing.onnx_models import light_model

from conftest import assert_fp32_close


def _gemm_model(ir_version: int, with_unread_input: bool = False) -> onnx.ModelProto:
    """x @ W + b, with W and b initializers listed among the graph inputs when `ir_version` < 4."""
    rng = np.random.default_rng(0)
    weight, bias = rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])]
    if ir_version < 4:
        inputs += [helper.make_tensor_value_info("W", TensorProto.FLOAT, [8, 4]), helper.make_tensor_value_info("b", TensorProto.FLOAT, [4])]
    if with_unread_input:
        inputs.append(helper.make_tensor_value_info("unused", TensorProto.FLOAT, [1, 1]))
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "W", "b"], ["y"], name="fc")], "gemm", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(weight, "W"), numpy_helper.from_array(bias, "b")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=ir_version)


def test_initializers_listed_as_inputs_are_constants_and_unread_inputs_are_dropped():
    model = _gemm_model(ir_version=3, with_unread_input=True)
    mod = byoc.from_onnx(model)
    assert [p.name for p in mod["main"].params] == ["x"]
    compiled = byoc.build(byoc.partition_for(mod, "dnnl"))
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    assert_fp32_close(compiled.run(x), onnxruntime_session(model).run(None, {"x": x, "unused": np.zeros((1, 1), np.float32)}))


def test_constants_override_initializers_and_bind_inputs():
    model = _gemm_model(ir_version=3)
    bias = np.full(4, 10.0, np.float32)
    compiled = byoc.build(byoc.from_onnx(model, constants={"b": bias}))
    x = np.zeros((2, 8), np.float32)
    np.testing.assert_array_equal(compiled.run(x)[0], np.broadcast_to(bias, (2, 4)))
    with pytest.raises(ModelLoadError, match="constants given for 'nope', which is neither an input nor an initializer"):
        byoc.from_onnx(model, constants={"nope": bias})
    with pytest.raises(ModelLoadError, match="constant for input 'b': expected shape \\(4,\\), got \\(3,\\)"):
        byoc.from_onnx(model, constants={"b": bias[:3]})


def test_light_graph_with_batch_norms_needs_only_its_data_input():
    """A Caffe2 export (IR version 3) lists 281 initializers among its inputs; its 49 batch norms fold."""
    model = light_model("shufflenet")
    mod = byoc.from_onnx(model)
    assert [p.name for p in mod["main"].params] == ["gpu_0/data_0"]
    ops = {b.value.op.name for block in mod["main"].body.blocks for b in block.bindings
           if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)}
    assert "relax.nn.batch_norm" not in ops and "relax.nn.conv2d" in ops


def test_scalar_inputs_run():
    graph = helper.make_graph([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], "clip",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4]),
                               helper.make_tensor_value_info("lo", TensorProto.FLOAT, []),
                               helper.make_tensor_value_info("hi", TensorProto.FLOAT, [])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = np.linspace(-3, 3, 12, dtype=np.float32).reshape(3, 4)
    got = backend_for("reference").run_model(model, [x, np.float32(-1), np.float32(2)])
    np.testing.assert_array_equal(got[0], np.clip(x, -1, 2))


def test_shape_deciding_inputs_are_specialised_once_per_value():
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "reshape",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                               helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    rep = backend_for("reference").prepare(model)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    assert rep.run([x, np.array([3, 4])])[0].shape == (3, 4)
    assert rep.run({"x": x, "shape": np.array([4, 3])}).y.shape == (4, 3)
    rep.run([x, np.array([3, 4])])
    assert len(rep._compiled) == 2
    with pytest.raises(InputError, match="the model takes 2 input\\(s\\) \\(x, shape\\), got 1"):
        rep.run([x])


def test_run_node_and_devices():
    node = helper.make_node("Relu", ["x"], ["y"])
    x = np.array([[-1.0, 2.0]], np.float32)
    np.testing.assert_array_equal(backend_for("dnnl").run_node(node, [x])[0], [[0.0, 2.0]])
    assert supports_device("CPU") and not supports_device("CUDA")
    with pytest.raises(ValueError, match="byoc runs models on CPU, not 'CUDA'"):
        backend_for("dnnl").prepare(_gemm_model(ir_version=8), "CUDA")
