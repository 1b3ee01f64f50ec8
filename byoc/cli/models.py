"""`byoc models`: the embedded model zoo, and the transformers architectures byoc exports."""

from __future__ import annotations

import argparse

from byoc import models as zoo
from byoc.models import exported


def add_parser(commands) -> None:
    parser = commands.add_parser("models", help="list the embedded zoo models and the exported architectures")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    for name in zoo.names():
        entry = zoo.describe(name)
        print(f"{name:<14} {entry.task:<11} {entry.description}")
    missing = exported.available()
    print(f"\nExported by torch.onnx from seeded transformers configs, sizes {' and '.join(exported.SIZES)} "
          f"(hf:NAME or hf:NAME:SIZE){'; ' + missing if missing else ''}:")
    for name in exported.names():
        arch = exported.describe(name)
        suite = " (the suite)" if name in exported.SUITE else ""
        print(f"{exported.SPEC_PREFIX + name:<20} {arch.model_class}{' encoder' if arch.encoder else ''}{suite}")
    return 0
