"""The `byoc` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from byoc.errors import ByocError


def build_parser() -> argparse.ArgumentParser:
    from byoc.cli import bench, demo, deploy, matrix, models, partition, rpc, runtime, vendors

    parser = argparse.ArgumentParser(prog="byoc", description="Partition, compile and run models on host + accelerators.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (models, vendors, partition, runtime, deploy, demo, bench, matrix, rpc):
        module.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command in ("bench", "matrix"):
        args.rest = extra  # these commands have their own options
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.run(args) or 0
    except ByocError as error:
        print(f"byoc: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
