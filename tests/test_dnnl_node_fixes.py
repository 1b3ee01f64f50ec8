"""onnx node cases that dnnl failed when made to take every op it claims (the kit's strict,
forced-offload run): HardSigmoid and HardSwish, whose clip TVM's importer writes with integer
bounds (the emitted C read `0f`), and means over every axis (ReduceMean without axes, the mean
of a loss), whose axis is None; and Abs, which torch.export writes for F.normalize (Swin v2's
cosine attention, ConvNeXt V2) and dnnl had no rule for: each cut a region in two."""

from __future__ import annotations

import importlib

import onnx.backend.test.case.node as onnx_node_cases
import pytest
from onnx.backend.test.case.test_case import TestCase

from byoc.backend.registry import get_backend
from byoc.testing.conformance import run_case, vendor_takes


def _node_case(module: str, name: str) -> TestCase:
    """One of onnx's node cases, made alone: importing the module that defines it makes its
    cases, where loading the stored ones reads all 1,900 (seconds)."""
    importlib.import_module(f"onnx.backend.test.case.node.{module}")
    return next(case for case in onnx_node_cases._NodeTestCases if case.name == name)


@pytest.mark.parametrize(("module", "case"), [
    ("hardsigmoid", "test_hardsigmoid_example"),
    ("hardswish", "test_hardswish"),
    ("reducemean", "test_reduce_mean_default_axes_keepdims_random"),
    ("negativeloglikelihoodloss", "test_nllloss_NCd1d2_reduction_mean"),  # a mean to a scalar
    ("abs", "test_abs"),  # torch's F.normalize writes it (Swin v2, ConvNeXt V2 through from_torch)
])
def test_node_case_runs_in_dnnl_strictly(module, case):
    missing = get_backend("dnnl").missing_part()
    if missing:
        pytest.skip(f"dnnl cannot build here: {missing}")
    node_case = _node_case(module, case)
    assert vendor_takes(node_case, "dnnl")
    run_case(node_case, "dnnl")


def test_hard_activations_are_one_eltwise_primitive_each(tmp_path):
    """TVM's importer writes HardSwish as x * clip(x + 3, 0, 6) / 6 and HardSigmoid as
    clip(x * alpha + beta, 0, 1): four primitives each, 29 times in MobileNetV3 (1.07-1.21x
    onnxruntime); dnnl takes each form as oneDNN's hardswish or hardsigmoid (0.94-0.97x)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    import byoc
    from byoc.models import sample_inputs

    from conftest import assert_fp32_close, onednn_executions, onnxruntime_outputs

    if get_backend("dnnl").missing_part():
        pytest.skip("dnnl cannot build here")
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 8, 3, 3)).astype("float32") * 0.5, "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("HardSwish", ["c"], ["a"]),
             helper.make_node("HardSigmoid", ["a"], ["y"], alpha=0.2, beta=0.4)]
    graph = helper.make_graph(nodes, "hard", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])], [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl"), strict=True)
    inputs = sample_inputs(model, seed=0)
    assert_fp32_close(compiled.run(inputs), onnxruntime_outputs(model, inputs))
    executed = [(e[3], e[-3]) for e in onednn_executions(compiled, model, tmp_path) if e[3] in ("eltwise", "binary")]
    assert [kind for kind, _ in executed] == ["eltwise", "eltwise"], executed
    assert "eltwise_hardswish" in executed[0][1] and "eltwise_hardsigmoid alpha:0.2 beta:0.4" in executed[1][1], executed
