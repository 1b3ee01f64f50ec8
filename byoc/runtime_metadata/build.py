"""`byoc.build`: code generation for every region, host compilation, one compiled model."""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import threading
import warnings
from collections.abc import Mapping
from typing import Any

import tvm
import tvm_ffi
from tvm import relax

from byoc.backend.codegen import SETTINGS_ATTR
from byoc.backend.engine import EngineContext
from byoc.backend.registry import backend_origin, get_backend
from byoc.backend.runtime import checked_backend_options
from byoc.backend.settings import VendorSettings
from byoc.backend.spec import Backend
from byoc.cache_dirs import default_cache_dir
from byoc.codegen_c.generate import init_symbol
from byoc.compile_settings import Settings
from byoc.errors import BuildError, ByocError, DynamicShapeError, EngineError, RequantizationWarning, UnknownBackendError
from byoc.host import host_pipeline
from byoc.ir.dims import DimRange, dims_of, dims_origin, function_dimensions, symbolic_names
from byoc.ir.ignored_inputs import ignored_inputs
from byoc.ir.outputs import input_name, output_names
from byoc.ir.shape_checks import shape_checks_of
from byoc.ir.tail import tail_of
from byoc.ir.types import is_tensor_constant, static_shape, tensor_types
from byoc.partition.inline import inline_regions
from byoc.partition.outline import CODEGEN_ATTR, SYMBOL_ATTR
from byoc.partition.record import PARTITION_ATTR, PartitionRecord, RegionRecord
from byoc.runtime_metadata.artifact_types import DEFAULT_MAX_SHAPES, DEFAULT_SHAPE_MEMORY, SYMBOLIC, ModelParts, RegionArtifact, SpecialisedRegion, TensorSpec
from byoc.runtime_metadata.compiler import export_shared
from byoc.runtime_metadata.constants import ConstantStore
from byoc.runtime_metadata.direct import find_direct_call
from byoc.runtime_metadata.engine_cache import EngineCache
from byoc.runtime_metadata.engine_check import check_engine
from byoc.runtime_metadata.engines import EngineRecord, create_engine
from byoc.runtime_metadata.generate_regions import generate_region
from byoc.runtime_metadata.hoist_shape_values import hoist_shape_values
from byoc.runtime_metadata.model import CompiledModel, one_region_only
from byoc.runtime_metadata.shape_variants import (
    check_buckets,
    dim_pattern,
    generate_symbolic,
    generate_variant,
    input_dims,
    is_shape_specialised,
    make_template,
    through_dispatch,
)
from byoc.runtime_metadata.signature import signature, signature_module

# RunCodegen looks codegens up in the global registry: one build at a time registers them.
_RUN_CODEGEN = threading.Lock()


@relax.expr_functor.mutator
class _EmptyConstants(relax.PyExprMutator):
    def visit_generic_const_(self, op: relax.Expr) -> relax.Expr:
        if is_tensor_constant(op) and 0 in static_shape(op.ty, "a constant"):
            return relax.op.zeros(static_shape(op.ty, "a constant"), str(op.ty.dtype))
        return op


def _empty_constants_made_at_run_time(mod: tvm.IRModule) -> tvm.IRModule:
    """Tensor constants with no elements become `zeros` calls: the VM saves them in its
    constant pool but cannot load them back ("Invalid DLTensor file format")."""
    result = mod.clone()
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            result[gvar] = _EmptyConstants().visit_expr(func)
    return result


def region_symbol(gvar: relax.GlobalVar, func) -> str | None:
    """The symbol of an offloaded region function (its global symbol), or None for others."""
    if not (isinstance(func, relax.Function) and func.attrs is not None and CODEGEN_ATTR in func.attrs):
        return None
    return str(func.attrs[SYMBOL_ATTR]) if SYMBOL_ATTR in func.attrs else gvar.name_hint


def region_functions(mod: tvm.IRModule) -> list[tuple[str, str, relax.Function]]:
    """(symbol, backend, function) of every offloaded region."""
    found = []
    for gvar, func in mod.functions.items():
        symbol = region_symbol(gvar, func)
        if symbol is not None:
            found.append((symbol, str(func.attrs[CODEGEN_ATTR]), func))
    return sorted(found, key=lambda item: item[0])


