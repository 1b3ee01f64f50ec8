"""`byoc vendors`: the registered backends, what they are, and the options they take."""

from __future__ import annotations

import argparse

from byoc.backend.datasheet import datasheet
from byoc.backend.options import Option
from byoc.backend.registry import backend_origin, get_backend, list_backends, missing_vendors
from byoc.backend.settings import BUILD
from byoc.flow import declared_options


def add_parser(commands) -> None:
    parser = commands.add_parser("vendors", help="list the registered vendors and their options")
    parser.add_argument("--datasheet", metavar="NAME", help="print vendor NAME's data sheet (markdown): its limits, "
                        "composites and ops with the rule each check applies, and its options")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.datasheet:
        backend = get_backend(args.datasheet)  # an unknown name: an error that lists the vendors
        print(datasheet(backend, declared_options(backend)), end="")
        return 0
    for name in list_backends():
        backend = get_backend(name)
        print(f"{name}: {backend.description or '(no description)'}")
        print(f"  codegen {backend.codegen.kind}, priority {backend.priority}, tolerance {backend.tolerance.describe()}, "
              f"from {backend_origin(name)}")
        missing = backend.missing_part()
        if missing:
            print(f"  partitions here, does not build here: {missing}")
        for option in declared_options(backend):
            print(_describe(f"--option {option.name}", option))
        for option in backend.settings.options(BUILD):
            print(_describe(f"--backend-option {name}.{option.name}", option))
    for name, reason in sorted(missing_vendors().items()):
        print(f"{name}: not installed here: {reason}")
    return 0


def _describe(flag: str, option: Option) -> str:
    default = f" (default {option.default!r})" if option.default is not None else ""
    choices = f" [{', '.join(option.choices)}]" if option.choices else ""
    return f"  {flag}=...{choices}{default}: {option.help}"
