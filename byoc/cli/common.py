"""Helpers the commands share: reading a model argument, partition options."""

from __future__ import annotations

import argparse
import os

import onnx
import tvm

from byoc import models as zoo
from byoc.errors import ModelLoadError
from byoc.frontend import from_onnx


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="an ONNX file, or the name of a zoo model (see `byoc models`)")
    parser.add_argument("--small", action="store_true", help="zoo models only: the reduced test-size configuration")


def load_model(name: str, small: bool = False) -> tuple[onnx.ModelProto | None, tvm.IRModule, str]:
    """(ONNX model, Relax module, label) for a file path or a zoo name."""
    if os.path.exists(name) or name.endswith(".onnx"):
        return None, from_onnx(name), os.path.basename(name)
    if name in zoo.names():
        model = zoo.get(name, small=small)
        return model, from_onnx(model), name + (" (small)" if small else "")
    raise ModelLoadError(f"{name!r} is neither an ONNX file nor a zoo model; zoo models: {', '.join(zoo.names())}")


def add_partition_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vendor", required=True, help="backend name, or several separated by commas (priority order)")
    parser.add_argument("--max-ops", type=int, dest="max_ops_per_region", help="split regions above this many ops")
    parser.add_argument("--max-macs", type=int, dest="max_macs_per_region", help="split regions above this many MACs")
    parser.add_argument("--max-bytes", type=int, dest="max_bytes_per_region", help="split regions above this working set")
    parser.add_argument("--min-ops", type=int, dest="min_ops_per_region", help="regions with fewer ops stay on the host")
    parser.add_argument("--min-macs", type=int, dest="min_macs_per_region", help="regions with fewer MACs stay on the host")
    parser.add_argument("--fallback-without-macs", action="store_true", default=None, help="regions without MACs stay on the host")
    parser.add_argument("--host-op", action="append", dest="host_ops", metavar="OP_OR_NODE", help="keep this op type or node on the host")


def partition_options(args: argparse.Namespace) -> dict:
    names = [
        "max_ops_per_region",
        "max_macs_per_region",
        "max_bytes_per_region",
        "min_ops_per_region",
        "min_macs_per_region",
        "fallback_without_macs",
        "host_ops",
    ]
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def vendors(args: argparse.Namespace) -> list[str]:
    return [v.strip() for v in args.vendor.split(",") if v.strip()]