def model_io(mod: tvm.IRModule) -> tuple[list[TensorSpec], list[TensorSpec]]:
    main = mod["main"]
    count = int(main.attrs["num_input"]) if main.attrs is not None and "num_input" in main.attrs else len(main.params)
    # A dimension is its size, or its name where it is dynamic (`batch`); an output dimension
    # that is an expression of them is -1.
    inputs = [TensorSpec(input_name(mod, p.name), tuple(_input_dim(d, p) for d in p.ty.shape.values) if symbolic_names(p.ty)
                         else static_shape(p.ty, f"input {p.name!r}"), str(p.ty.dtype)) for p in main.params[:count]]
    outputs = []
    types = tensor_types(main.ret_ty)
    for name, ty in zip(output_names(mod, len(types)), types):
        shape = tuple(-1 if dim_pattern(d) is None else dim_pattern(d) for d in ty.shape.values) if ty.shape is not None else ()
        outputs.append(TensorSpec(name, shape, str(ty.dtype)))
    return inputs, outputs


def _input_dim(dim, param: relax.Var) -> int | str:
    pattern = dim_pattern(dim)
    if pattern is None:
        raise DynamicShapeError(f"input {param.name!r} has dimension {dim} ({param.ty}): an input's dimension must be a "
                                "size or a named dimension")
    return pattern


def _cost(symbol: str, regions: dict[str, RegionRecord]) -> str:
    region = regions.get(symbol)
    if region is None:
        return ""
    first = f" from node {region.nodes[0]!r} on" if region.nodes else ""
    return f": its {region.num_ops} op(s){first} and {region.macs:,} MACs run on the host instead"


def _fall_back(message: str, symbol: str, regions: dict[str, RegionRecord]) -> None:
    warnings.warn(f"byoc: {message}; the region falls back to the host{_cost(symbol, regions)} "
                  "(build with strict=True to make this an error)", stacklevel=4)


def _region_backends(mod: tvm.IRModule, overrides: Mapping[str, Backend]) -> dict[str, Backend | None]:
    """Each vendor with regions in `mod`, made for the settings its regions record (the backend
    that partitioned them), or None when no such vendor is registered here. A backend given for
    this build (calibration probes, tests) is used as given, with the settings recorded for it."""
    found: dict[str, Backend | None] = dict(overrides)
    made: set[str] = set()
    for _, name, func in region_functions(mod):
        if name in made:
            continue
        made.add(name)
        backend = overrides.get(name) or _registered(name)
        record = func.attrs.get(SETTINGS_ATTR)
        if backend is None or record is None or not backend.settings.declared():
            found[name] = backend
            continue
        settings = type(backend.settings).from_json(name, str(record), BuildError)
        found[name] = dataclasses.replace(backend, settings=settings) if name in overrides else backend.with_settings(settings)
    return found


def _symbolic(func: relax.Function, region: SpecialisedRegion, backend: Backend, store: ConstantStore, settings: VendorSettings,
              dims: Mapping[str, DimRange]) -> RegionArtifact:
    artifact = generate_symbolic(func, region, backend, store, settings, dims)
    region.symbolic = True
    region.variants = {SYMBOLIC: artifact.symbol}
    return artifact


def _per_shape(func: relax.Function, region: SpecialisedRegion, backend: Backend, store: ConstantStore, settings: VendorSettings,
               buckets: list[dict[str, int]]) -> list[RegionArtifact]:
    """One variant per value of the dimensions the region uses (buckets that differ only in
    others share it)."""
    region.symbolic = False
    keyed = {region.key(values): values for values in buckets}
    generated = [generate_variant(func, region, values, backend, store, settings) for values in keyed.values()]
    region.variants = {key: artifact.symbol for key, artifact in zip(keyed, generated)}
    return generated


def _specialised(func: relax.Function, symbol: str, backend_name: str, store: ConstantStore) -> SpecialisedRegion:
    template, names = make_template(func, symbol, store)
    return SpecialisedRegion(symbol, backend_name, sorted(function_dimensions(func)), input_dims(func), template, names)


