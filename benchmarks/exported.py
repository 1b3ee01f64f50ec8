"""byoc on `transformers` architectures exported with torch.onnx (see `byoc.models.exported`),
against onnxruntime and OpenVINO on the same files: per architecture and size, onnxruntime,
OpenVINO (when installed), byoc + dnnl and byoc + onnxruntime, on a quiet machine and with one
core kept busy by another process. Prints a Markdown table and the geometric mean of byoc +
dnnl's ratio to onnxruntime.

    python benchmarks/exported.py [--size tiny|base|both] [--runs 200] [--threads 2] [--no-busy-too]

Thread counts are fixed before the libraries load: the script starts again with them set, as
`python -m benchmarks.exported` from the repository root.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass

from byoc.benchmarking.systems import prepare_systems, time_systems
from byoc.benchmarking.table import describe_machine
from byoc.timing import Spread, pin_threads

VENDORS = ("dnnl", "onnxruntime")
RATIO_SYSTEM = "byoc + dnnl"


@dataclass
class Row:
    model: str
    system: str
    quiet: Spread
    busy: Spread | None
    max_abs_error: float


def benchmark(spec: str, threads: int, runs: int, busy_too: bool) -> tuple[list[Row], list[str]]:
    """The rows of one model, and a line for each byoc system that failed to build or run."""
    systems = prepare_systems(spec, threads, with_tvm=False, vendors=VENDORS)
    quiet = time_systems(systems, runs)
    busy = time_systems(systems, runs, busy=True) if busy_too else {}
    rows = [Row(systems.model, system, quiet[system], busy.get(system), result.max_abs_error)
            for system, result in systems.results.items()]
    return rows, [f"{systems.model}, {system}: failed: {error}" for system, error in systems.failures.items()]


def _ratios(rows: list[Row], busy: bool) -> dict[tuple[str, str], float]:
    """(model, system) -> median over onnxruntime's median on the same model, quiet or busy."""
    def timing(row: Row) -> Spread | None:
        return row.busy if busy else row.quiet

    reference = {row.model: timing(row) for row in rows if row.system == "onnxruntime"}
    return {(row.model, row.system): timing(row).median_ms / reference[row.model].median_ms
            for row in rows if timing(row) is not None}


def markdown(rows: list[Row], failures: list[str], header: str) -> str:
    quiet, busy = _ratios(rows, busy=False), _ratios(rows, busy=True)
    lines = [header, "",
             "| model | system | median ms | vs onnxruntime | p90/median | busy median ms | busy vs onnxruntime | busy p90/median |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        key = (row.model, row.system)
        busy_cells = (f"{row.busy.median_ms:.2f} | {busy[key]:.2f}x | {row.busy.tail:.2f}" if row.busy else "- | - | -")
        lines.append(f"| {row.model} | {row.system} | {row.quiet.median_ms:.2f} | {quiet[key]:.2f}x | {row.quiet.tail:.2f} | {busy_cells} |")
    lines.append("")
    for label, ratios in (("quiet", quiet), ("busy", busy)):
        chosen = [ratio for (_, system), ratio in ratios.items() if system == RATIO_SYSTEM]
        if chosen:
            mean = math.exp(sum(math.log(r) for r in chosen) / len(chosen))
            lines.append(f"geometric mean of {RATIO_SYSTEM} / onnxruntime ({label}, {len(chosen)} models): {mean:.2f}x")
    return "\n".join(lines + failures)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("tiny", "base", "both"), default="both")
    parser.add_argument("--models", nargs="+", help="architectures (default: the suite; see byoc.models.exported.names())")
    parser.add_argument("--runs", type=int, default=200, help="timed runs per system")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--busy-too", action=argparse.BooleanOptionalAction, default=True,
                        help="time again while another process keeps one core busy")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    pin_threads(args.threads, "benchmarks.exported", argv)
    from byoc.errors import ByocError
    from byoc.models import exported

    names = args.models or list(exported.SUITE)
    try:
        for name in names:
            exported.describe(name)
    except ByocError as error:
        parser.error(str(error))
    reason = exported.available()
    if reason is not None:
        parser.error(reason)
    sizes = ("tiny", "base") if args.size == "both" else (args.size,)
    rows: list[Row] = []
    failures: list[str] = []
    for size in sizes:
        for name in names:
            spec = f"hf:{name}:{size}"
            print(f"benchmarking {spec} ...", file=sys.stderr, flush=True)
            model_rows, model_failures = benchmark(spec, args.threads, args.runs, args.busy_too)
            rows += model_rows
            failures += model_failures
    print(markdown(rows, failures, f"{describe_machine(args.threads, busy=False)}; {args.runs} timed runs per system"
                         + ("; busy: one core kept busy by another process" if args.busy_too else "")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(row) for row in rows], f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
