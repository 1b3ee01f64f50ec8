"""Helpers the commands share: reading a model argument, partition options."""

from __future__ import annotations

import argparse
import os

import numpy as np
import onnx
import tvm

from byoc import models as zoo
from byoc.backend.registry import get_backend
from byoc.errors import ModelLoadError, PartitionError
from byoc.frontend import from_onnx
from byoc.partition import partition_for
from byoc.processing.calibration import calibrate_for_target
from byoc.processing.passes import needs_calibration
from byoc.runtime_metadata.build import model_io


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
    parser.add_argument("--target", help="accelerator configuration for int8 vendors (e.g. DPUCZDX8G-B1024, ethos-u55-128)")
    parser.add_argument("--calibration-samples", type=int, default=8, metavar="N",
                        help="int8 vendors: calibrate on N seeded random inputs (default 8)")


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


def random_inputs(mod: tvm.IRModule, model: onnx.ModelProto | None, seed: int) -> dict[str, np.ndarray]:
    """Seeded random inputs: the zoo's (which know vocabulary sizes) or from the input types."""
    if model is not None:
        return zoo.sample_inputs(model, seed=seed)
    inputs, _ = model_io(mod)
    return zoo.random_inputs([(s.name, s.shape, s.dtype) for s in inputs], seed)


def partition(args: argparse.Namespace, mod: tvm.IRModule, model: onnx.ModelProto | None) -> tvm.IRModule:
    """Partition for the requested vendors, calibrating those that quantize at compile time."""
    backends = [get_backend(name) for name in vendors(args)]
    if args.target:
        configurable = [b for b in backends if b.configure is not None]
        if not configurable:
            raise PartitionError(f"--target {args.target}: none of {[b.name for b in backends]} comes in configurations")
        backends = [b.configure(args.target) if b.configure is not None else b for b in backends]
    partitioned = partition_for(mod, backends, **partition_options(args))
    for backend in backends:
        if needs_calibration(backend.processing):
            samples = [random_inputs(mod, model, seed) for seed in range(args.calibration_samples)]
            partitioned = calibrate_for_target(partitioned, backend, args.target or "", samples)
    return partitioned