def _variant_of(specialised: Mapping[str, SpecialisedRegion]) -> dict[str, str]:
    """The region symbol of each variant symbol."""
    return {variant: region.symbol for region in specialised.values() for variant in region.variants.values()}


def _called(artifacts: list[RegionArtifact], specialised: Mapping[str, SpecialisedRegion]) -> dict[str, RegionArtifact]:
    """The artifact the host's call of each region symbol runs: a static region's own, a region
    with symbolic shapes' one variant; for a region generated per shape, one of its variants
    (its inputs and outputs but for their sizes)."""
    by_symbol = {a.symbol: a for a in artifacts}
    called = {symbol: artifact for symbol, artifact in by_symbol.items()
              if not any(symbol in region.variants.values() for region in specialised.values())}
    called.update({region.symbol: by_symbol[region.variants[SYMBOLIC] if region.symbolic else next(iter(region.variants.values()))]
                   for region in specialised.values() if region.variants})
    return called


def _drop_failed(unusable: Mapping[str, str], failed: dict[str, str], specialised: dict[str, SpecialisedRegion],
                 variant_of: Mapping[str, str]) -> None:
    """Record regions whose engines failed; a shape-specialised region falls back as a whole
    when one of its variants fails."""
    for symbol, why in unusable.items():
        base = variant_of.get(symbol, symbol)
        failed.setdefault(base, why if base == symbol else f"{symbol}: {why}")
        specialised.pop(base, None)


def _registered(name: str) -> Backend | None:
    try:
        return get_backend(name)
    except UnknownBackendError:
        return None  # reported as the region's code generation failure below


def _signature_only(func: relax.Function) -> relax.Function:
    """A region function reduced to its signature.

    RunCodegen collects the constants of every region function into the host executable, where
    they would be stored a second time: byoc's constant store already holds them and hands them
    to the engines. Code generation is done by then, so RunCodegen only needs the signatures.
    """
    outputs = [relax.op.zeros(relax.ShapeExpr(list(t.shape.values)), t.dtype) for t in tensor_types(func.ret_ty)]
    body = outputs[0] if isinstance(func.ret_ty, relax.TensorType) else relax.Tuple(outputs)
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)


def _c_modules_codegen(artifacts: dict[str, RegionArtifact]):
    def codegen(funcs, options, constant_names):
        modules = []
        for func in funcs:
            artifact = artifacts[str(func.attrs[SYMBOL_ATTR])]
            if artifact.linked_into_host:
                symbol = artifact.symbol
                # Constants are handed over from byoc's constant store through the init function,
                # so the module reports none and TVM adds no constant loader of its own.
                create = tvm.get_global_func("runtime.CSourceModuleCreate")
                modules.append(create(artifact.payload.decode(), "c", [symbol, init_symbol(symbol)], []))
        return modules

    return codegen


def _host_library(mod: tvm.IRModule, artifacts: list[RegionArtifact], backends: Mapping[str, Backend], target: str,
                  inputs: list[TensorSpec], outputs: list[TensorSpec], variants: set[str] = frozenset()) -> bytes:
    """The host code compiled, with the C regions linked in and the model's signature, as a
    shared library's bytes."""
    by_symbol = {a.symbol: a for a in artifacts}
    with _RUN_CODEGEN:
        for name in backends:
            tvm_ffi.register_global_func(f"relax.ext.{name}", _c_modules_codegen(by_symbol), override=True)
        stubbed = mod.clone()
        for gvar, func in mod.functions.items():
            if gvar.name_hint in by_symbol:
                stubbed[gvar] = _signature_only(func)
        lowered = relax.transform.RunCodegen()(stubbed)
    lowered = _empty_constants_made_at_run_time(lowered)
    try:
        executable = relax.build(lowered, target=target, relax_pipeline=host_pipeline())
    except Exception as error:  # TVM raises InternalError, ValueError, ... with no common base
        raise BuildError(f"compiling the host code failed: {type(error).__name__}: {str(error).strip().splitlines()[0]}") from error
    executable.mod.import_module(signature_module(signature(inputs, outputs, artifacts)))
    create = tvm.get_global_func("runtime.CSourceModuleCreate")
    for artifact in artifacts:  # C variants of shape-specialised regions: no function in `mod` calls them by name
        if artifact.symbol in variants and artifact.linked_into_host:
            executable.mod.import_module(create(artifact.payload.decode(), "c", [artifact.symbol, init_symbol(artifact.symbol)], []))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "host.so")
        try:
            linked = sorted({a.backend for a in artifacts if a.linked_into_host})
            export_shared(executable, path, [backends[name].codegen for name in linked])
        except Exception as error:
            raise BuildError(f"compiling the host library failed: {_first_compiler_error(str(error))}") from error
        with open(path, "rb") as f:
            return f.read()


