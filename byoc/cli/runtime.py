"""`byoc compile`, `byoc run`, `byoc inspect`: artifacts from the command line."""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from byoc.accuracy import measure_accuracy
from byoc.cli.arguments import at_least, byte_size
from byoc.cli.common import add_backend_options, add_model_argument, add_partition_options, backend_options, load_model, partition
from byoc.cli.common import random_inputs as model_random_inputs
from byoc.errors import InputError
from byoc.frontend.onnx.input_shapes import parse_buckets
from byoc.models import random_inputs
from byoc.partition import report
from byoc.runtime_metadata.artifact import read_manifest
from byoc.runtime_metadata.build import build
from byoc.runtime_metadata.model import load
from byoc.runtime_metadata.numpy_views import ML_DTYPES


def add_parser(commands) -> None:
    compile_parser = commands.add_parser("compile", help="partition and compile a model into one artifact file")
    add_model_argument(compile_parser)
    add_partition_options(compile_parser)
    compile_parser.add_argument("-o", "--output", required=True, help="artifact file to write (e.g. model.byoc)")
    compile_parser.add_argument("--strict", action="store_true", help="fail when a region's code generation fails")
    compile_parser.add_argument("--embed-engines", action="store_true",
                                help="build the regions' engines now and put them in the artifact (used where the "
                                     "loading machine is like this one: TensorRT release, GPU, platform)")
    compile_parser.add_argument("--shape-buckets", nargs="+", default=None, metavar="NAME=V,V,...",
                                help="with --dims: build the regions ahead for these values, every combination (e.g. "
                                     "batch=1,4,16 sequence=32,128); other shapes in range are built on first use")
    compile_parser.add_argument("--shape-memory", type=byte_size, default=None, metavar="SIZE",
                                help="bytes the model keeps for the shapes it meets, together (values of the shape alone, "
                                     "variants made on first use; e.g. 512M; default 256M)")
    compile_parser.add_argument("--accuracy-samples", type=at_least(0), default=0, metavar="N",
                                help="compare with onnxruntime on N seeded random inputs and print the error")
    add_backend_options(compile_parser)
    compile_parser.set_defaults(run=run_compile)

    run_parser = commands.add_parser("run", help="run an artifact")
    run_parser.add_argument("artifact")
    run_parser.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                            help="an input (default: seeded random, sized as the given inputs fix)")
    run_parser.add_argument("--output-dir", help="write each output as output<i>.npy here")
    run_parser.add_argument("--profile", action="store_true", help="print time per region and for the host")
    run_parser.add_argument("--repeat", type=at_least(1), default=10, help="runs to profile")
    run_parser.add_argument("--shape-memory", type=byte_size, default=None, metavar="SIZE",
                            help="replace the artifact's bound on what the model keeps for the shapes it meets (e.g. 1G)")
    run_parser.add_argument("--strict-engines", action="store_true",
                            help="fail, instead of rebuilding, when an embedded engine was built for another machine")
    add_backend_options(run_parser)
    run_parser.set_defaults(run=run_artifact)

    inspect_parser = commands.add_parser("inspect", help="show an artifact's regions, formats and sizes")
    inspect_parser.add_argument("artifact")
    inspect_parser.add_argument("--json", action="store_true")
    inspect_parser.set_defaults(run=run_inspect)


def run_compile(args: argparse.Namespace) -> int:
    model, mod, label = load_model(args.model, args.small, args.shapes, args.dims)
    partitioned = partition(args, mod, model)
    compiled = build(partitioned, strict=args.strict, engines="embed" if args.embed_engines else "lazy",
                     backend_options=backend_options(args), shape_buckets=parse_buckets(args.shape_buckets),
                     shape_memory=args.shape_memory)
    compiled.export(args.output)
    result = report(partitioned)
    specialised = compiled.parts.specialised
    variants = sum(len(region.variants) for region in specialised if not region.symbolic)
    regions_symbolic = sum(region.symbolic for region in specialised)
    of_regions = {symbol for region in specialised for symbol in region.variants.values()}
    regions = sum(a.symbol not in of_regions for a in compiled.artifacts) + len(specialised)
    print(
        f"{label}: {regions} region(s){f' ({variants} shape variant(s) built ahead)' if variants else ''}"
        f"{f' ({regions_symbolic} with one build for every shape)' if regions_symbolic else ''}, offload {result.offload_ratio_nodes:.1%} of ops and "
        f"{result.offload_ratio_macs:.1%} of MACs; wrote {args.output} ({os.path.getsize(args.output) / 2**20:.1f} MiB"
        f"{f', {len(compiled.parts.engines)} engine(s) embedded' if args.embed_engines else ''})"
    )
    if any(a.info for a in compiled.artifacts):
        print(compiled.report().to_table(max_host_ops=10))
    if args.accuracy_samples and model is not None:
        # Seeds past the calibration set's: the same distribution, other inputs.
        samples = [model_random_inputs(mod, model, 1000 + seed) for seed in range(args.accuracy_samples)]
        print(measure_accuracy(compiled, model, samples).to_table())
    return 0


