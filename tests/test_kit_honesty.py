"""The vendor kit cannot be fooled: run against deliberately broken vendors
(`tests/broken_vendors.py`), it reports each fault with its reason."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from broken_vendors import all_broken

from byoc.testing import conformance, kit

from graphs import registered


@pytest.fixture(scope="module")
def broken():
    with registered(*all_broken()):
        yield


@pytest.mark.parametrize("vendor, case, status, detail", [
    # Forced offload: a vendor that would leave MAC-less regions to the host takes the case.
    ("hostly", "test_relu", conformance.PASS, ""),
    ("stale", "test_relu", conformance.FAIL, "left 60 of 60 elements of output 0 (3, 4, 5) unwritten"),
    # onnx's own data for Max is small; the build's trial on values past the int32 range exposes the cut.
    ("narrow", "test_max_int64", conformance.FAIL, "on edge values (integer limits and values past the int32 range)"),
    ("narrow", "test_max_int32", conformance.PASS, ""),
    # onnx's data for Tanh is ordinary; the trial's large floats make the textbook formula NaN.
    ("naive", "test_tanh", conformance.FAIL, "values are infinite or NaN where TVM's are not"),
    ("narrow", "test_relu", conformance.PASS, ""),
    # A case made of ops the vendor does not claim is counted as not taken, never as a pass.
    ("stale", "test_softmax_axis_0", conformance.NOT_TAKEN, "stale claims no op of this case"),
    # A frontend refusal is not handled, whichever vendor.
    ("narrow", "test_pow_types_int64_int64", conformance.NOT_HANDLED, "integer Pow is not supported"),
])
def test_each_fault_is_caught_with_its_reason(broken, vendor, case, status, detail):
    result = conformance.check_case(conformance.node_case(case), vendor)
    assert result.status == status and detail in result.detail, result


@pytest.mark.parametrize("vendor, finding", [
    ("solo", "run from 4 threads at once, the model raised EngineError"),
    ("racy", "run from 4 threads at once, sample"),
])
def test_an_engine_that_does_not_take_concurrent_calls_fails_the_kit(broken, vendor, finding):
    """Its runs one at a time match onnxruntime; run from several threads at once, it raises or
    its outputs differ from those runs."""
    result = kit.evaluate(vendor, kit.model_case("mlp"))
    assert result.error is not None and finding in result.error, result.error
    assert result.outputs and all(a.shape == b.shape for a, b in zip(result.outputs[0], result.reference[0]))
    if vendor == "solo":
        assert "one call at a time" in result.error
    else:
        assert "differs from its run alone" in result.error


def test_integer_arithmetic_cases_get_values_past_int32():
    case = conformance.node_case("test_max_int64")
    (inputs, expected), = conformance.edge_data_sets(case)
    assert max(abs(int(a.max())) for a in inputs) > 2**31 and expected[0].dtype == "int64"
    assert conformance.edge_data_sets(conformance.node_case("test_gathernd_example_int32")) == []  # indices stay onnx's


def test_the_pass_rate_counts_only_the_cases_taken():
    results = [conformance.CaseResult("a", "v", conformance.PASS), conformance.CaseResult("b", "v", conformance.NOT_TAKEN),
               conformance.CaseResult("c", "v", conformance.FAIL, "x"), conformance.CaseResult("d", "v", conformance.NOT_HANDLED)]
    rate = conformance.PassRate.of("v", results)
    assert (rate.total, rate.handled, rate.not_taken, rate.passed, rate.failures) == (4, 3, 1, 1, 1) and rate.rate == 0.5
    assert "1 of 2 float32 and integer node cases it takes pass (50.0%)" in rate.summary()
    assert "1 case(s) with no op it claims, 1 not handled by the frontend" in rate.summary()


_SUITE = """
import byoc
from broken_vendors import all_broken
from byoc.testing import vendor_suite

for backend in all_broken():
    byoc.register_backend(backend, override=True)

CASES = "^test_(relu|max_int64|softmax_axis_0)$"
TestHostly = vendor_suite("hostly", models=["mlp"], node_pattern=CASES)
TestStale = vendor_suite("stale", models=["mlp"], node_pattern=CASES)
TestNarrow = vendor_suite("narrow", models=[], node_pattern=CASES)
"""


def test_the_kit_run_on_broken_plugins_reports_every_fault(tmp_path):
    (tmp_path / "test_broken_plugins.py").write_text(textwrap.dedent(_SUITE))
    tests = __import__("pathlib").Path(__file__).parent
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "error::pytest.PytestRemovedIn10Warning",
                             f"--rootdir={tmp_path}", str(tmp_path / "test_broken_plugins.py")],
                            capture_output=True, text=True, cwd=tmp_path, env={**__import__("os").environ, "PYTHONPATH": str(tests)})
    out = result.stdout
    assert result.returncode == 1, out
    # The engine that never writes: its model fails (the strict build) and so does its node case.
    assert "stale on mlp: EngineError: region stale_0 (stale): the engine left" in out
    assert "stale on test_relu: EngineError" in out and "unwritten" in out
    assert "narrow on test_max_int64" in out
    summary = out[out.index("byoc vendor matrix"):]
    assert "hostly: 3 of 3 float32 and integer node cases it takes pass (100.0%)" in summary, summary
    assert "stale: 0 of 2 float32 and integer node cases it takes pass (0.0%); 0 expected failure(s), 2 other failure(s); " \
           "1 case(s) with no op it claims" in summary, summary
    assert "narrow: 1 of 2 float32 and integer node cases it takes pass (50.0%); 0 expected failure(s), 1 other failure(s)" in summary
    assert "PytestRemovedIn10Warning" not in out + result.stderr


def test_detections_with_near_tied_scores_are_compared_in_either_order_and_a_wrong_box_still_fails():
    """RetinaNet on dnnl gave two detections scored 0.7116419 and 0.71164095 in the other order
    than onnxruntime: the same detections, right either way. A box that is not there fails."""
    import numpy as np

    from byoc.backend.tolerance import FP32
    from byoc.testing.kit import Evaluation, _detections_in_order, tolerance_violation

    boxes = np.array([[0, 0, 10, 10], [5, 5, 50, 50], [1, 2, 3, 4]], "float32")
    scores, labels = np.array([0.9, 0.7116419, 0.71164095], "float32"), np.array([1, 70, 7])
    want = [boxes, scores, labels]
    swapped = [a[[0, 2, 1]] for a in want]
    assert tolerance_violation(FP32, Evaluation("v", "m", FP32, outputs=[swapped], reference=[want])) is not None
    reordered = _detections_in_order(swapped, want)
    assert tolerance_violation(FP32, Evaluation("v", "m", FP32, outputs=[reordered], reference=[want])) is None
    wrong = [boxes.copy(), scores, labels]
    wrong[0][1] = [5, 5, 60, 50]
    reordered = _detections_in_order(wrong, want)
    assert "output 0" in tolerance_violation(FP32, Evaluation("v", "m", FP32, outputs=[reordered], reference=[want]))
