"""Forms of Ultralytics' YOLO heads that sent oneDNN to its reference code: a softmax over a middle
axis (the box distributions, 16 bins on axis 1 of 1x16x4xA: 37 ms of YOLOv8n's 55 before, 0.7
after) runs in the layout where that axis is innermost; a concatenation of inputs in different
layouts (two plain, one a convolution's channels-last result) runs on them in plain layout.
Checked against onnxruntime (fp32: 1e-5 of the output's scale) and, with ONEDNN_VERBOSE, by which
primitives ran: none in reference code, on the ISA oneDNN is given."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc.backend.registry import get_backend
from byoc.models import sample_inputs

from conftest import assert_fp32_close, onednn_executions, onnxruntime_outputs


def _head() -> onnx.ModelProto:
    """A YOLOv8-like head: a convolution beside two plain branches, concatenated; the box
    distribution's softmax over its 16 bins (axis 1), then the expectation over them."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((64, 32, 3, 3)).astype("float32") * 0.1, "w"),
               numpy_helper.from_array(np.arange(16, dtype="float32").reshape(1, 16, 1, 1), "bins"),
               numpy_helper.from_array(np.array([1, 16, 4, 200], "int64"), "split_shape")]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["features"], pads=[1, 1, 1, 1], name="stem"),
        helper.make_node("Relu", ["x"], ["plain_a"]),
        helper.make_node("Sigmoid", ["x"], ["plain_b"]),
        helper.make_node("Concat", ["plain_a", "plain_b", "features"], ["joined"], axis=1, name="join"),
        helper.make_node("Reshape", ["joined", "split_shape"], ["distribution"]),
        helper.make_node("Softmax", ["distribution"], ["probabilities"], axis=1, name="bins_softmax"),
        helper.make_node("Mul", ["probabilities", "bins"], ["weighted"]),
        helper.make_node("Relu", ["weighted"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 10, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 4, 200])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_middle_axis_softmax_and_a_mixed_layout_concat_run_in_jit_code(tmp_path):
    if get_backend("dnnl").missing_part():
        pytest.skip("dnnl cannot build here")
    model = _head()
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl"), strict=True)
    assert len(compiled.artifacts) == 1
    inputs = sample_inputs(model, seed=0)
    assert_fp32_close(compiled.run(inputs), onnxruntime_outputs(model, inputs))
    executions = onednn_executions(compiled, model, tmp_path)
    kinds = {e[3] for e in executions}
    assert {"softmax", "concat"} <= kinds, kinds
    assert not [e[3:5] for e in executions if e[4].startswith("ref")], [e[3:5] for e in executions]
