"""`byoc matrix`: the vendor x model table (see `byoc.testing.matrix`)."""

from __future__ import annotations

import argparse


def add_parser(commands) -> None:
    parser = commands.add_parser("matrix", help="every vendor on every model: offload, error, pass/fail, latency (see `byoc matrix --help`)",
                                 add_help=False)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from byoc.testing.matrix import main

    return main(args.rest)
