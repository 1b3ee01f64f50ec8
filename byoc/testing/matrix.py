"""The vendor x model matrix (`byoc matrix`, `make matrix` writes `docs/matrix.md`).

Every vendor on every model: offload by ops and MACs, regions, what stays on the host, the error
against float32 onnxruntime and whether it is within the vendor's stated tolerance, latency
against onnxruntime on the whole model in the same run (or the vendor's own estimate where the
device is simulated), and build time; optionally onnx's float32 and integer node cases per vendor.

Latency is timed in alternating blocks of runs (see `byoc.timing.time_blocks`), with the same
thread count for byoc and onnxruntime. Zoo models are the reduced variants, light graphs are at
their published size: the matrix is about where each op runs and whether results agree; the
end-to-end benchmark (`byoc bench`) times full-size models.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import onnxruntime as ort

from byoc.backend.registry import get_backend, list_backends
from byoc.cli.arguments import at_least
from byoc.models import exported, vision
from byoc.progress import Progress
from byoc.testing import conformance
from byoc.testing.kit import Evaluation, all_model_names, evaluate, exported_model_names, model_case, onnxruntime_session
from byoc.timing import pin_threads, spread, time_blocks, time_runs

SLOW_RUN_S = 0.5  # a system this slow per run is timed on `byoc.timing.SLOW_RUNS` runs, not `rounds`


@dataclass
class MatrixRow:
    vendor: str
    model: str
    precision: str
    passed: bool
    reason: str = ""
    offload_ops: float | None = None
    offload_macs: float | None = None
    regions: int | None = None
    host_ops: dict[str, int] = field(default_factory=dict)  # op -> count of host nodes
    max_error: float | None = None  # largest absolute error over the output's range
    relative_l2: float | None = None
    sqnr_db: float | None = None
    top1: float | None = None
    selections: float | None = None  # integer outputs (NMS) selected by both runs, as sets
    byoc_ms: float | None = None
    onnxruntime_ms: float | None = None
    estimated_ms: float | None = None  # the vendor's own estimate, where the device is simulated
    build_s: float | None = None

    @property
    def latency_ratio(self) -> float | None:
        return self.byoc_ms / self.onnxruntime_ms if self.byoc_ms and self.onnxruntime_ms else None


def _row(evaluation: Evaluation, precision: str) -> MatrixRow:
    row = MatrixRow(evaluation.vendor, evaluation.model, precision, evaluation.passed,
                    evaluation.error or evaluation.violation or "")
    report = evaluation.report
    if report is None:
        return row
    row.offload_ops, row.offload_macs, row.regions = report.offload_ratio_nodes, report.offload_ratio_macs, len(report.regions)
    row.host_ops = dict(Counter("+".join(o.removeprefix("relax.") for o in h.ops) for h in report.host_ops).most_common())
    row.build_s = evaluation.partition_s + evaluation.build_s
    estimates = [e["ms_at_clock"] for e in report.estimates.values() if "ms_at_clock" in e]
    row.estimated_ms = sum(estimates) if estimates else None
    accuracy = evaluation.accuracy
    if accuracy is not None:
        ranges = [float(w.max() - w.min()) for run in evaluation.reference for w in run if w.size and w.dtype.kind == "f"]
        row.max_error = accuracy.max_abs_error / max(max(ranges, default=1.0), 1e-12)
        row.relative_l2, row.top1 = accuracy.relative_l2, accuracy.top1_agreement
        row.selections = accuracy.selection_agreement
        row.sqnr_db = accuracy.sqnr_db
    return row


def _time(evaluation: Evaluation, rounds: int, threads: int, row: MatrixRow) -> None:
    session = onnxruntime_session(evaluation.model_proto, threads)
    sample = evaluation.samples[0]
    runners = {"onnxruntime": lambda: session.run(None, sample), "byoc": lambda: evaluation.compiled.run(**sample)}
    slow = {name for name, run in runners.items() if time_runs(run, 1, warmup=0)[0] > SLOW_RUN_S}
    samples = time_blocks(runners, rounds, slow)
    row.byoc_ms, row.onnxruntime_ms = spread(samples["byoc"]).median_ms, spread(samples["onnxruntime"]).median_ms


def run_matrix(vendors: Sequence[str], models: Sequence[str], samples: int = 2, int8_samples: int = 10,
               calibration_samples: int = 8, rounds: int = 12, threads: int = 0, timing: bool = True) -> list[MatrixRow]:
    rows = []
    progress = Progress(len(vendors) * len(models), "matrix")
    for vendor in vendors:
        backend = get_backend(vendor)
        precision = backend.tolerance.precision
        for name in models:
            progress.step(f"{vendor} x {name}")
            count = samples if precision == "fp32" else int8_samples
            evaluation = evaluate(vendor, model_case(name), samples=count, calibration_samples=calibration_samples)
            row = _row(evaluation, precision)
            if timing and evaluation.compiled is not None and row.estimated_ms is None:
                _time(evaluation, rounds, threads, row)
            rows.append(row)
            evaluation.compiled = evaluation.model_proto = None  # a finished row's model and engines are not needed again
            progress.advance(f"{vendor} x {name}: {'pass' if row.passed else 'FAIL'}")
    return rows


def _case_result(vendor: str, case_name: str) -> conformance.CaseResult:
    return conformance.check_case(conformance.node_case(case_name), vendor)


def node_case_rates(vendors: Sequence[str], pattern: str | None = None,
                    jobs: int = 1) -> tuple[list[conformance.PassRate], list[conformance.CaseResult]]:
    """onnx's float32 and integer node cases for each float vendor (int8 vendors are held to their own
    bound on models: node cases compare with onnx's float32 expectations), in `jobs` processes
    (each case builds its own model: an hour for three vendors in one process)."""
    cases = [case.name for case in conformance.select(pattern=pattern)]
    floats = [v for v in vendors if get_backend(v).tolerance.precision == "fp32"]
    work = [(vendor, case) for vendor in floats for case in cases]
    progress = Progress(len(work), "node cases")
    if jobs <= 1:
        results = []
        for vendor, case in work:
            progress.step(f"{vendor} {case}")
            results.append(_case_result(vendor, case))
            progress.advance()
    else:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(jobs) as pool:
            futures = [pool.submit(_case_result, vendor, case) for vendor, case in work]
            for future in futures:
                future.result()
                progress.advance()
        results = [future.result() for future in futures]
    rates = [conformance.PassRate.of(v, [r for r in results if r.vendor == v]) for v in floats]
    return rates, results


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _host(row: MatrixRow, limit: int = 3) -> str:
    if not row.host_ops:
        return "nothing"
    shown = [f"{op} x{n}" if n > 1 else op for op, n in list(row.host_ops.items())[:limit]]
    more = len(row.host_ops) - limit
    return ", ".join(shown) + (f", +{more} more" if more > 0 else "")


def _error(row: MatrixRow) -> str:
    if row.max_error is None:
        return "-"
    if row.precision == "fp32":
        return f"{row.max_error:.1e}"
    top1 = f", top-1 {row.top1:.0%}" if row.top1 is not None else ""
    selections = f", selections {row.selections:.0%}" if row.selections is not None else ""
    return f"rel L2 {row.relative_l2:.1%}, SQNR {row.sqnr_db:.1f} dB{top1}{selections}"


def _latency(row: MatrixRow) -> str:
    if row.estimated_ms is not None:
        return f"est. {row.estimated_ms:.3g} ms (simulated)"
    return "-" if row.latency_ratio is None else f"{row.latency_ratio:.2f}x ({row.byoc_ms:.2f} ms)"


def to_markdown(rows: Sequence[MatrixRow], rates: Sequence[conformance.PassRate], results: Sequence[conformance.CaseResult],
                meta: dict) -> str:
    lines = ["# Vendor matrix", "", "Written by `byoc matrix` (`make matrix`; the vision suite's by `make vision`); do not edit by hand.", "",
             f"{meta['machine']}; byoc {meta['byoc']}, onnxruntime {meta['onnxruntime']}, {meta['threads']} thread(s). "
             "Zoo models are the reduced variants (`byoc.models.get(name, small=True)`); `light_*` are onnx's "
             "real-network graphs at their published size with seeded weights (`byoc.testing.light_model`); `hf:*` "
             "are transformers architectures exported by torch.onnx at their tiny size (`byoc.models.exported`); "
             "`vision:*` are torchvision's, timm's and Ultralytics' models and torchvision's detectors, exported as their users export "
             "them (`byoc.models.vision`, `--models vision`). Error: for fp32 vendors the largest absolute error over the output's range; for int8 vendors the "
             "relative L2 error, SQNR and top-1 agreement against float32 onnxruntime over "
             f"{meta['int8_samples']} seeded inputs (calibrated on {meta['calibration_samples']} others), and for "
             "detectors the share of NonMaxSuppression selections both runs make (compared as sets, reported, "
             "not bounded: see `byoc.backend.tolerance`). "
             "Latency: byoc against onnxruntime on the whole model in the same run, or the vendor's own estimate "
             "where the device is simulated.", ""]
    for vendor, reason in meta.get("not_run", {}).items():
        lines += [f"Not run here: {vendor} ({reason}).", ""]
    for vendor in dict.fromkeys(r.vendor for r in rows):
        tolerance = get_backend(vendor).tolerance.describe()
        vendor_rows = [r for r in rows if r.vendor == vendor]
        passed = sum(r.passed for r in vendor_rows)
        lines += [f"## {vendor}", "", f"Tolerance: {tolerance}. {passed} of {len(vendor_rows)} models pass.", "",
                  "| model | ops | MACs | regions | on the host | error | pass | latency vs onnxruntime | build s |",
                  "| --- | ---: | ---: | ---: | --- | --- | --- | --- | ---: |"]
        for r in vendor_rows:
            verdict = "yes" if r.passed else f"**no**: {r.reason}"
            build_s = "-" if r.build_s is None else f"{r.build_s:.1f}"
            lines.append(f"| {r.model} | {_pct(r.offload_ops)} | {_pct(r.offload_macs)} | {r.regions if r.regions is not None else '-'} "
                         f"| {_host(r)} | {_error(r)} | {verdict} | {_latency(r)} | {build_s} |")
        lines.append("")
    if rates:
        lines += ["## onnx node cases (float32 and integer)", "",
                  "onnx's float32 and integer node test cases through byoc's ONNX backend (`byoc.onnx_backend`), compared with "
                  "onnx's expected outputs at each case's own tolerance (integer arithmetic cases also at values past "
                  "the int32 range). The vendor takes every op it claims, however small the region "
                  "(`conformance.FORCED_OFFLOAD`), and a region that fails is a failure, not a fall-back to the host. "
                  "A case is handled when the ONNX frontend imports it; taken when the vendor claims one of its ops. "
                  "The rate is over the cases taken.", "",
                  "| vendor | cases | handled | taken | pass | rate | expected failures | other failures |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for rate in rates:
            lines.append(f"| {rate.vendor} | {rate.total} | {rate.handled} | {rate.handled - rate.not_taken} | {rate.passed} "
                         f"| {rate.rate:.1%} | {rate.expected_failures} | {rate.failures} |")
        failures = [r for r in results if r.status in (conformance.FAIL, conformance.UNEXPECTED_PASS)]
        if failures:
            lines += ["", "Failures not on the expected list:", ""]
            lines += [f"- {r.vendor}: `{r.case}`: {r.status}: {r.detail}" for r in failures]
        expected = {(r.case, r.detail) for r in results if r.status == conformance.EXPECTED}
        if expected:
            lines += ["", "Expected failures (every vendor unless named):", ""]
            lines += [f"- `{case}`: {detail}" for case, detail in sorted(expected)]
        refused = Counter(r.detail for r in results if r.status == conformance.NOT_HANDLED and r.vendor == rates[0].vendor)
        if refused:
            lines += ["", "Not handled (refused by the frontend, with the reason it gives):", ""]
            lines += [f"- {count} case(s): {detail}" for detail, count in sorted(refused.items(), key=lambda item: -item[1])]
        lines.append("")
    return "\n".join(lines)


def _meta(args: argparse.Namespace) -> dict:
    import platform

    import byoc

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), platform.processor()) \
        if os.path.exists("/proc/cpuinfo") else platform.processor()
    return {"machine": f"{cpu}, {os.cpu_count()} core(s)", "byoc": byoc.__version__, "onnxruntime": ort.__version__,
            "threads": args.threads, "int8_samples": args.int8_samples, "calibration_samples": args.calibration}


def _default_models() -> list[str]:
    """Every zoo model and light graph, and the exported suite at its tiny size where the
    torch extra is installed (left out with the reason where it is not)."""
    reason = exported.available()
    if reason is not None:
        print(f"byoc matrix: the exported models are left out: {reason}", file=sys.stderr)
        return all_model_names()
    return [*all_model_names(), *exported_model_names()]


def _expanded(name: str) -> list[str]:
    """`vision` as every model of the vision suite the installed families allow (byoc.models.vision)."""
    if name != vision.SUITE_NAME:
        return [name]
    reason = vision.available()
    if reason is not None:
        raise exported.MissingExtraError(f"the vision suite: {reason}")
    return [vision.PREFIX + model for model in vision.names()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="byoc matrix", description="the vendor x model table")
    parser.add_argument("--vendors", nargs="+", default=None, help="default: every registered vendor")
    parser.add_argument("--models", nargs="+", default=None,
                        help="zoo names, light_<name> graphs, hf:NAME[:SIZE] exported architectures, and vision:NAME models "
                             "or `vision` for their whole suite (default: all but the vision suite; the exported suite where the "
                             "torch extra is installed)")
    parser.add_argument("--samples", type=at_least(1), default=2, help="evaluation inputs for fp32 vendors")
    parser.add_argument("--int8-samples", type=at_least(1), default=10, help="evaluation inputs for int8 and fp16 vendors")
    parser.add_argument("--calibration", type=at_least(1), default=8, metavar="N", help="calibration inputs for int8 vendors")
    parser.add_argument("--rounds", type=at_least(1), default=12, help="timed runs per system")
    parser.add_argument("--threads", type=at_least(1), default=os.cpu_count() or 1)
    parser.add_argument("--no-timing", action="store_true", help="leave out latency")
    parser.add_argument("--node-cases", nargs="?", const="", default=None, metavar="REGEX",
                        help="also run onnx's float32 and integer node cases per float vendor (all, or those matching REGEX)")
    parser.add_argument("--jobs", type=at_least(1), default=1, help="processes for the node cases (each builds its own model)")
    parser.add_argument("--json", metavar="FILE", help="write the rows as JSON")
    parser.add_argument("--markdown", metavar="FILE", help="write the matrix as Markdown (docs/matrix.md)")
    args = parser.parse_args(argv)
    pin_threads(args.threads, "byoc.testing.matrix", argv)
    vendors = args.vendors or list_backends()
    missing = {}  # vendors whose library or device this machine lacks: listed with the reason, not run
    for vendor in vendors:
        backend = get_backend(vendor)
        reason = backend.missing_part() or backend.codegen.device_missing()
        if reason:
            missing[vendor] = reason
            print(f"byoc matrix: {vendor} does not build or run on this machine, left out: {reason}", file=sys.stderr)
    vendors = [v for v in vendors if v not in missing]
    models = [m for name in (args.models or _default_models()) for m in _expanded(name)]
    for name in models:
        model_case(name)
    rows = run_matrix(vendors, models, args.samples, args.int8_samples, args.calibration, args.rounds, args.threads, not args.no_timing)
    rates, results = node_case_rates(vendors, args.node_cases or None, args.jobs) if args.node_cases is not None else ([], [])
    meta = {**_meta(args), "not_run": missing}
    text = to_markdown(rows, rates, results, meta)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": [asdict(r) for r in rows], "node_cases": [asdict(r) for r in rates],
                       "case_results": [asdict(r) for r in results]}, f, indent=2, default=str)
    return 0 if all(r.passed for r in rows) and all(r.failures == 0 for r in rates) else 1


if __name__ == "__main__":  # where `byoc matrix` starts again with its thread counts set
    from byoc.cli import main as cli_main

    sys.exit(cli_main(["matrix", *sys.argv[1:]]))
