"""The comparison as a table: latency per system against onnxruntime and the fastest reference,
offload, build time and error, then why each byoc system slower than the fastest reference is."""

from __future__ import annotations

from byoc.benchmarking.systems import REFERENCES, ModelResult
from byoc.timing import cpu_model, instruction_set


def describe_machine(threads: int, busy: bool) -> str:
    return (f"batch 1, {threads} thread(s) for every system, {cpu_model()} ({instruction_set()})"
            + (", one core kept busy by another process" if busy else ""))


def format_table(results: list[ModelResult], threads: int, busy: bool = False) -> str:
    width = max([14, *(len(result.model) + 2 for result in results)])
    system_width = max([18, *(len(r.system) + 1 for result in results for r in result.systems)])
    header = (f"{'model':<{width}}{'system':<{system_width}}{'median ms':>11}{'vs ORT':>8}{'vs best':>9}{'p90/med':>9}{'offload ops':>12}"
              f"{'offload MACs':>13}{'regions':>8}{'build s':>9}{'max err':>10}")
    lines = [describe_machine(threads, busy), header, "-" * len(header)]
    for result in results:
        best = min(r.median_ms for r in result.systems if r.system in REFERENCES)  # the fastest reference
        for index, r in enumerate(result.systems):
            lines.append(
                f"{result.model if index == 0 else '':<{width}}{r.system:<{system_width}}{r.median_ms:>11.2f}{r.ratio_to_onnxruntime:>7.2f}x"
                f"{r.median_ms / best:>8.2f}x{r.p90_ms / r.median_ms:>9.2f}"
                + (f"{r.offload_nodes:>12.1%}{r.offload_macs:>13.1%}{r.regions:>8}" if r.regions is not None else f"{'':>12}{'':>13}{'':>8}")
                + f"{r.build_s:>9.1f}{r.max_abs_error:>10.1e}"
            )
    if not any(r.system == "openvino" for result in results for r in result.systems):
        lines.append("(OpenVINO not installed: pip install 'byoc[bench]' to compare with it too)")
    for result in results:
        for system, error in result.failures.items():
            lines.append(f"{result.model}, {system}: failed: {error}")
    for result in results:
        for system, table in result.breakdowns.items():
            lines += ["", f"{result.model}, {system}: slower than the fastest reference; where its time goes:", table]
    return "\n".join(lines)
