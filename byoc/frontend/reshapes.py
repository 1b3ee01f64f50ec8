"""Reshapes on either side of element-wise ops, folded into one.

Exporters and onnxruntime's graph optimizer write a dense layer of a 3-D input as reshape to
rows, the product, reshape back; the activation between two such layers then sits between two
reshapes that undo each other (`reshape(gelu(reshape(x)))`). In a float model a vendor reads
those reshapes as views, but in a quantized one each is a pass over the data on its own, and the
GELU between them, read through a dequantize and written through a quantize, cannot be matched
as one int8 op. An element-wise op computes the same on any shape, so:

- `reshape(f(reshape(x)))`, `f` a chain of element-wise ops whose other operands are single
  numbers (a GELU, a dequantize and a quantize per tensor, `x * 0.5`), is `reshape(f(x))` with
  one reshape to the outer shape, and `f(x)` where that is `x`'s own shape.

Only values read once are moved, so nothing is computed twice. Exact.

`fold_moves` does the same for chains of transposes and unit reshapes (attention's keys).
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from byoc.ir.rewrite import bound_value, rebuild_module
from byoc.ir.types import constant_array, has_static_shape, is_tensor_constant, op_name, static_shape

_UNARY = frozenset({
    "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.relu", "relax.nn.silu", "relax.sigmoid", "relax.tanh", "relax.erf",
    "relax.exp", "relax.sqrt", "relax.rsqrt", "relax.negative", "relax.abs", "relax.clip", "relax.astype",
})
_BINARY = frozenset({"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.power"})
_PER_TENSOR = frozenset({"relax.quantize", "relax.dequantize"})


def _single_number(expr: relax.Expr) -> bool:
    return is_tensor_constant(expr) and math.prod(static_shape(expr.ty)) == 1


def _data_index(call: relax.Expr) -> int | None:
    """Which operand of an element-wise op with single-number parameters carries the data; None
    for any other op."""
    name = op_name(call)
    if name in _UNARY:
        return 0
    if name in _PER_TENSOR:
        return 0 if all(_single_number(a) for a in call.args[1:3]) else None
    if name in _BINARY:
        for index in (0, 1):
            if _single_number(call.args[1 - index]) and not _single_number(call.args[index]):
                return index
    return None


def _on(call: relax.Call, index: int, data: relax.Expr) -> relax.Call:
    """`call` applied to `data` in place of its operand `index`: constants as scalars (a
    (1, 1, 1) constant would broadcast a lower-rank operand back up), a per-tensor quantize's
    axis the last (its own may not exist at the new rank)."""
    args = [data if i == index else relax.const(constant_array(a).reshape(()), str(a.ty.dtype)) if is_tensor_constant(a) else a
            for i, a in enumerate(call.args)]
    name = op_name(call)
    if name in _PER_TENSOR:
        make = relax.op.quantize if name == "relax.quantize" else relax.op.dequantize
        return make(args[0], args[1], args[2], axis=-1, out_dtype=str(call.attrs.out_dtype))
    return relax.Call(call.op, args, call.attrs, call.ty_args)


def _tidy(mod: tvm.IRModule) -> tvm.IRModule:
    """A rewritten module with aliases resolved and the bindings left unread dropped."""
    return tvm.transform.Sequential([relax.transform.CanonicalizeBindings(), relax.transform.DeadCodeElimination(["main"])])(mod)


def _bindings(mod: tvm.IRModule) -> tuple[dict[relax.Var, relax.Expr], dict[relax.Var, int]]:
    """Each variable's bound value, and how many bindings (and function results) read it."""
    values: dict[relax.Var, relax.Expr] = {}
    readers: dict[relax.Var, int] = {}
    for func in mod.functions.values():
        if not isinstance(func, relax.Function):
            continue
        bound = {b.var: b.value for block in func.body.blocks for b in block.bindings}
        values.update(bound)
        for value in [*bound.values(), func.body.body]:
            for var in relax.analysis.free_vars(value):
                readers[var] = readers.get(var, 0) + 1
    return values, readers


