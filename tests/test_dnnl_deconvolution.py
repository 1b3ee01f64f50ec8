"""Transposed convolutions (ONNX ConvTranspose: YOLOv8-seg's mask upsampling, U-Nets' decoders)
run on dnnl as oneDNN's deconvolution with the bias and activation fused, where they stayed on
the host between two regions. Checked against onnxruntime (fp32: 1e-5 of the output's scale)
over strides, paddings, output paddings and groups; an output padding oneDNN cannot take stays
on the host with the reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc.backend.registry import get_backend
from byoc.testing.conformance import FORCED_OFFLOAD

from conftest import assert_fp32_close, onnxruntime_outputs


def _upsampling(channels: int, out: int, kernel: int, stride: int, pad: int, output_pad: int, groups: int = 1,
                bias: bool = True) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((channels, out // groups, kernel, kernel)).astype("float32") * 0.2, "w")]
    if bias:
        weights.append(numpy_helper.from_array(rng.standard_normal((out,)).astype("float32"), "b"))
    nodes = [helper.make_node("ConvTranspose", ["x", "w", *(["b"] if bias else [])], ["up"], strides=[stride, stride],
                              pads=[pad] * 4, output_padding=[output_pad] * 2, group=groups, name="upsample"),
             helper.make_node("Relu", ["up"], ["y"])]
    graph = helper.make_graph(nodes, "upsampling", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, 9, 9])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "h", "w"])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("kernel, stride, pad, output_pad, groups, bias", [
    (2, 2, 0, 0, 1, True),  # YOLOv8-seg's Proto: 2x2, stride 2
    (3, 2, 1, 1, 1, True),  # the output padding taken off the end padding
    (4, 2, 1, 0, 2, True),  # grouped
    (3, 1, 1, 0, 1, False),
])
def test_a_transposed_convolution_runs_on_dnnl(kernel, stride, pad, output_pad, groups, bias):
    if get_backend("dnnl").missing_part():
        pytest.skip("dnnl cannot build here")
    model = _upsampling(8, 6 if groups == 1 else 8, kernel, stride, pad, output_pad, groups, bias)
    partitioned = byoc.partition_for(byoc.from_onnx(model), "dnnl", **FORCED_OFFLOAD)
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and not report.host_ops and report.offload_ratio_macs == 1.0
    compiled = byoc.build(partitioned, strict=True)
    x = {"x": np.random.default_rng(1).standard_normal((1, 8, 9, 9)).astype("float32")}
    assert_fp32_close(compiled.run(x), onnxruntime_outputs(model, x))


def test_an_output_padding_past_the_end_padding_stays_on_the_host_with_the_reason():
    model = _upsampling(8, 6, 3, 2, 0, 1)
    report = byoc.report(byoc.partition_for(byoc.from_onnx(model), "dnnl", **FORCED_OFFLOAD))
    reasons = [reason for op in report.host_ops if any("conv2d_transpose" in name for name in op.ops) for reason in op.reasons]
    assert any("output padding larger than the end padding" in r for r in reasons), reasons


@pytest.mark.parametrize("case", ["test_convtranspose", "test_convtranspose_dilations", "test_convtranspose_group_2_image_3",
                                  "test_convtranspose_autopad_same", "test_convtranspose_pads"])
def test_onnx_convtranspose_cases_pass_on_dnnl(case):
    """onnx's own ConvTranspose cases, their weights made constants as a model's are."""
    from byoc.testing import conformance

    if get_backend("dnnl").missing_part():
        pytest.skip("dnnl cannot build here")
    result = conformance.check_case(conformance.node_case(case), "dnnl", as_weights=True)
    assert result.status == conformance.PASS, result
