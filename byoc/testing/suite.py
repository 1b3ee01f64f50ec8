"""The integration test matrix for one vendor, as a pytest test class.

A vendor package proves itself with two lines in its tests:

    from byoc.testing import vendor_suite
    TestAcmeNpu = vendor_suite("acme_npu", node_ops=["Conv", "Relu", "MaxPool", "Add", "MatMul"])

which checks the zoo models (partition, build, numerics against onnxruntime within the
tolerance the vendor states, export and reload in a fresh process) and onnx's float32 and integer node
cases whose ops the vendor takes. `pytest --byoc-node-cases=all` widens the node cases to every
float32 and integer case, `--byoc-node-cases=REGEX` to those whose name matches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from byoc.backend.registry import get_backend
from byoc.testing import conformance
from byoc.testing.kit import evaluate, model_case, reload_in_fresh_process, reload_skip_reason

DEFAULT_MODELS = ("mlp", "resnet18", "mobilenet_v2")
# int8 and float16 bounds are statistical: top-1 agreement needs more samples than fp32 checks.
SAMPLES = {"fp32": 2, "fp16": 10, "int8": 10}


def vendor_suite(
    vendor: str,
    models: Sequence[str] = DEFAULT_MODELS,
    node_ops: Sequence[str] | None = None,
    node_pattern: str | None = None,
    options: Mapping[str, Any] | None = None,
    samples: int | None = None,
) -> type:
    """A pytest test class checking `vendor` on `models` (zoo names, or "light_<name>" for
    onnx's light graphs) and on the float32 and integer node cases made only of `node_ops` (ONNX op types)
    or whose name matches `node_pattern`; with neither, every such node case."""
    model_names = list(models)

    class VendorSuite:
        byoc_vendor = vendor
        byoc_node_ops = None if node_ops is None else tuple(node_ops)
        byoc_node_pattern = node_pattern

        @pytest.fixture(scope="class")
        @classmethod
        def evaluations(cls, tmp_path_factory):
            count = samples or SAMPLES[get_backend(vendor).tolerance.precision]
            results = {name: evaluate(vendor, model_case(name), options, samples=count) for name in model_names}
            skip = reload_skip_reason(vendor)
            reloads = {} if skip else reload_in_fresh_process(list(results.values()), tmp_path_factory.mktemp(f"{vendor}-artifacts"))
            return results, reloads, skip

        @pytest.mark.parametrize("model", model_names)
        def test_model_matches_onnxruntime(self, evaluations, model, byoc_results):
            result = evaluations[0][model]
            byoc_results.append(result)
            assert result.error is None, f"{vendor} on {model}: {result.error}"
            assert result.violation is None, f"{vendor} on {model}: {result.violation}\n{result.report}"

        @pytest.mark.parametrize("model", model_names)
        def test_model_reloads_in_a_fresh_process(self, evaluations, model):
            results, reloads, skip = evaluations
            if skip:
                pytest.skip(skip)
            if results[model].error is not None:
                pytest.skip(f"{model} did not build: {results[model].error}")
            assert reloads[vendor, model] is None, f"{vendor} on {model}: {reloads[vendor, model]}"

        def test_node_case(self, byoc_node_case, byoc_results):
            # Weights are constants, as in trained models: accelerators that take only constant
            # weights would otherwise see none of these cases. The vendor takes every op it
            # claims (conformance.FORCED_OFFLOAD) and its regions are built strictly.
            result = conformance.check_case(conformance.node_case(byoc_node_case), vendor, dict(options or {}), as_weights=True)
            byoc_results.append(result)
            if result.status == conformance.NOT_HANDLED:
                pytest.xfail(f"not handled by the ONNX frontend: {result.detail}")
            if result.status == conformance.NOT_TAKEN:
                pytest.skip(result.detail)
            if result.status == conformance.EXPECTED:
                pytest.xfail(result.detail)
            if result.status == conformance.UNEXPECTED_PASS:
                pytest.fail(f"{result.case} is listed as an expected failure ({result.detail}) but passes: take it off the list")
            assert result.status == conformance.PASS, f"{vendor} on {result.case}: {result.detail}"

    VendorSuite.__name__ = VendorSuite.__qualname__ = f"TestVendor_{vendor}"
    return VendorSuite
