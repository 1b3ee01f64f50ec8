"""onnx's own backend test suite (`onnx.backend.test.BackendTest`) for a vendor.

The suite that onnxruntime and other runtimes run, driving byoc's ONNX backend
(`byoc.onnx_backend`) through partition, build and run:

    from byoc.testing.backend_test import onnx_backend_test
    globals().update(onnx_backend_test("dnnl"))

Only onnx's float32 and integer node cases whose ops the frontend handles are kept (the others are counted
as not handled), and for a vendor only those where it claims an op (the others are counted as
not taken); the vendor takes every op it claims, however small the region, and a region that
fails is an error rather than a fall-back to the host; cases on the expected-failure list (`byoc.testing.onnx_expected`) are marked
as expected failures, so that one which starts to pass fails the run until it leaves the list.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import onnx.backend.test

from byoc.onnx_backend import backend_for
from byoc.testing import conformance

NODE_CLASS = "OnnxBackendNodeModelTest"


def _takes(case, vendor: str, options: dict[str, Any] | None) -> bool:
    """Whether the vendor claims an op of the case (a case it does not would run on the host
    alone and pass for it); a case the frontend refuses on import is left to fail as such."""
    try:
        return conformance.vendor_takes(case, vendor, options=options)
    except Exception:  # the run reports the import error itself
        return True


def onnx_backend_test(vendor: str | None, pattern: str | None = None, ops: Sequence[str] | None = None,
                      options: dict[str, Any] | None = None) -> dict[str, type]:
    """{class name: unittest class} with one test per selected case, on the CPU. `vendor` None
    runs everything on the host."""
    name = vendor or "host"
    selected = conformance.select(pattern=pattern, ops=ops)
    handled = [case for case in selected if conformance.not_handled_reason(case) is None]
    taken = handled if vendor is None else [case for case in handled if _takes(case, vendor, options)]
    not_taken = len(handled) - len(taken)
    handled = [case.name for case in handled]
    # A vendor takes every op it claims and its regions are built strictly (see `conformance`).
    vendor_options = {**(options or {}), **conformance.FORCED_OFFLOAD} if vendor else dict(options or {})
    suite = onnx.backend.test.BackendTest(backend_for([vendor] if vendor else [], strict=vendor is not None, **vendor_options), __name__)
    for case in handled:
        if conformance.expected_failure(case, name):
            suite.xfail(f"^{re.escape(case)}_cpu$")
    node_tests = suite.test_cases[NODE_CLASS]
    wanted = {f"{case.name}_cpu" for case in taken}
    for attribute in [a for a in vars(node_tests) if a.startswith("test_") and a not in wanted]:
        delattr(node_tests, attribute)
    node_tests.byoc_conformance_vendor = name
    node_tests.byoc_not_handled = len(selected) - len(handled)
    node_tests.byoc_not_taken = not_taken
    class_name = f"TestOnnxNode_{re.sub(r'[^0-9A-Za-z]', '_', name)}"
    node_tests.__name__ = node_tests.__qualname__ = class_name
    return {class_name: node_tests}
