"""The pytest plugin of `byoc.testing` (entry point `pytest11`): node-case parameters for vendor
suites, and a summary of what each vendor passed.

Loaded by every pytest run where byoc is installed, so it imports byoc only when a vendor
suite is collected.
"""

from __future__ import annotations

import pytest

_RESULTS: list = []
_NOT_HANDLED: dict[str, int] = {}  # vendor -> node cases the frontend refuses, in onnx backend test classes
_NOT_TAKEN: dict[str, int] = {}  # vendor -> node cases it claims no op of, in onnx backend test classes


def pytest_addoption(parser) -> None:
    group = parser.getgroup("byoc", "byoc vendor test kit")
    group.addoption("--byoc-node-cases", default=None, metavar="all|REGEX",
                    help="node cases for vendor suites: every float32 and integer case, or those whose name matches REGEX "
                         "(default: each suite's own selection)")


def pytest_generate_tests(metafunc) -> None:
    if "byoc_node_case" not in metafunc.fixturenames:
        return
    from byoc.testing import conformance

    cls = metafunc.cls
    wanted = metafunc.config.getoption("--byoc-node-cases")
    if wanted == "all":
        cases = conformance.select()
    elif wanted:
        cases = conformance.select(pattern=wanted)
    else:
        cases = conformance.select(pattern=cls.byoc_node_pattern, ops=cls.byoc_node_ops)
    metafunc.parametrize("byoc_node_case", [c.name for c in cases])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Tally onnx backend test cases (`byoc.testing.backend_test`) by vendor."""
    outcome = yield
    vendor = getattr(item.cls, "byoc_conformance_vendor", None)
    report = outcome.get_result()
    if vendor is None or report.when != "call" and not (report.when == "setup" and report.outcome != "passed"):
        return
    from byoc.testing import conformance

    case = item.name.removesuffix("_cpu")
    if hasattr(report, "wasxfail"):
        status, detail = conformance.EXPECTED, conformance.expected_failure(case, vendor) or ""
    elif report.passed:
        status, detail = conformance.PASS, ""
    else:
        status, detail = conformance.FAIL, str(report.longrepr).strip().splitlines()[-1] if report.longrepr else ""
    _RESULTS.append(conformance.CaseResult(case, vendor, status, detail))
    _NOT_HANDLED[vendor] = item.cls.byoc_not_handled
    _NOT_TAKEN[vendor] = getattr(item.cls, "byoc_not_taken", 0)


@pytest.fixture
def byoc_results() -> list:
    """Where vendor suites record their results for the summary."""
    return _RESULTS


def pytest_terminal_summary(terminalreporter) -> None:
    if not _RESULTS:
        return
    from byoc.testing.conformance import NOT_HANDLED, NOT_TAKEN, CaseResult, PassRate
    from byoc.testing.kit import Evaluation

    write = terminalreporter.write_line
    terminalreporter.section("byoc vendor matrix")
    for result in (r for r in _RESULTS if isinstance(r, Evaluation)):
        report = result.report
        offload = f"{report.offload_ratio_nodes:6.1%} of ops, {report.offload_ratio_macs:6.1%} of MACs" if report else "-"
        accuracy = f"rel L2 {result.accuracy.relative_l2:.2%}" if result.accuracy else "-"
        verdict = "pass" if result.passed else f"FAIL: {result.error or result.violation}"
        write(f"{result.vendor:<14}{result.model:<20}{offload:<36}{accuracy:<16}{verdict}")
    cases = [r for r in _RESULTS if isinstance(r, CaseResult)]
    for vendor in dict.fromkeys(r.vendor for r in cases):
        vendor_cases = [r for r in cases if r.vendor == vendor]
        refused = [CaseResult("", vendor, NOT_HANDLED)] * _NOT_HANDLED.get(vendor, 0)
        untaken = [CaseResult("", vendor, NOT_TAKEN)] * _NOT_TAKEN.get(vendor, 0)
        write(PassRate.of(vendor, vendor_cases + refused + untaken).summary())