def fold_reshapes(mod: tvm.IRModule) -> tvm.IRModule:
    values, readers = _bindings(mod)

    def read_once(expr: relax.Expr) -> bool:
        return isinstance(expr, relax.Var) and readers.get(expr, 0) == 1

    def chain(reshape: relax.Call) -> list[int] | None:
        """The data operand of each element-wise op from the outer reshape back to the inner one,
        found on the function as it was (the one being rebuilt has new variables after a change)."""
        indices = []
        operand = reshape.args[0]
        source = values.get(operand)
        while read_once(operand) and source is not None and (index := _data_index(source)) is not None:
            indices.append(index)
            operand = source.args[index]
            source = values.get(operand)
        if not read_once(operand) or op_name(source) != "relax.reshape" or not has_static_shape(source.args[0].ty):
            return None
        return indices

    def rewrite(binding: relax.Binding, value: relax.Expr, builder: relax.BlockBuilder) -> relax.Expr | None:
        if op_name(binding.value) != "relax.reshape" or not has_static_shape(binding.value.ty):
            return None
        indices = chain(binding.value)
        if indices is None:
            return None
        ops: list[tuple[relax.Var, relax.Call, int]] = []  # the same ops in the function being rebuilt
        operand = value.args[0]
        for index in indices:
            source = bound_value(operand, builder)
            ops.append((operand, source, index))
            operand = source.args[index]
        inner = bound_value(operand, builder)
        if op_name(inner) != "relax.reshape":  # folded away already, with a fold of its own
            return None
        data = inner.args[0]
        for var, call, index in reversed(ops):
            # Each op keeps its exact name, which reports give (the original binding is dead
            # code, dropped below; `BlockBuilder.emit` would append a counter).
            moved = builder.normalize(_on(call, index, data))
            data = type(var)(var.name, moved.ty)
            builder.emit_normalized(relax.VarBinding(data, moved))
        if static_shape(data.ty) == static_shape(value.ty):
            return data
        return relax.op.reshape(data, value.args[1])

    # A reshape that undid the other is now an alias of the op it read: its readers read that op.
    return _tidy(rebuild_module(mod, replace_binding=rewrite))


def _unit_reshape(call: relax.Expr) -> bool:
    """A reshape that only inserts or removes axes of size 1."""
    if op_name(call) != "relax.reshape" or not (has_static_shape(call.ty) and has_static_shape(call.args[0].ty)):
        return False
    return [d for d in static_shape(call.ty) if d != 1] == [d for d in static_shape(call.args[0].ty) if d != 1]


def _moved_axes(call: relax.Call, axes: list[int | None]) -> list[int | None]:
    """Which axis of the chain's source each axis of `call`'s result is (None: a unit axis),
    given that of its operand: a permute reorders them, a unit reshape keeps the others' order."""
    if op_name(call) == "relax.permute_dims":
        order = range(len(axes))[::-1] if call.attrs.axes is None else [int(a) for a in call.attrs.axes]
        return [axes[a] for a in order]
    shape, kept = static_shape(call.ty), iter(a for a, d in zip(axes, static_shape(call.args[0].ty)) if d != 1)
    return [None if d == 1 else next(kept) for d in shape]


def fold_moves(mod: tvm.IRModule) -> tvm.IRModule:
    """A chain of transposes and reshapes that only add or drop axes of size 1 (attention's keys
    as exporters write them: heads split, `reshape` to three axes, `transpose`, `reshape` back to
    four; Llama's, repeated per head, `reshape` to three axes, `transpose`, `reshape` to four), each
    link read once, is one transpose of the chain's source (the unit axes it adds first, a
    reshape), or nothing. A vendor then sees one move it can read as a view, and no copies.
    Exact."""
    values, readers = _bindings(mod)
    movers = {var for var, value in values.items() if _unit_reshape(value) or op_name(value) == "relax.permute_dims"
              and has_static_shape(value.ty) and has_static_shape(value.args[0].ty)}
    inner = {value.args[0] for value in (values[v] for v in movers) if isinstance(value.args[0], relax.Var)}

    def rewrite(binding: relax.Binding, value: relax.Expr, builder: relax.BlockBuilder) -> relax.Expr | None:
        if binding.var not in movers or (binding.var in inner and readers.get(binding.var, 0) == 1):
            return None  # no move, or a link inside a longer chain
        links = [binding.value]
        while (operand := links[-1].args[0]) in movers and readers.get(operand, 0) == 1:
            links.append(values[operand])
        if len(links) < 2:
            return None
        source_shape = static_shape(links[-1].args[0].ty)
        axes: list[int | None] = list(range(len(source_shape)))
        for link in reversed(links):
            axes = _moved_axes(link, axes)
        added = len(axes) - len(source_shape)  # unit axes the chain adds: put before the source's first
        if added < 0:
            return None
        axes = [None if a is None else a + added for a in axes]
        free = iter(a for a in range(len(axes)) if a not in axes)  # the unit axes, for the result's
        order = [next(free) if a is None else a for a in axes]
        data = value.args[0]  # the same chain in the function being rebuilt
        for _ in links[1:]:
            data = bound_value(data, builder).args[0]
        if added:
            data = builder.emit(relax.op.reshape(data, (1,) * added + tuple(source_shape)))
        return data if order == sorted(order) else relax.op.permute_dims(data, order)

    return _tidy(rebuild_module(mod, replace_binding=rewrite))