def _inputs(specs, given: list[str], dims=None, ignored=()) -> dict[str, np.ndarray]:
    """Inputs from `--input` files, the others seeded random (a dynamic dimension at the value
    partitioning decided for); files for inputs the model never reads (`ignored`) are left out."""
    files = {}
    for item in given:
        name, sep, path = item.partition("=")
        if not sep:
            raise InputError(f"--input expects NAME=FILE.npy, got {item!r}")
        try:
            files[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise InputError(f"input {name!r}: cannot read {path!r} ({error})") from error
    files = {name: array for name, array in files.items() if name not in ignored}
    unknown = sorted(set(files) - {s.name for s in specs})
    if unknown:
        raise InputError(f"unknown input(s) {unknown}; the model's inputs are {[s.name for s in specs]}")
    for spec in specs:
        wanted, array = ML_DTYPES.get(str(spec.dtype)), files.get(spec.name)
        if wanted is not None and array is not None and array.dtype.kind == "V" and array.dtype.itemsize == wanted.itemsize:
            files[spec.name] = array.view(wanted)  # .npy keeps ml_dtypes' types (bfloat16) as raw bytes: |V2
    # A dimension a given file fixes holds for the generated inputs too (a forgotten mask gets
    # the ids' shape); the others are at the value partitioning decided for.
    sizes = {dim: r.opt for dim, r in (dims or {}).items()}
    for spec in specs:
        if spec.name in files and len(spec.shape) == files[spec.name].ndim:
            sizes.update((dim, size) for dim, size in zip(spec.shape, files[spec.name].shape) if isinstance(dim, str))
    shapes = [(s.name, tuple(sizes[d] if isinstance(d, str) else d for d in s.shape), s.dtype) for s in specs if s.name not in files]
    return {**random_inputs(shapes, 0), **files}


def run_artifact(args: argparse.Namespace) -> int:
    model = load(args.artifact, strict_engines=args.strict_engines, backend_options=backend_options(args),
                 shape_memory=args.shape_memory)
    inputs = _inputs(model.inputs, args.input, model.parts.dims, model.parts.ignored_inputs)
    outputs = model.run(**inputs)
    for index, (spec, value) in enumerate(zip(model.outputs, outputs)):
        summary = f"min {value.min():.4g}, max {value.max():.4g}" if value.size else "empty"
        named = f" ({spec.name})" if spec.name != f"output{index}" else ""
        print(f"output {index}{named}: shape {value.shape} {value.dtype}, {summary}")
        if args.output_dir:
            os.makedirs(args.output_dir, exist_ok=True)
            np.save(os.path.join(args.output_dir, f"output{index}.npy"), value)
    if args.profile:
        print(model.profile(**inputs, repeat=args.repeat).to_table())
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    manifest = read_manifest(args.artifact)
    if args.json:
        print(json.dumps({k: v for k, v in manifest.items() if k != "files"}, indent=2))
        return 0
    print(f"artifact {args.artifact}: target {manifest['target']}, TVM {manifest['tvm_version']}")
    for what in ("inputs", "outputs"):
        print(f"{what}: " + ", ".join(f"{s['name']} {tuple(s['shape'])} {s['dtype']}" for s in manifest[what]))
    if manifest.get("ignored_inputs"):
        print(f"declared, never read (taken by name and ignored): {', '.join(manifest['ignored_inputs'])}")
    print(f"constants: {len(set(manifest['constants'].values()))} unique of {len(manifest['constants'])} named")
    width = max([16, *(len(r["symbol"]) + 2 for r in manifest["regions"])])
    print(f"{'region':<{width}}{'backend':<14}{'format':<24}{'payload':>12}{'constants':>11}{'est. cycles':>13}  vendor")
    for region in manifest["regions"]:
        cycles = region.get("info", {}).get("cycles")
        print(
            f"{region['symbol']:<{width}}{region['backend']:<14}{region['format_name']:<24}{region['payload_bytes']:>12,}"
            f"{len(region['constants']):>11}{f'{cycles:,}' if cycles is not None else '-':>13}  {manifest['vendors'].get(region['backend'], '?')}"
        )
    for region in manifest["regions"]:
        if "engine" in region:
            built_for = ", ".join(f"{key} {value}" for key, value in region["engine"]["environment"].items())
            print(f"{region['symbol']}: engine embedded, built for {built_for or 'any machine'}")
    for name, (low, high, opt) in manifest.get("dims", {}).items():
        print(f"dimension {name}: {low} to {high} (regions decided for {opt})")
    for region in manifest.get("specialised", []):
        if region.get("symbolic"):
            print(f"{region['symbol']} ({region['backend']}): one build for every shape of {', '.join(region['dims'])} "
                  "(symbolic shapes)")
            continue
        reason = f" (its vendor takes symbolic shapes, but not this region's: {region['per_shape_reason']})" \
            if region.get("per_shape_reason") else ""
        built = ", ".join(sorted(region["variants"])) or "none"
        later = "other shapes generated on first use" if region["template"] else "no other shape (no template)"
        print(f"{region['symbol']} ({region['backend']}): shape-specialised on {', '.join(region['dims'])}; built ahead for "
              f"{built}; {later}{reason}")
    for symbol, reason in manifest.get("build_fallbacks", {}).items():
        print(f"{symbol} runs on the host: {reason}")
    return 0
