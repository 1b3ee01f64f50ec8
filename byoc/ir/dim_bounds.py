"""Named dimensions the model itself bounds. A table read at every position up to a dimension
(a position embedding of 128 rows, read at `arange(seq)`) takes no value of the dimension past
its rows: where a `dims` range goes further, a call there would read past the table (TVM's
take wraps the index, and reads another row without a word; onnxruntime refuses the Gather).
So does a slice compiled as in bounds that ends at the dimension (a buffer of 512 positions
sliced to `seq`).
The range is narrowed to the bound with a warning, so that such a call is an InputError naming
the dimension and its range before anything runs.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping

import tvm
from tvm import relax

from byoc.errors import DimensionBoundWarning
from byoc.ir.dims import DIMS_ORIGIN_ATTR, DimRange, dims_of, dims_origin, with_dims
from byoc.ir.types import static_shape

# Ops an index passes through unchanged in value: the positions arange made are still the rows read.
_SAME_VALUES = ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten", "relax.broadcast_to", "relax.astype",
                "relax.permute_dims")


def table_bounds(func: relax.Function) -> dict[str, tuple[int, str, str]]:
    """For each dimension a table read (or an in-bounds slice) bounds, the highest value it may
    take, the node, and what it does (the least bound where several nodes bound it)."""
    values: dict[relax.Var, relax.Expr] = {}
    found: dict[str, tuple[int, str, int]] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            values[binding.var] = binding.value
            call = binding.value
            if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)):
                continue
            if call.op.name == "relax.take":
                bounds = [(b[0], b[1], f"reads a table of {b[2]} rows at every position up to it")
                          for b in [_bound(call, values)] if b is not None]
            elif call.op.name == "relax.strided_slice" and call.attrs.assume_inbound:
                bounds = [(name, high, f"slices an axis of {size} up to it") for name, high, size in _slice_bounds(call)]
            else:
                continue
            for name, high, does in bounds:
                if name not in found or high < found[name][0]:
                    found[name] = (high, binding.var.name, does)
    return found


def _slice_bounds(call: relax.Call) -> list[tuple[str, int, int]]:
    """(dimension, its highest value, the axis's size) for each axis that a slice compiled as in
    bounds ends at `d + c` of a static axis (a position buffer of 512 sliced to `seq`)."""
    shape = getattr(call.args[0].ty, "shape", None)
    axes, ends = call.args[1], call.args[3]
    if not (isinstance(shape, relax.ShapeExpr) and isinstance(axes, relax.Tuple) and isinstance(ends, relax.Tuple)):
        return []
    found = []
    for axis, end in zip(axes.fields, ends.fields):
        extent = _constant(shape.values[int(axis.value) if hasattr(axis, "value") else int(axis)])
        offset = 0
        if isinstance(end, tvm.tirx.Add) and _constant(end.b) is not None:
            end, offset = end.a, _constant(end.b)
        if extent is not None and isinstance(end, tvm.tirx.Var):
            found.append((end.name, extent - offset, extent))
    return found


def _bound(take: relax.Call, values: Mapping[relax.Var, relax.Expr]) -> tuple[str, int, int] | None:
    """(dimension, its highest value, the table's rows) where `take` reads a table of static
    rows at `arange(0, d + c)` (so d + c <= rows); else None."""
    axis = take.attrs.axis
    if axis is None:
        return None
    try:
        rows = static_shape(take.args[0].ty)[int(axis)]
    except Exception:  # a table of unknown size bounds nothing
        return None
    index = take.args[1]
    while isinstance(index, relax.Var) and index in values:
        value = values[index]
        if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.name in _SAME_VALUES:
            index = value.args[0]
            continue
        index = value
        break
    if not (isinstance(index, relax.Call) and isinstance(index.op, tvm.ir.Op) and index.op.name == "relax.arange"):
        return None
    start, end, step = index.args[:3]  # TVM's own expressions of the arange's bounds
    if not (_constant(start) == 0 and _constant(step) == 1):
        return None
    offset = 0
    if isinstance(end, tvm.tirx.Add) and _constant(end.b) is not None:
        end, offset = end.a, _constant(end.b)
    if not isinstance(end, tvm.tirx.Var):
        return None
    return end.name, rows - offset, rows


def _constant(expr) -> int | None:
    return int(expr.value) if isinstance(expr, tvm.tirx.IntImm) else None


def narrowed_to_table_bounds(mod: tvm.IRModule, where: str) -> tvm.IRModule:
    """`mod` with each dimension's range narrowed to what its tables bound, and where each range
    comes from recorded for the report: an open range (a dimension the file names and the user
    did not) takes the bound quietly; a given range that went past it is narrowed with a warning."""
    dims = dims_of(mod)
    if not dims:
        return mod
    narrowed: dict[str, DimRange] = dict(dims)
    origin = dims_origin(mod)
    for name, (high, node, does) in table_bounds(mod["main"]).items():
        given = dims.get(name)
        if given is None or given.high <= high:
            continue
        if high < given.low:
            continue  # nothing in range is valid: the run's own check names the node
        narrowed[name] = DimRange(given.low, high, min(given.opt, high))
        bound = f"node {node!r} {does}"
        if given.open:
            origin[name] = f"bounded by the model: {bound}"
            continue
        origin[name] = f"given, narrowed by the model: {bound}"
        warnings.warn(f"byoc: {where}: dimension {name!r} can be at most {high}: {bound}; dims allowed up to {given.high}, "
                      f"narrowed to {given.low}..{high}", DimensionBoundWarning, stacklevel=3)
    mod = with_dims(mod, narrowed) if narrowed != dims else mod
    return mod.with_attr(DIMS_ORIGIN_ATTR, json.dumps(origin, sort_keys=True))