def _first_compiler_error(text: str) -> str:
    """TVM's message with the compiler's first error line brought to its first line: TVM starts
    with "Compilation error:" and the compiler's output follows, where reports that keep one
    line would lose it."""
    lines = text.strip().splitlines()
    first = next((line.strip() for line in lines if " error: " in line or line.startswith("error: ")), None)
    if first is None or not lines or first == lines[0].strip():
        return text
    return f"{lines[0].strip()} {first}\n" + "\n".join(lines[1:])


def build(mod: tvm.IRModule, settings: Settings | None = None, backends: Mapping[str, Backend] | None = None,
          **options: Any) -> CompiledModel:
    """Compile a partitioned module into a `CompiledModel`, with the build fields of `settings`
    (`byoc.Settings`) or the keyword `options` that make them: `target`, `strict`, `engines`,
    `backend_options`, `cache_dir`, `shape_buckets`, `max_shapes`, `shape_memory`.

    Each region goes through its backend's code generator, and each region that runs through
    an engine (JSON graphs, custom blobs) gets its engine now, checked by a trial run on the
    region's shapes (`byoc.runtime_metadata.engine_check`). A generator or engine that fails
    makes its region fall back to the host with a warning naming the region, the vendor, the
    error and what it costs, or fails the build when `strict`. `backend_options` are each
    vendor's build and load settings, by vendor name. `engines="embed"` also keeps the engines
    for the artifact (`export` writes those their vendors can save, and a load on a like machine
    skips building them); `engines="lazy"` skips the check and builds each engine on first use,
    where a failure is an EngineError with nothing left to fall back to. JSON engines that can
    be saved are cached under `cache_dir` (default: $BYOC_CACHE_DIR or ~/.cache/byoc/engines).
    `backends` maps codegen names to backends used instead of the registered ones (calibration
    probes, tests).

    A model with dynamic dimensions (`from_onnx(..., dims=...)`) has its host code compiled
    once for every shape in range and its regions generated per shape (see
    byoc.runtime_metadata.shapes): ahead for `shape_buckets` (a list of {dimension: value}, or
    one {dimension: [values]} for every combination; by default each range's `opt`), on first
    use for any other shape, keeping at most `max_shapes` per region in memory. What it keeps
    per shape met (the values of the shape alone, variants run by engines) stays within
    `shape_memory` bytes together, least recently used first out (default 256 MiB; see
    byoc.runtime_metadata.shape_memory).
    """
    settings = Settings.of(settings, options, "build")
    dims = dims_of(mod)
    if not dims and settings.shape_buckets is not None:
        raise ByocError("shape_buckets applies to models with dynamic dimensions (from_onnx(..., dims=...)); this one has none")
    run = _Build(mod, settings, dict(backends or {}), dims)
    run.generate()
    run.engines(create=settings.engines != "lazy")
    model = run.link()
    run.say_if_nothing_is_offloaded()
    if settings.engines == "embed":
        model.embed_engines()
    return model


