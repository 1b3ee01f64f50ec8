"""Named dimensions an op needs equal, made one.

A file may name two dimensions apart that an op then broadcasts one against the other (an Add
of `x: [a, 4]` and `y: [b, 4]`) or joins (a Concat along another axis). ONNX lets that run where
they are equal or one is 1; TVM cannot tell which, leaves the result's shape unknown, and no
kernel can be made for it: the build failed with an internal error. Here such dimensions become
one, the first's, over the range both allow, with a warning: a call that gives them different
sizes is then an InputError before anything runs, where a broadcast from 1 would have run.
"""

from __future__ import annotations

import json
import warnings

import tvm
from tvm import relax

from byoc.errors import DimensionBoundWarning, ModelLoadError
from byoc.ir.dims import DIMS_ORIGIN_ATTR, DimRange, dims_of, dims_origin, with_dims
from byoc.ir.shape_checks import BROADCASTING
from byoc.ir.types import op_name, shape_dims

_JOINING = BROADCASTING | {"relax.concat"}


def _shapes(call: relax.Call) -> list[list]:
    operands = call.args[0].fields if op_name(call) == "relax.concat" and isinstance(call.args[0], relax.Tuple) else call.args
    return [dims for operand in operands if isinstance(operand.ty, relax.TensorType) and (dims := shape_dims(operand.ty)) is not None]


def _positions(call: relax.Call, shapes: list[list]) -> list[list]:
    """The dimensions of the operands that must agree, position by position."""
    rank = max(len(shape) for shape in shapes)
    skip = int(call.attrs.axis) % rank if op_name(call) == "relax.concat" else None
    return [[shape[len(shape) - rank + i] for shape in shapes if len(shape) - rank + i >= 0] for i in range(rank) if i != skip]


def _first_pair(func: relax.Function, names: set[str]) -> tuple[tvm.tirx.Var, tvm.tirx.Var, str] | None:
    """Two named dimensions some op needs equal and TVM could not make one shape of, with the
    op's node, or None."""
    for block in func.body.blocks:
        for binding in block.bindings:
            call = binding.value
            if not (isinstance(call, relax.Call) and op_name(call) in _JOINING):
                continue
            if shape_dims(binding.var.ty) is not None:
                continue
            shapes = _shapes(call)
            if not shapes:
                continue
            for dims in _positions(call, shapes):
                named = [d for d in dims if isinstance(d, tvm.tirx.Var) and d.name in names]
                distinct = list({d.name: d for d in named}.values())
                if len(distinct) >= 2:
                    return distinct[0], distinct[1], f"node {binding.var.name!r} ({op_name(call)})"
    return None


def unified_dims(mod: tvm.IRModule, where: str) -> tvm.IRModule:
    """`mod` with each pair of named dimensions that an op needs equal made one (see above)."""
    dims = dims_of(mod)
    origin = dims_origin(mod)
    changed = False
    for _ in range(len(dims)):
        main = mod["main"]
        pair = _first_pair(main, set(dims))
        if pair is None:
            break
        keep, drop, node = pair
        a, b = dims[keep.name], dims.pop(drop.name)
        merged = DimRange(max(a.low, b.low), min(a.high, b.high), max(a.low, b.low, min(a.opt, b.opt)))
        if merged.low > merged.high:
            raise ModelLoadError(f"{where}: {node} needs dimensions {keep.name!r} ({a}) and {drop.name!r} ({b}) equal, and "
                                 "their ranges do not meet")
        dims[keep.name] = DimRange(merged.low, merged.high, min(merged.opt, merged.high))
        origin[keep.name] = f"{origin[keep.name]}; also {drop.name!r}: {node} needs them equal"
        origin.pop(drop.name, None)
        warnings.warn(f"byoc: {where}: {node} broadcasts or joins dimensions {keep.name!r} and {drop.name!r}; they are compiled "
                      f"as one ({keep.name!r}, {dims[keep.name]}), so a call must give them the same size", DimensionBoundWarning,
                      stacklevel=3)
        mod["main"] = main.bind_symbolic_vars({drop: keep})
        changed = True
    if not changed:
        return mod
    mod = with_dims(mod, dims)
    return mod.with_attr(DIMS_ORIGIN_ATTR, json.dumps(origin, sort_keys=True))
