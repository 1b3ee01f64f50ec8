"""`byoc bench`: the end-to-end benchmark (see `byoc.bench`)."""

from __future__ import annotations

import argparse


def add_parser(commands) -> None:
    parser = commands.add_parser("bench", help="end-to-end latency against onnxruntime and TVM (see `byoc bench --help`)", add_help=False)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from byoc.bench import main

    return main(args.rest)