class _Build:
    """One build: what its steps make (region artifacts, engines, shape-specialised regions) and
    the regions that fall back to the host (`failed`, by symbol, with why). Its steps are
    `generate`, `engines` and `link`; each rule by which a region falls back, or is generated
    per shape instead, is a method of its own."""

    def __init__(self, mod: tvm.IRModule, settings: Settings, overrides: dict[str, Backend], dims: Mapping[str, DimRange]) -> None:
        self.partitioned, self.target, self.strict, self.overrides, self.dims = mod, settings.target, settings.strict, overrides, dims
        self.cache = EngineCache(settings.cache_dir if settings.cache_dir is not None else default_cache_dir())
        self.max_shapes = settings.max_shapes if settings.max_shapes is not None else DEFAULT_MAX_SHAPES
        self.shape_memory = settings.shape_memory if settings.shape_memory is not None else DEFAULT_SHAPE_MEMORY
        self.buckets = check_buckets(settings.shape_buckets, dims) if dims else []
        self.store = ConstantStore()
        self.configured = _region_backends(mod, overrides)
        self.backend_options = checked_backend_options(settings.backend_options, {name: b.runtime for name, b in self.configured.items()})
        record = mod.attrs.get(PARTITION_ATTR) if mod.attrs is not None else None
        self.partition = json.loads(str(record)) if record is not None else None
        self.planned = {r.symbol: r for r in PartitionRecord.from_dict(self.partition).regions} if self.partition else {}
        self.functions = {symbol: func for symbol, _, func in region_functions(mod)}
        self.artifacts: list[RegionArtifact] = []
        self.failed: dict[str, str] = {}
        self.specialised: dict[str, SpecialisedRegion] = {}
        self.records: dict[str, EngineRecord] = {}
        # The region symbol of each variant symbol, as it was when last taken (a region whose
        # variant fails is dropped from `specialised`, and its variants must still map to it).
        self.variant_of: dict[str, str] = {}

    # ------------------------------------------------------------------ steps
    def generate(self) -> None:
        """Every region's code: once for a static region; for a shape-specialised one (see
        byoc.runtime_metadata.shapes), once with symbolic shapes where its backend takes them,
        else once per bucket."""
        with warnings.catch_warnings():
            if self.strict:  # a device that would quantize the model's scales again refuses instead
                warnings.simplefilter("error", RequantizationWarning)
            for symbol, backend_name, func in region_functions(self.partitioned):
                self._generate(symbol, backend_name, func)

    def engines(self, create: bool) -> None:
        """The engines of regions written with symbolic shapes, always; the others' with
        `create` (else each is made on first use). A region whose engine fails falls back."""
        sole_work = one_region_only(self.partition, self.artifacts, self.failed)
        self._symbolic_engines(sole_work)
        self.variant_of = _variant_of(self.specialised)
        if create:
            self._create_engines(sole_work)
        self.artifacts = [a for a in self.artifacts if self.variant_of.get(a.symbol, a.symbol) not in self.failed]

    def link(self) -> CompiledModel:
        """The host code compiled with the C regions linked in, and the model made of it; where a
        rule below takes a failure, linked again without what failed."""
        while True:
            mod = inline_regions(self.partitioned, self.failed) if self.failed else self.partitioned
            if self.failed:
                self.store.keep_only({name for a in self.artifacts for name in a.constants}
                                     | {name for region in self.specialised.values() for name in region.template_constants})
            host_mod = hoist_shape_values(through_dispatch(mod, self.specialised)) if self.dims else mod
            backends = {a.backend: self.configured[a.backend] for a in self.artifacts}
            backends.update({region.backend: self.configured[region.backend] for region in self.specialised.values()})
            inputs, outputs = model_io(host_mod)
            try:
                library = _host_library(host_mod, self.artifacts, backends, self.target, inputs, outputs, set(self.variant_of))
            except BuildError as error:
                if not self._symbolic_c_did_not_compile(error):
                    raise
                continue
            try:
                return CompiledModel(self._parts(mod, library, backends, inputs, outputs), {name: b.runtime for name, b in backends.items()},
                                     self.cache, engines=self.records, data_sheets=backends)
            except EngineError as error:
                if self.strict or not self._region_did_not_initialise(error):
                    raise

    def say_if_nothing_is_offloaded(self) -> None:
        """One line where every region fell back: the model runs on the host alone, whatever the
        report of the partition said it would offload."""
        if self.failed and not self.artifacts and not self.specialised:
            regions = ", ".join(sorted(self.failed))
            macs = sum(self.planned[s].macs for s in self.failed if s in self.planned)
            warnings.warn(f"byoc: every region fell back to the host at build ({regions}): the model runs on the host alone, "
                          f"0 of {macs:,} MACs offloaded (see compiled.report() for each reason)", stacklevel=3)

    # ------------------------------------------------------------ the steps' parts
    def _settings(self, backend: Backend) -> VendorSettings:
        """The vendor's settings its regions are generated and run with: those they were
        partitioned with, under the build settings the user gave."""
        return backend.build_settings(self.backend_options.get(backend.name, {}))

    def _generate(self, symbol: str, backend_name: str, func: relax.Function) -> None:
        backend = self.configured.get(backend_name)
        missing = backend.missing_part() if backend is not None else None
        if missing:  # not a code generation failure to fall back from: the machine lacks the vendor's part
            raise BuildError(f"region {symbol} ({backend_name}) cannot be built on this machine: {missing}")
        try:
            backend = backend or get_backend(backend_name)
            settings = self._settings(backend)
            if is_shape_specialised(func):
                region = self.specialised[symbol] = _specialised(func, symbol, backend_name, self.store)
                if backend.symbolic_shapes:
                    try:
                        self.artifacts.append(_symbolic(func, region, backend, self.store, settings, self.dims))
                        return
                    except Exception as error:  # generated per shape instead, as for any backend
                        region.per_shape_reason = f"{type(error).__name__}: {error}"
                self.artifacts += _per_shape(func, region, backend, self.store, settings, self.buckets)
            else:
                self.artifacts.append(generate_region(func, symbol, backend, self.store, settings))
        except Exception as error:
            self.specialised.pop(symbol, None)
            self._generation_failed(symbol, backend_name, error)

    def _generation_failed(self, symbol: str, backend_name: str, error: Exception) -> None:
        message = f"region {symbol} ({backend_name}): code generation failed: {type(error).__name__}: {error}"
        if self.strict:
            raise BuildError(message) from error
        _fall_back(message, symbol, self.planned)
        self.failed[symbol] = f"code generation failed: {type(error).__name__}: {error}"

    def _symbolic_engines(self, sole_work: bool) -> None:
        """The engines of the regions written with symbolic shapes, made and checked at each
        dimension's `opt` whatever `engines=` says: only an engine tells whether its vendor takes
        the region's shapes symbolically. A region whose engine does not is generated per shape
        instead (its artifacts replace the symbolic one), as for any backend."""
        opt = {name: r.opt for name, r in self.dims.items()}
        for region in list(self.specialised.values()):
            if not region.symbolic:
                continue
            symbol = region.variants[SYMBOLIC]
            artifact = next(a for a in self.artifacts if a.symbol == symbol)
            if artifact.linked_into_host:  # no engine: checked when the host library initialises it, at each dimension's opt
                continue
            backend = self.configured[region.backend]
            try:
                self.records[symbol] = create_engine(artifact, backend, self.store, self._settings(backend), self.cache,
                                                     EngineContext(symbol, sole_work))
                check_engine(self.records[symbol].engine, artifact, f"region {symbol} ({region.backend})", opt,
                             self.store.subset(artifact.constants), backend.tolerance)
            except Exception as error:
                self.records.pop(symbol, None)
                self._per_shape_instead(region, f"{type(error).__name__}: {error}")

    def _create_engines(self, sole_work: bool) -> None:
        """Each other region's engine, made and checked now (see `engine_check`), while a region
        whose engine fails can still fall back to the host."""
        unusable: dict[str, str] = {}
        for artifact in self.artifacts:
            if artifact.symbol in self.records or artifact.linked_into_host:  # no engine: checked when the host library initialises it
                continue
            where = f"region {artifact.symbol} ({artifact.backend})"
            absent = self.configured[artifact.backend].codegen.device_missing()
            if absent is not None:  # built for a device elsewhere: its engine is made and run where the model is loaded
                warnings.warn(f"byoc: {where}: its code is built, but not run or checked here ({absent}): the machine that loads "
                              "the model makes its engine", stacklevel=4)
                continue
            try:
                backend = self.configured[artifact.backend]
                record = create_engine(artifact, backend, self.store, self._settings(backend), self.cache,
                                       EngineContext(artifact.symbol, sole_work))
                check_engine(record.engine, artifact, where, None, self.store.subset(artifact.constants), backend.tolerance)
            except EngineError as error:  # the vendor's failure; an OptionError is the user's, and raised
                if self.strict:
                    raise
                _fall_back(str(error), artifact.symbol, self.planned)
                unusable[artifact.symbol] = str(error).removeprefix(f"{where}: ")
                continue
            self.records[artifact.symbol] = record
        _drop_failed(unusable, self.failed, self.specialised, self.variant_of)

    def _parts(self, mod: tvm.IRModule, library: bytes, backends: Mapping[str, Backend], inputs: list[TensorSpec],
               outputs: list[TensorSpec]) -> ModelParts:
        return ModelParts(
            library,
            self.artifacts,
            self.store,
            inputs,
            outputs,
            str(self.target),
            {name: "this build" if name in self.overrides else backend_origin(name) for name in backends},
            self.backend_options,
            partition=self.partition,
            build_fallbacks=self.failed,
            direct_call=find_direct_call(mod, _called(self.artifacts, self.specialised), region_symbol,
                                         {region.symbol for region in self.specialised.values() if not region.symbolic}),
            dims=self.dims,
            shape_checks=shape_checks_of(self.partitioned),
            dims_origin=dims_origin(self.partitioned),
            tail=tail_of(self.partitioned),
            specialised=list(self.specialised.values()),
            max_shapes=self.max_shapes,
            shape_memory=self.shape_memory,
            ignored_inputs=ignored_inputs(mod),
        )

    # --------------------------------------------------------- fall-back rules
    def _per_shape_instead(self, region: SpecialisedRegion, reason: str) -> None:
        """A region written with symbolic shapes that its vendor's engine or library did not take
        so: generated per shape instead (its artifacts replace the symbolic one), or falling back
        to the host where that fails too."""
        region.per_shape_reason = reason
        self.artifacts[:] = [a for a in self.artifacts if a.symbol != region.variants[SYMBOLIC]]
        try:
            backend = self.configured[region.backend]
            self.artifacts += _per_shape(self.functions[region.symbol], region, backend, self.store, self._settings(backend), self.buckets)
        except Exception as error:
            self._generation_failed(region.symbol, region.backend, error)
            del self.specialised[region.symbol]

    def _symbolic_c_did_not_compile(self, error: BuildError) -> bool:
        """C written with symbolic shapes is new code for every model: where the host library
        does not compile, its regions are generated per shape (C that the static path compiles).
        Whether there were any."""
        linked = [r for r in self.specialised.values() if r.symbolic and self.configured[r.backend].codegen.links_into_host]
        for region in linked:
            self._per_shape_instead(region, f"its C code for every shape did not compile: {error}")
        self.variant_of = _variant_of(self.specialised)
        return bool(linked)

    def _region_did_not_initialise(self, error: EngineError) -> bool:
        """A C region whose initialisation fails (its vendor library refuses a primitive on this
        machine) falls back too, and the host code is compiled again without it; one written
        with symbolic shapes is generated per shape first. Whether the error names such a region."""
        symbol = getattr(error, "region", None)
        if symbol is None or self.variant_of.get(symbol, symbol) in self.failed:
            return False
        region = self.specialised.get(self.variant_of.get(symbol, symbol))
        if region is not None and region.symbolic:
            self._per_shape_instead(region, str(error))
            self.variant_of = _variant_of(self.specialised)
            return True
        backend_name = next(a.backend for a in self.artifacts if a.symbol == symbol)
        _fall_back(str(error), self.variant_of.get(symbol, symbol), self.planned)
        _drop_failed({symbol: str(error).removeprefix(f"region {symbol} ({backend_name}): ")}, self.failed, self.specialised,
                     self.variant_of)
        self.artifacts = [a for a in self.artifacts if self.variant_of.get(a.symbol, a.symbol) not in self.failed]
        return True
