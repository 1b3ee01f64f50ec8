"""`byoc vendors`: the registered backends, what they are, and the options they take."""

from __future__ import annotations

import argparse

from byoc.backend.registry import backend_origin, get_backend, list_backends
from byoc.flow import declared_options


def add_parser(commands) -> None:
    parser = commands.add_parser("vendors", help="list the registered vendors and their options")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    for name in list_backends():
        backend = get_backend(name)
        print(f"{name}: {backend.description or '(no description)'}")
        print(f"  codegen {backend.codegen}, priority {backend.priority}, tolerance {backend.tolerance.describe()}, "
              f"from {backend_origin(name)}")
        missing = backend.missing_part()
        if missing:
            print(f"  partitions here, does not build here: {missing}")
        for option in declared_options(backend):
            default = f" (default {option.default!r})" if option.default is not None else ""
            choices = f" [{', '.join(option.choices)}]" if option.choices else ""
            print(f"  --option {option.name}=...{choices}{default}: {option.help}")
    return 0
