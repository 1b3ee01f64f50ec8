"""What a shape-specialised region is made of (see byoc.runtime_metadata.shapes): which regions
are, the template kept for shapes built on first use, the variant for given dimensions, and the
host's call of the region by symbol.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import numpy as np
import tvm
from tvm import relax

from byoc.backend.settings import VendorSettings
from byoc.backend.spec import Backend
from byoc.errors import ArtifactError, ByocError
from byoc.ir.dims import DimRange, function_dimensions, representative
from byoc.ir.rewrite import rebuild_function
from byoc.ir.types import constant_array, is_tensor_constant, tensor_types
from byoc.runtime_metadata.artifact_types import SYMBOLIC, RegionArtifact, SpecialisedRegion
from byoc.runtime_metadata.constants import ConstantStore
from byoc.runtime_metadata.generate_regions import generate_region


def is_shape_specialised(func: relax.Function) -> bool:
    """Whether a region function's tensors have symbolic dimensions."""
    return bool(function_dimensions(func))


def dim_pattern(dim) -> int | str | None:
    if isinstance(dim, tvm.ir.prim.expr.IntImm):
        return int(dim)
    return dim.name if isinstance(dim, tvm.tirx.Var) else None


def input_dims(func: relax.Function) -> list[list[int | str | None]]:
    patterns = []
    for param in func.params:
        for ty in tensor_types(param.ty):
            patterns.append([dim_pattern(d) for d in ty.shape.values] if ty.shape is not None else [])
    return patterns


@relax.expr_functor.mutator
class _LiftConstants(relax.PyExprMutator):
    """The tensor constants of a function's own body, scalars too, become parameters (their
    values go to the constant store, where the variants' weights are too); those inside its
    composite functions stay."""

    def __init__(self) -> None:
        super().__init__()
        self.lifted: list[tuple[relax.Var, np.ndarray]] = []
        self._seen: dict[int, relax.Var] = {}

    def visit_generic_const_(self, op: relax.Expr) -> relax.Expr:
        if not is_tensor_constant(op):
            return op
        var = self._seen.get(op.id_)
        if var is None:
            var = self._seen[op.id_] = relax.Var(f"byoc_template_c{len(self.lifted)}", op.ty)
            self.lifted.append((var, constant_array(op)))
        return var

    def visit_function_(self, op: relax.Function) -> relax.Expr:
        return op


def make_template(func: relax.Function, symbol: str, store: ConstantStore) -> tuple[str | None, list[str]]:
    """The region function as the artifact keeps it, and the store names of its lifted
    constants; (None, []) where it has no text form that reads back."""
    lifter = _LiftConstants()
    body = lifter.visit_expr(func.body)
    params = [*func.params, *(var for var, _ in lifter.lifted)]
    template = relax.Function(params, body, func.ret_ty, func.is_pure, func.attrs)
    text = tvm.IRModule({"region": template}).script(show_meta=False)
    if "metadata[" in text:  # a tensor constant inside a composite function: no text form for it
        return None, []
    try:  # TVMScript writes some values it cannot read back (-inf in a composite function)
        tvm.script.from_source(text, check_well_formed=False)
    except Exception:
        return None, []
    names = [f"{symbol}.template{index}" for index in range(len(lifter.lifted))]
    for name, (_, array) in zip(names, lifter.lifted):
        store.add(name, array)
    return text, names


