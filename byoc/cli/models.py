"""`byoc models`: the embedded model zoo."""

from __future__ import annotations

import argparse

from byoc import models as zoo


def add_parser(commands) -> None:
    parser = commands.add_parser("models", help="list the embedded zoo models")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    for name in zoo.names():
        entry = zoo.describe(name)
        print(f"{name:<14} {entry.task:<11} {entry.description}")
    return 0
