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
