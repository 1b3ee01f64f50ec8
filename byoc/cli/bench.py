"""End-to-end benchmark: onnxruntime and OpenVINO on the whole model, TVM host only, and byoc
with each vendor (dnnl and onnxruntime unless --vendors says which); batch 1, equal thread
counts, all in one run.

OpenVINO is optional (`pip install 'byoc[bench]'`); it runs in fp32, as the others do (on CPUs
with bf16 it would otherwise choose bf16). "vs best" is the ratio to the fastest reference. For
every model where a byoc system is slower than the fastest reference, the table is followed by that system's profile: time per region and on
the host, and the host's slowest kernels.

Each system is timed in blocks of consecutive runs that alternate in order over several passes
(`byoc.timing.time_blocks` says why). Latencies are medians over all timed runs, with the 90th
percentile over the median as their spread; `--busy` times everything while another process
keeps one core busy. Run as `byoc bench`, `python -m byoc bench` or `benchmarks/e2e.py`; thread
counts must be fixed before the libraries load, which those entry points do. The harness itself
is `byoc.benchmarking`.

Models are zoo names, `hf:NAME` or `hf:NAME:base` (a `transformers` architecture exported with
torch.onnx, see `byoc.models.exported`), or the path of an ONNX file with static input shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from byoc.benchmarking.models import DEFAULT_MODELS, check_model
from byoc.benchmarking.systems import DEFAULT_VENDORS, benchmark_model, check_vendors
from byoc.benchmarking.table import format_table
from byoc.cli.arguments import at_least
from byoc.timing import instruction_set, pin_threads


def add_parser(commands) -> None:
    parser = commands.add_parser("bench", help="end-to-end latency against onnxruntime and TVM (see `byoc bench --help`)", add_help=False)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return main(args.rest)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="byoc bench", description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS,
                        help="zoo names, hf:NAME[:base] (exported transformers architectures) or .onnx paths")
    parser.add_argument("--vendors", nargs="+", default=list(DEFAULT_VENDORS), help="byoc systems to time (any registered vendor)")
    parser.add_argument("--threads", type=at_least(1), default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=at_least(1), default=40, help="timed runs per system (4 for TVM host only)")
    parser.add_argument("--skip-tvm", action="store_true", help="leave out TVM host only (slow: untuned TVM)")
    parser.add_argument("--busy", action="store_true", help="time while another process keeps one core busy")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    pin_threads(args.threads, "byoc", ["bench", *argv])
    from byoc.errors import ByocError

    try:
        for name in args.models:
            check_model(name)
        check_vendors(args.vendors)
    except ByocError as error:
        parser.error(str(error))
    results = []
    for name in args.models:
        print(f"benchmarking {name} ...", file=sys.stderr, flush=True)
        results.append(benchmark_model(name, args.threads, args.rounds, not args.skip_tvm, args.vendors, args.busy))
    print(format_table(results, args.threads, args.busy))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "instruction_set": instruction_set(), "busy": args.busy,
                       "results": [asdict(r) for r in results]}, f, indent=2)
    return 0