def load_template(region: SpecialisedRegion, store: ConstantStore) -> tuple[relax.Function, dict[str, str]]:
    """The region function back from its template, its weights bound from `store`, and the
    dimensions its composite functions go by. The text names each function's own variable for
    a dimension apart (`batch_1` in a composite for the region's `batch`); code generation
    reads dimensions by name."""
    try:
        template = tvm.script.from_source(region.template, check_well_formed=False)["region"]
    except Exception as error:
        raise ArtifactError(f"region {region.symbol} ({region.backend}): its template cannot be read: {error}") from error
    count = len(template.params) - len(region.template_constants)
    if not isinstance(template, relax.Function) or count < 0:
        raise ArtifactError(f"region {region.symbol} ({region.backend}): its template does not match its constants")
    lifted = template.params[count:]
    mod = tvm.IRModule({"region": relax.Function(template.params, template.body, template.ret_ty, template.is_pure)})
    bound = relax.transform.BindParams("region", {var: tvm.runtime.tensor(store.get(name))
                                                  for var, name in zip(lifted, region.template_constants)})(mod)
    func = bound["region"]
    aliases = {}
    for name in re.findall(r'(\w+) = TypeVar\("\w+"\)', region.template):
        base = re.sub(r"_\d+$", "", name)
        if base != name and base in region.dims:
            aliases[name] = base
    return relax.Function(func.params, func.body, func.ret_ty, func.is_pure, template.attrs), aliases


def generate_variant(func: relax.Function, region: SpecialisedRegion, values: Mapping[str, int], backend: Backend,
                     store: ConstantStore, settings: VendorSettings) -> RegionArtifact:
    """The region's code for one shape: generated as a static region is, with every named
    dimension at its value."""
    with representative(values):
        return generate_region(func, region.variant_symbol(values), backend, store, settings)


def generate_symbolic(func: relax.Function, region: SpecialisedRegion, backend: Backend, store: ConstantStore, settings: VendorSettings,
                      dims: Mapping[str, DimRange]) -> RegionArtifact:
    """The region's code for every shape in range, its shapes symbolic (a backend that declares
    `symbolic_shapes`)."""
    return generate_region(func, f"{region.symbol}__{SYMBOLIC}", backend, store, settings, dims)


def through_dispatch(mod: tvm.IRModule, symbols: Iterable[str]) -> tvm.IRModule:
    """`mod` with each call to the named regions made a packed call by symbol (answered by
    `SpecialisedRuntime`), and those region functions removed."""
    symbols = set(symbols)
    if not symbols:
        return mod

    def call(value: relax.Expr, builder: relax.BlockBuilder) -> relax.Expr | None:
        if isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar) and value.op.name_hint in symbols:
            out = value.ty if isinstance(value.ty, relax.TensorType) else list(value.ty.fields)
            return relax.call_dps_packed(relax.ExternFunc(value.op.name_hint), relax.Tuple(list(value.args)), out)
        return None

    result = tvm.IRModule({gvar: func for gvar, func in mod.functions.items() if gvar.name_hint not in symbols}, attrs=mod.attrs)
    result["main"] = rebuild_function(mod["main"], replace_value=call)
    return result


def check_buckets(buckets: object, dims: Mapping[str, DimRange]) -> list[dict[str, int]]:
    """`shape_buckets=` as a list of full assignments: a list of {dim: value} (dimensions left
    out are at their `opt`), or one {dim: [values]} for every combination; each value in range."""
    if buckets is None:
        return [{name: r.opt for name, r in dims.items()}]
    if isinstance(buckets, Mapping):
        combos: list[dict[str, int]] = [{}]
        for name, values in buckets.items():
            values = values if isinstance(values, (list, tuple)) else [values]
            combos = [{**combo, name: value} for combo in combos for value in values]
        buckets = combos
    if not isinstance(buckets, (list, tuple)):
        raise ByocError(f"shape_buckets must be a list of {{dimension: value}} or one {{dimension: [values]}}, not {buckets!r}")
    checked = []
    for bucket in buckets:
        if not isinstance(bucket, Mapping):
            raise ByocError(f"shape_buckets: {bucket!r} is not a {{dimension: value}} mapping")
        unknown = sorted(set(bucket) - set(dims))
        if unknown:
            raise ByocError(f"shape_buckets: unknown dimension(s) {unknown}; the model's dynamic dimensions are {sorted(dims)}")
        values = {name: r.opt for name, r in dims.items()}
        for name, value in bucket.items():
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value not in dims[name]:
                raise ByocError(f"shape_buckets: {name}={value!r} is outside its range {dims[name]}")
            values[name] = int(value)
        if values not in checked:
            checked.append(values)
    return checked
