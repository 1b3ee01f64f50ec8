"""`byoc deploy`: an artifact with what running it needs where only TVM's runtime is installed."""

from __future__ import annotations

import argparse

from byoc.deploy.bundle import deploy
from byoc.deploy.check import check


def add_parser(commands) -> None:
    parser = commands.add_parser("deploy", help="write an artifact with TVM's runtime, byoc's runtime modules, its vendors' "
                                                "libraries and a loader, for a machine without byoc's compiler")
    parser.add_argument("artifact")
    parser.add_argument("-o", "--output", required=True, metavar="DIR", help="the folder to write (new or empty)")
    parser.add_argument("--no-check", action="store_true",
                        help="skip running the folder as a target would (its requirements alone, no TVM compiler) and "
                             "comparing with this install")
    parser.set_defaults(run=run_deploy)


def run_deploy(args: argparse.Namespace) -> int:
    deployment = deploy(args.artifact, args.output)
    print(deployment.summary())
    if deployment.not_run:
        print("  not checked here: the target's device runs its regions")
    elif not args.no_check:
        result = check(args.output)
        print(f"  checked as a target runs it (no TVM compiler, only its requirements): outputs within {result.max_difference:.1e} "
              f"of this install's; load and first run {result.seconds:.2f} s (this install: {result.full_install_seconds:.2f} s)")
    return 0
