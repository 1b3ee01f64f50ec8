"""Named dimensions the model itself bounds. A table read at every position up to a dimension
(a position embedding of 128 rows, read at `arange(seq)`) takes no value of the dimension past
its rows: where a `dims` range goes further, a call there would read past the table (TVM's
take wraps the index, and reads another row without a word; onnxruntime refuses the Gather).
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
from byoc.ir.dims import DIMS_ORIGIN_ATTR, DimRange, dims_of, with_dims
from byoc.ir.types import static_shape

# Ops an index passes through unchanged in value: the positions arange made are still the rows read.
_SAME_VALUES = ("relax.reshape", "relax.expand_dims", "relax.squeeze", "relax.flatten", "relax.broadcast_to", "relax.astype",
                "relax.permute_dims")


def table_bounds(func: relax.Function) -> dict[str, tuple[int, str, int]]:
    """For each dimension a table read bounds, the highest value it may take, the node that
    reads the table, and the table's rows (the least bound where several tables read it)."""
    values: dict[relax.Var, relax.Expr] = {}
    found: dict[str, tuple[int, str, int]] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            values[binding.var] = binding.value
            call = binding.value
            if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.take"):
                continue
            bound = _bound(call, values)
            if bound is not None:
                name, high, rows = bound
                if name not in found or high < found[name][0]:
                    found[name] = (high, binding.var.name, rows)
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
    recorded = json.loads(str(mod.attrs[DIMS_ORIGIN_ATTR])) if DIMS_ORIGIN_ATTR in mod.attrs else {}
    origin = {name: recorded.get(name, "open" if r.open else "given") for name, r in dims.items()}
    for name, (high, node, rows) in table_bounds(mod["main"]).items():
        given = dims.get(name)
        if given is None or given.high <= high:
            continue
        if high < given.low:
            continue  # nothing in range is valid: the run's own check names the node
        narrowed[name] = DimRange(given.low, high, min(given.opt, high))
        bound = f"node {node!r} reads a table of {rows} rows at every position up to it"
        if given.open:
            origin[name] = f"bounded by the model: {bound}"
            continue
        origin[name] = f"given, narrowed by the model: {bound}"
        warnings.warn(f"byoc: {where}: dimension {name!r} can be at most {high}: {bound}; dims allowed up to {given.high}, "
                      f"narrowed to {given.low}..{high}", DimensionBoundWarning, stacklevel=3)
    mod = with_dims(mod, narrowed) if narrowed != dims else mod
    return mod.with_attr(DIMS_ORIGIN_ATTR, json.dumps(origin, sort_keys=True))
