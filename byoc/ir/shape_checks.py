"""The conditions a model's ops need of its named dimensions (see `byoc.ir.shape_conditions`),
found in its Relax function before partitioning.

For each op whose validity depends on run-time sizes, the condition is written from the shapes
TVM inferred: each broadcast operand's dimension equals the result's or is 1 (the elementwise
ops, Expand); a MatMul's inner dimensions are equal, and its batch dimensions broadcast; a
Reshape keeps the element count; a Concat's inputs agree on every other axis; a slice compiled
as in bounds stays within its input. What the dimensions' ranges prove is left out, as is a
condition on sizes that only the data decides (those are not known before the run).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence

import tvm
from tvm import relax

from byoc.ir.dims import SHAPE_CHECKS_ATTR, DimRange, dims_of, symbolic_vars
from byoc.ir.shape_conditions import Expression, ShapeCheck
from byoc.ir.types import op_name, shape_dims

PrimExpr = tvm.ir.prim.expr.Expr

# The elementwise ops that broadcast their operands against each other.
BROADCASTING = frozenset(f"relax.{name}" for name in (
    "add", "subtract", "multiply", "divide", "floor_divide", "power", "maximum", "minimum", "mod", "floor_mod", "equal",
    "not_equal", "less", "less_equal", "greater", "greater_equal", "logical_and", "logical_or", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "where"))
# The op as a model names it, for the error; other ops keep their Relax name.
_OP_NAMES = {"relax.broadcast_to": "Expand", "relax.matmul": "MatMul", "relax.reshape": "Reshape", "relax.concat": "Concat",
             "relax.strided_slice": "Slice", "relax.add": "Add", "relax.subtract": "Sub", "relax.multiply": "Mul",
             "relax.divide": "Div", "relax.where": "Where", "relax.power": "Pow"}

# One condition of one op: what it requires, the condition, and the sizes an error shows.
_Found = tuple[str, PrimExpr, list[tuple[str, PrimExpr]]]


def _int64(dim: PrimExpr) -> PrimExpr:
    """`dim` as int64 (a shape's literal sizes may be int32)."""
    return dim if str(dim.ty.dtype) == "int64" else tvm.tirx.Cast("int64", dim)


def _equal(a, b) -> PrimExpr:
    return tvm.tirx.EQ(_int64(a), _int64(b))


def _broadcast(operands: Sequence[tuple[str, list]], result: list) -> Iterator[_Found]:
    for label, shape in operands:
        for index, dim in enumerate(shape):
            out = result[len(result) - len(shape) + index]
            condition = tvm.tirx.Or(_equal(dim, out), _equal(dim, tvm.tirx.const(1, "int64")))
            yield ("each dimension of an operand must equal the result's or be 1", condition,
                   [(f"{label} dim {index} ({dim})", dim), (f"the result's dim {len(result) - len(shape) + index} ({out})", out)])


def _product(dims: Sequence[PrimExpr]) -> PrimExpr:
    total = tvm.tirx.const(1, "int64")
    for dim in dims:
        total = total * _int64(dim)
    return total


def _found(call: relax.Call, result: list | None) -> Iterator[_Found]:
    """The conditions of one call, provable or not."""
    name = op_name(call)
    if result is None:
        return
    if name in BROADCASTING or name == "relax.broadcast_to":
        operands = [(f"operand {i}", shape_dims(arg.ty)) for i, arg in enumerate(call.args) if isinstance(arg.ty, relax.TensorType)]
        if name == "relax.broadcast_to":
            operands = operands[:1]
        if all(shape is not None and len(shape) <= len(result) for _, shape in operands):
            yield from _broadcast(operands, result)
    elif name == "relax.matmul":
        yield from _matmul(shape_dims(call.args[0].ty), shape_dims(call.args[1].ty), result)
    elif name == "relax.reshape":
        shape = shape_dims(call.args[0].ty)
        if shape is not None:
            yield ("the element count must not change", _equal(_product(shape), _product(result)),
                   [(f"the input's ({' * '.join(map(str, shape))})", _product(shape)),
                    (f"the target's ({' * '.join(map(str, result))})", _product(result))])
    elif name == "relax.concat":
        yield from _concat(call, result)
    elif name == "relax.strided_slice" and call.attrs.assume_inbound:
        yield from _slice(call)


def _matmul(a: list | None, b: list | None, result: list) -> Iterator[_Found]:
    if a is None or b is None or len(a) < 1 or len(b) < 1:
        return
    inner = b[-2] if len(b) >= 2 else b[0]
    yield ("its inner dimensions must be equal", _equal(a[-1], inner),
           [(f"operand 0's last dim ({a[-1]})", a[-1]), (f"operand 1's {'second last' if len(b) >= 2 else 'only'} dim ({inner})", inner)])
    if len(a) >= 2 and len(b) >= 2 and len(result) > 2:
        yield from _broadcast([("operand 0's batch", a[:-2]), ("operand 1's batch", b[:-2])], result[:-2])


def _concat(call: relax.Call, result: list) -> Iterator[_Found]:
    axis = int(call.attrs.axis) % len(result)
    fields = call.args[0].fields if isinstance(call.args[0], relax.Tuple) else []
    for position, field in enumerate(fields):
        shape = shape_dims(field.ty)
        if shape is None or len(shape) != len(result):
            continue
        for index, (dim, out) in enumerate(zip(shape, result)):
            if index != axis:
                yield (f"its inputs must agree on every axis but {axis}", _equal(dim, out),
                       [(f"input {position} dim {index} ({dim})", dim), (f"the result's dim {index} ({out})", out)])


def _slice(call: relax.Call) -> Iterator[_Found]:
    shape = shape_dims(call.args[0].ty)
    axes, begins, ends = call.args[1:4]
    if shape is None or not all(isinstance(t, relax.Tuple) for t in (axes, begins, ends)):
        return
    for axis, begin, end in zip(axes.fields, begins.fields, ends.fields):
        axis = int(axis.value) if hasattr(axis, "value") else int(axis)
        extent = shape[axis]
        if not (tvm.ir.is_prim_expr(begin) and tvm.ir.is_prim_expr(end)):
            continue
        begin, end, extent = _int64(begin), _int64(end), _int64(extent)
        condition = tvm.tirx.And(tvm.tirx.LE(tvm.tirx.const(0, "int64"), begin), tvm.tirx.And(tvm.tirx.LE(begin, end), tvm.tirx.LE(end, extent)))
        yield (f"the slice of axis {axis} must lie within it", condition,
               [(f"the start ({begin})", begin), (f"the end ({end})", end), (f"the axis's size ({extent})", extent)])


def shape_checks(func: relax.Function, ranges: Mapping[str, DimRange]) -> list[ShapeCheck]:
    """The conditions `func`'s ops need of its named dimensions that their ranges do not prove."""
    known: dict[str, tvm.tirx.Var] = {}
    for param in func.params:
        known.update(symbolic_vars(param.ty))
    if not known:
        return []
    analyzer = tvm.sym.Analyzer()
    for name, var in known.items():
        if name in ranges:
            low, high = (tvm.tirx.const(v, "int64") for v in (ranges[name].low, ranges[name].high + 1))
            analyzer.bind(var, tvm.ir.Range(low, high))
    checks: list[ShapeCheck] = []
    for block in func.body.blocks:
        for binding in block.bindings:
            call = binding.value
            if not (isinstance(call, relax.Call) and isinstance(call.op, tvm.ir.Op)):
                continue
            for requires, condition, shown in _found(call, shape_dims(binding.var.ty)):
                if analyzer.can_prove(condition):
                    continue
                encoded = encode(condition, set(known))
                sizes = [(label, encode(expr, set(known))) for label, expr in shown]
                if encoded is None or any(expr is None for _, expr in sizes):
                    continue  # a size the data decides: not known before the run
                op = op_name(call)
                checks.append(ShapeCheck(binding.var.name, _OP_NAMES.get(op, op), requires, encoded, tuple(sizes)))
    return checks


_BINARY = {"Add": "+", "Sub": "-", "Mul": "*", "FloorDiv": "//", "Div": "/", "FloorMod": "%", "Mod": "%", "Min": "min",
           "Max": "max", "EQ": "==", "NE": "!=", "LT": "<", "LE": "<=", "GT": ">", "GE": ">=", "And": "and", "Or": "or"}


def encode(expr: PrimExpr, names: set[str]) -> Expression | None:
    """`expr` in the form of `byoc.ir.shape_conditions`, or None where it reads anything but
    the named dimensions (a size computed from the data, a call)."""
    kind = type(expr).__name__
    if isinstance(expr, tvm.ir.prim.expr.IntImm):
        return int(expr.value)
    if isinstance(expr, tvm.tirx.Var):
        return expr.name if expr.name in names else None
    if kind == "Cast":
        return encode(expr.value, names)
    if kind == "Not":
        inner = encode(expr.a, names)
        return None if inner is None else ["not", inner]
    if kind == "Select":
        parts = [encode(e, names) for e in (expr.condition, expr.true_value, expr.false_value)]
        return None if any(p is None for p in parts) else ["select", *parts]
    if kind in _BINARY:
        a, b = encode(expr.a, names), encode(expr.b, names)
        return None if a is None or b is None else [_BINARY[kind], a, b]
    return None


def with_shape_checks(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` recording the conditions its `main` needs of its dimensions (none for a static model)."""
    dims = dims_of(mod)
    if not dims:
        return mod
    checks = shape_checks(mod["main"], dims)
    return mod.with_attr(SHAPE_CHECKS_ATTR, json.dumps([check.to_dict() for check in checks]))


def shape_checks_of(mod: tvm.IRModule) -> list[ShapeCheck]:
    """The conditions recorded on `mod` (see with_shape_checks); for a module with dimensions
    that a frontend did not make, those its `main` shows."""
    text = mod.attrs.get(SHAPE_CHECKS_ATTR) if mod.attrs is not None else None
    if text is None:
        dims = dims_of(mod)
        return shape_checks(mod["main"], dims) if dims else []
    return [ShapeCheck.from_dict(entry) for entry in json.loads(str(text))]
