"""Named dynamic dimensions (`batch`, `sequence`) and the range of values each may take.

A model imported with `dims=` keeps its dynamic dimensions as symbolic variables, and its module
records their ranges. The host code is compiled once for every value in range (TVM Relax
compiles symbolic shapes natively, and the upper bounds let it plan memory statically); regions
are written once with symbolic shapes for a vendor that takes them, else specialised per concrete
shape (see byoc.runtime_metadata.shapes).

Partitioning decides once for all shapes: its predicates, limits and cost model see each
dimension at its representative value (`representative`), the `opt` of the range, as a
TensorRT optimization profile has one.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterable, Iterator, Mapping

import tvm
from tvm import relax

from byoc.ir.dim_range import DIMS_ATTR as DIMS_ATTR
from byoc.ir.dim_range import DIMS_ORIGIN_ATTR as DIMS_ORIGIN_ATTR
from byoc.ir.dim_range import OPEN as OPEN
from byoc.ir.dim_range import SHAPE_CHECKS_ATTR as SHAPE_CHECKS_ATTR
from byoc.ir.dim_range import DimRange as DimRange
from byoc.ir.dim_range import at_opt as at_opt
from byoc.ir.dim_range import dim_range as dim_range
from byoc.ir.tail import TAIL_ATTR, TAIL_INFO_ATTR


def dims_of(mod: tvm.IRModule) -> dict[str, DimRange]:
    """The named dynamic dimensions of an imported (or partitioned) module, empty for a static
    one."""
    text = mod.attrs.get(DIMS_ATTR) if mod.attrs is not None else None
    if text is None:
        return {}
    return {name: DimRange(*values) for name, values in json.loads(str(text)).items()}


def with_dims(mod: tvm.IRModule, dims: Mapping[str, DimRange]) -> tvm.IRModule:
    """`mod` recording `dims`, its `main` bounded by them (TVM plans memory from the bounds)."""
    if not dims:
        return mod
    mod = mod.with_attr(DIMS_ATTR, json.dumps({name: r.to_list() for name, r in dims.items()}))
    main = mod["main"]
    # An open range has no bound to plan memory from: TVM allocates such tensors at run time.
    main = main.with_attr("tir_var_upper_bound", {name: r.high for name, r in dims.items() if not r.open})
    mod["main"] = main.with_attr("tir_var_lower_bound", {name: r.low for name, r in dims.items()})
    return mod


def copy_dims(source: tvm.IRModule, target: tvm.IRModule) -> tvm.IRModule:
    """`target` with `source`'s dimension ranges and the model's other records (what the ops
    need of the dimensions, the tail that runs after it): passes that rebuild modules drop
    attributes."""
    dims = dims_of(source)
    if dims and not dims_of(target):
        target = with_dims(target, dims)
    for attr in (DIMS_ORIGIN_ATTR, SHAPE_CHECKS_ATTR, TAIL_ATTR, TAIL_INFO_ATTR):
        value = source.attrs.get(attr) if source.attrs is not None else None
        if value is not None and (target.attrs is None or target.attrs.get(attr) is None):
            target = target.with_attr(attr, value)
    return target


def dims_origin(mod: tvm.IRModule) -> dict[str, str]:
    """Where each dimension's range comes from: as recorded, else "open" for an open range and
    "given" for another."""
    text = mod.attrs.get(DIMS_ORIGIN_ATTR) if mod.attrs is not None else None
    recorded = json.loads(str(text)) if text is not None else {}
    return {name: recorded.get(name, "open" if r.open else "given") for name, r in dims_of(mod).items()}


_REPRESENTATIVE: contextvars.ContextVar[Mapping[str, int] | None] = contextvars.ContextVar("byoc_representative", default=None)


@contextlib.contextmanager
def representative(values: Mapping[str, int]) -> Iterator[None]:
    """Within this block, shapes read through byoc.ir.types see each named dimension at the
    value given here."""
    token = _REPRESENTATIVE.set({**(_REPRESENTATIVE.get() or {}), **values})
    try:
        yield
    finally:
        _REPRESENTATIVE.reset(token)


def evaluate(dim, values: Mapping[str, int] | None = None) -> int | None:
    """A dimension's value: its own where static, else under `values` (by default, the
    representative values in force); None where some variable has no value."""
    if isinstance(dim, tvm.ir.prim.expr.IntImm):
        return int(dim)
    values = _REPRESENTATIVE.get() if values is None else values
    if not values:
        return None
    analyzer = tvm.sym.Analyzer()
    for var in tvm.tirx.analysis.undefined_vars(dim):
        if var.name not in values:
            return None
        analyzer.bind(var, values[var.name])
    result = analyzer.simplify(dim)
    return int(result) if isinstance(result, tvm.ir.prim.expr.IntImm) else None


def is_dimension(var: relax.Var) -> bool:
    """Whether `var` is one of the named dimensions in force (see `representative`): in TVM
    0.27 a shape's variable and a Relax variable are one Python type."""
    values = _REPRESENTATIVE.get()
    return bool(values) and isinstance(var.ty, tvm.ir.PrimType) and var.name in values


def symbolic_vars(ty: relax.Type) -> dict[str, tvm.tirx.Var]:
    """The symbolic variables in a tensor (or tuple) type's shape, by name."""
    found: dict[str, tvm.tirx.Var] = {}
    if isinstance(ty, relax.TupleType):
        for field in ty.fields:
            for name, var in symbolic_vars(field).items():
                found.setdefault(name, var)
    shape = getattr(ty, "shape", None)
    if isinstance(shape, relax.ShapeExpr):
        for dim in shape.values:
            if not isinstance(dim, tvm.ir.prim.expr.IntImm):
                for var in tvm.tirx.analysis.undefined_vars(dim):
                    found.setdefault(var.name, var)
    return found


def symbolic_names(ty: relax.Type) -> set[str]:
    """The names of the symbolic variables in a tensor (or tuple) type's shape."""
    return set(symbolic_vars(ty))


def function_dimensions(func: relax.Function) -> set[str]:
    """The names of the dimensions a function's parameters and result use."""
    return symbolic_names(func.ret_ty).union(*(symbolic_names(p.ty) for p in func.params))


def defined_dimensions(types: Iterable[relax.Type]) -> dict[str, tvm.tirx.Var]:
    """The dimensions these types give plainly (a dimension that is one variable), by name:
    those a function whose parameters have them can read off its arguments."""
    found: dict[str, tvm.tirx.Var] = {}
    for ty in types:
        shape = getattr(ty, "shape", None)
        for dim in shape.values if isinstance(shape, relax.ShapeExpr) else []:
            if isinstance(dim, tvm.tirx.Var):
                found.setdefault(dim.name, dim)
    return found
