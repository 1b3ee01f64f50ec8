"""Grouped convolutions with a channel multiplier (one input channel per group, m outputs per
group: FastViT and MobileOne between stages) run as a repeat of the input and a depthwise
convolution on dnnl (byoc.vendors.dnnl.channel_multiplier). oneDNN has no JIT kernel for the
grouped form on AVX2, and ran it in its reference code or im2col GEMM (FastViT-T8: 28 of 41 ms).
Checked against onnxruntime (fp32: 1e-5 of the output's scale) and, with ONEDNN_VERBOSE, by
which convolutions ran: every one depthwise, in a JIT kernel, on the ISA oneDNN is given."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc.backend.registry import get_backend
from byoc.models import sample_inputs
from byoc.testing.conformance import FORCED_OFFLOAD

from conftest import assert_fp32_close, onednn_executions, onnxruntime_outputs


def _widening() -> onnx.ModelProto:
    """48 channels to 96 (7x7, stride 2, as FastViT's stage transition), then 96 to 192 (1x1)."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal(shape).astype("float32") * 0.2, name)
               for name, shape in (("w7", (96, 1, 7, 7)), ("b7", (96,)), ("w1", (192, 1, 1, 1)))]
    nodes = [
        helper.make_node("Conv", ["x", "w7", "b7"], ["wide"], group=48, strides=[2, 2], pads=[3, 3, 3, 3], name="widen_7x7"),
        helper.make_node("Relu", ["wide"], ["act"]),
        helper.make_node("Conv", ["act", "w1"], ["y"], group=96, name="widen_1x1"),
    ]
    graph = helper.make_graph(nodes, "widening", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 48, 32, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 192, 16, 16])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_channel_multiplier_runs_depthwise_in_a_jit_kernel(tmp_path):
    missing = get_backend("dnnl").missing_part()
    if missing:
        pytest.skip(f"dnnl cannot build here: {missing}")
    model = _widening()
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl"))
    assert len(compiled.artifacts) == 1
    inputs = sample_inputs(model, seed=0)
    assert_fp32_close(compiled.run(inputs), onnxruntime_outputs(model, inputs))
    convolutions = [e for e in onednn_executions(compiled, model, tmp_path) if e[3] == "convolution"]
    problems = [e[-2] for e in convolutions]
    assert len(convolutions) == 2 and "g96mb1_ic96oc96" in problems[0] and "g192mb1_ic192oc192" in problems[1], problems
    assert all("ref" not in e[4] and "gemm" not in e[4] for e in convolutions), [e[4] for e in convolutions]


@pytest.mark.parametrize("axis", [0, 2, -1])
def test_a_repeat_along_any_axis_is_a_strided_copy(axis):
    """torch's repeat_interleave, which dnnl takes as it takes the channel multiplier's repeat."""
    from tvm import relax
    from tvm.script import relax as R

    if get_backend("dnnl").missing_part():
        pytest.skip("dnnl cannot build here")
    x = relax.Var("x", relax.TensorType((2, 3, 4, 5), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(R.nn.relu(R.repeat(R.nn.relu(x), 3, axis=axis)))
        builder.emit_func_output(out)
    compiled = byoc.build(byoc.partition_for(builder.get(), "dnnl", **FORCED_OFFLOAD), strict=True)
    assert len(compiled.artifacts) == 1
    value = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype("float32")
    np.testing.assert_array_equal(compiled.run(value)[0], np.repeat(np.maximum(value, 0), 3, axis=axis))
