"""Helpers the commands share: reading a model argument, partition options."""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np
import onnx
import tvm

from byoc import models as zoo
from byoc.backend.registry import get_backend
from byoc.backend.settings import PARTITION
from byoc.backend.spec import Backend
from byoc.cli.arguments import at_least, non_negative
from byoc.errors import ModelLoadError, OptionError, PartitionError, did_you_mean
from byoc.flow import declared_options, describe_options, partition_for
from byoc.frontend import from_onnx
from byoc.frontend.onnx.importer import load_onnx_model
from byoc.frontend.onnx.input_shapes import parse_dims, parse_shapes
from byoc.ir.dims import at_opt, dims_of
from byoc.models import exported
from byoc.processing.passes import needs_calibration
from byoc.runtime_metadata.build import model_io


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="an ONNX file, a zoo model, or an exported architecture hf:NAME[:SIZE] (see `byoc models`; "
                                      "exported with dynamic axes, batch and sequence, when --dims or --shapes is given)")
    parser.add_argument("--small", action="store_true", help="zoo models only: the reduced test-size configuration")
    parser.add_argument("--shapes", nargs="+", default=[], metavar="INPUT=DIMxDIM",
                        help="static shapes for inputs with dynamic dimensions, e.g. input_ids=1x32 (a named dimension "
                             "given for one input holds for every input that has it)")
    parser.add_argument("--dims", nargs="+", default=[], metavar="NAME=LOW:HIGH",
                        help="keep these named dynamic dimensions, each with its range, e.g. batch=1:16 sequence=1:512 "
                             "(LOW:OPT:HIGH also names the shape partitioning decides for): one artifact for every shape in range")


def load_model(name: str, small: bool = False, shapes: list[str] | None = None,
               dims: list[str] | None = None) -> tuple[onnx.ModelProto | None, tvm.IRModule, str]:
    """(ONNX model, Relax module, label) for a file path or a zoo name, with `--shapes` and
    `--dims` items."""
    fixed, ranges = parse_shapes(shapes or []), parse_dims(dims or [])
    if os.path.exists(name) or name.endswith(".onnx"):
        model = load_onnx_model(name)
        return model, from_onnx(model, shapes=fixed, dims=ranges), os.path.basename(name)
    if name in zoo.names():
        model = zoo.get(name, small=small)
        return model, from_onnx(model, shapes=fixed, dims=ranges), name + (" (small)" if small else "")
    if name.startswith(exported.SPEC_PREFIX):  # exported once, then from the cache
        # With --dims or --shapes, the export with dynamic axes (batch, sequence), which they name.
        model = exported.export(*exported.parse_spec(name), dynamic=bool(fixed or ranges))
        return model, from_onnx(model, shapes=fixed, dims=ranges), name
    raise ModelLoadError(f"{name!r} is neither an ONNX file nor a zoo model{did_you_mean(name, zoo.names())}; zoo models: "
                         f"{', '.join(zoo.names())}; exported architectures: hf:NAME[:SIZE] (see `byoc models`)")


def add_partition_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vendor", required=True, help="backend name, or several separated by commas (priority order)")
    parser.add_argument("--max-ops", type=at_least(1), dest="max_ops_per_region", help="split regions above this many ops")
    parser.add_argument("--max-macs", type=at_least(1), dest="max_macs_per_region", help="split regions above this many MACs")
    parser.add_argument("--max-bytes", type=at_least(1), dest="max_bytes_per_region", help="split regions above this working set")
    parser.add_argument("--max-regions", type=at_least(1), dest="max_regions", help="keep only the N regions with the most MACs per vendor")
    parser.add_argument("--min-ops", type=at_least(0), dest="min_ops_per_region", help="regions with fewer ops stay on the host")
    parser.add_argument("--min-macs", type=at_least(0), dest="min_macs_per_region", help="regions with fewer MACs stay on the host")
    parser.add_argument("--fallback-without-macs", action="store_true", default=None, help="regions without MACs stay on the host")
    parser.add_argument("--host-op", action="append", dest="host_ops", metavar="OP_OR_NODE", help="keep this op type or node on the host")
    parser.add_argument("--option", action="append", default=[], metavar="NAME=VALUE", dest="vendor_options",
                        help="a vendor's own option (see `byoc vendors`), e.g. dpu=DPUCZDX8G-B1024 or single_region=true")
    parser.add_argument("--target", help="the vendor's hardware configuration option (e.g. DPUCZDX8G-B1024, ethos-u55-128)")
    parser.add_argument("--calibration", "--calibration-samples", type=at_least(1), default=8, metavar="N", dest="calibration",
                        help="vendors that quantize at compile time: calibrate on N seeded random inputs (default 8)")
    parser.add_argument("--precision", choices=("fp32", "int8", "auto"), default="fp32",
                        help="int8: quantize the float model first, calibrated on --calibration N seeded random inputs, for "
                             "a vendor that computes quantized models in int8 (dnnl); auto: int8 or fp32 per segment, the "
                             "fastest within --max-rel-l2 of fp32 on those inputs (with --placement auto, chosen with "
                             "each segment's vendor)")
    parser.add_argument("--max-rel-l2", type=non_negative, metavar="ERROR",
                        help="--precision auto: the relative L2 error allowed against fp32 (default 0.02); given alone, "
                             "it asks for --precision auto")
    parser.add_argument("--placement", choices=("priority", "auto"), default="priority",
                        help="priority: the first vendor that takes an op runs it; auto: measured cost chooses")
    parser.add_argument("--budget-s", type=non_negative, metavar="SECONDS", help="--placement auto: time allowed for measuring (default 600)")
    parser.add_argument("--rpc-tracker", metavar="HOST:PORT", help="--placement auto: time candidates on devices of this TVM RPC tracker")
    parser.add_argument("--rpc-key", metavar="KEY", help="--placement auto: the device key at the RPC tracker")
    parser.add_argument("--rpc-fallback-local", action="store_true",
                        help="--placement auto: measure on this machine if the RPC tracker or key fails")


def partition_options(args: argparse.Namespace) -> dict:
    names = [
        "max_ops_per_region",
        "max_macs_per_region",
        "max_bytes_per_region",
        "max_regions",
        "min_ops_per_region",
        "min_macs_per_region",
        "fallback_without_macs",
        "host_ops",
    ]
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def vendors(args: argparse.Namespace) -> list[str]:
    return [v.strip() for v in args.vendor.split(",") if v.strip()]


def random_inputs(mod: tvm.IRModule, model: onnx.ModelProto | None, seed: int) -> dict[str, np.ndarray]:
    """Seeded random inputs at the shapes the module was imported with (a dynamic dimension at
    the value partitioning decided for), in the value ranges the model's metadata gives (the
    zoo's and the exported suite's know vocabulary sizes)."""
    inputs, _ = model_io(mod)
    ranges = zoo.input_ranges(model) if model is not None else {}
    dims = dims_of(mod)
    shapes = [(s.name, at_opt(s.shape, dims), s.dtype) for s in inputs]
    return zoo.random_inputs(shapes, seed, ranges)


def vendor_options(args: argparse.Namespace, backends: list[Backend]) -> dict[str, Any]:
    """`--option NAME=VALUE` and `--target`, each read by the option a vendor declares."""
    declared = {option.name: (backend, option) for backend in backends for option in declared_options(backend)}
    values: dict[str, Any] = {}
    for item in args.vendor_options:
        name, sep, text = item.partition("=")
        if not sep:
            raise PartitionError(f"--option expects NAME=VALUE, got {item!r}")
        if name not in declared:
            raise PartitionError(f"unknown option {name!r} for {', '.join(b.name for b in backends)}; known options: "
                                 f"{describe_options(backends)}")
        backend, option = declared[name]
        values[name] = option.from_text(backend.name, text)
    if args.target:
        targets = [(b, o) for b in backends for o in b.settings.options(PARTITION) if o.hardware]
        if not targets:
            raise PartitionError(f"--target {args.target}: none of {[b.name for b in backends]} comes in configurations")
        for backend, option in targets:
            values[option.name] = option.from_text(backend.name, args.target)
    return values


def partition(args: argparse.Namespace, mod: tvm.IRModule, model: onnx.ModelProto | None) -> tvm.IRModule:
    """Partition for the requested vendors; those that quantize at compile time calibrate on
    `--calibration N` seeded random inputs."""
    backends = [get_backend(name) for name in vendors(args)]
    options = {**partition_options(args), **vendor_options(args, backends)}
    calibrating = args.precision != "fp32" or args.max_rel_l2 is not None or any(needs_calibration(b.processing) for b in backends)
    if calibrating and "calibration" not in options:
        options["calibration"] = [random_inputs(mod, model, seed) for seed in range(args.calibration)]
    if args.precision != "fp32":
        options["precision"] = args.precision
    if args.max_rel_l2 is not None:
        options["max_rel_l2"] = args.max_rel_l2
    if args.placement == "auto":
        options.update(placement="auto", budget_s=args.budget_s, rpc_tracker=args.rpc_tracker, rpc_key=args.rpc_key,
                       rpc_fallback_local=args.rpc_fallback_local, placement_inputs=random_inputs(mod, model, 0))
    elif args.rpc_tracker or args.rpc_key or args.budget_s is not None:
        raise PartitionError("--budget-s and --rpc-* apply to --placement auto only")
    return partition_for(mod, backends, **options)


def add_backend_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend-option", action="append", default=[], metavar="VENDOR.NAME=VALUE", dest="backend_options",
                        help="a vendor's build and run option (repeatable; `byoc vendors` lists them)")


def backend_options(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """`--backend-option VENDOR.NAME=VALUE` items as `backend_options`, each value read by the
    option its vendor declares."""
    found: dict[str, dict[str, Any]] = {}
    for item in args.backend_options:
        key, sep, text = item.partition("=")
        vendor, dot, name = key.partition(".")
        if not sep or not dot or not vendor or not name:
            raise OptionError(f"--backend-option expects VENDOR.NAME=VALUE, got {item!r}")
        found.setdefault(vendor, {})[name] = get_backend(vendor).build_option(name).from_text(vendor, text, OptionError)
    return found
