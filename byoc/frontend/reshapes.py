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
from byoc.ir.types import constant_array, has_static_shape, is_tensor_constant, op_name, shape_dims, static_shape

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


def _unit(dim) -> bool:
    return isinstance(dim, tvm.ir.prim.expr.IntImm) and int(dim) == 1


def _is_move(value: relax.Expr) -> bool:
    return op_name(value) in ("relax.permute_dims", "relax.reshape") and shape_dims(value.ty) is not None \
        and shape_dims(value.args[0].ty) is not None


_Groups = list[tuple[int, ...]]  # per axis, the source's axes (of size other than 1) it holds, in order


def _moved(call: relax.Call, groups: _Groups, sizes: dict[int, object], analyzer) -> _Groups | None:
    """The source axes each axis of `call`'s result holds, given its operand's: a transpose
    reorders the axes; a reshape groups the source axes in their order in memory anew, each
    dimension the product of the axes it holds (None where it splits one: no move of the source's
    axes)."""
    if op_name(call) == "relax.permute_dims":
        order = range(len(groups))[::-1] if call.attrs.axes is None else [int(a) for a in call.attrs.axes]
        return [groups[a] for a in order]
    atoms = [a for group in groups for a in group]
    result, taken = [], 0
    for dim in shape_dims(call.ty):
        group: list[int] = []
        product = tvm.tirx.IntImm("int64", 1)
        while not (_unit(dim) and not group or group and analyzer.can_prove_equal(product, dim)):
            if taken == len(atoms):
                return None
            group.append(atoms[taken])
            product = product * sizes[atoms[taken]]
            taken += 1
        result.append(tuple(group))
    return result if taken == len(atoms) else None


def _as_one_move(links: list[relax.Call]) -> tuple[list | None, list[int]] | None:
    """A chain of moves (last link first) as one: the shape to reshape the chain's source to
    first (None: none; it only merges axes next to each other, or adds unit axes before them,
    a view) and the transpose after it. None where the chain is no transpose of its source's
    axes so merged (it splits one, or merges axes it first moved apart)."""
    source = shape_dims(links[-1].args[0].ty)
    sizes = {a: d for a, d in enumerate(source) if not _unit(d)}
    groups: _Groups | None = [(a,) if a in sizes else () for a in range(len(source))]
    analyzer = tvm.sym.Analyzer()
    for link in reversed(links):
        groups = _moved(link, groups, sizes, analyzer)
        if groups is None:
            return None
    if any(list(g) != list(range(g[0], g[0] + len(g))) for g in groups if g):
        return None
    result = shape_dims(links[0].ty)
    units = [axis for axis, g in enumerate(groups) if not g]
    merged = sorted((axis for axis, g in enumerate(groups) if g), key=lambda axis: groups[axis][0])
    shape = [tvm.tirx.IntImm("int64", 1)] * len(units) + [result[axis] for axis in merged]
    order = [units.index(axis) if not groups[axis] else len(units) + merged.index(axis) for axis in range(len(groups))]
    same = [str(d) for d in shape] == [str(d) for d in source]
    return (None if same else shape), order


def fold_moves(mod: tvm.IRModule) -> tvm.IRModule:
    """A chain of transposes and reshapes, each link read once, that only moves its source's axes
    is one transpose of the source, or nothing: attention's keys as exporters write them (heads
    split, `reshape` to three axes merging batch and heads, `transpose`, `reshape` back to four),
    Llama's repeated per head. The reshapes may merge and split axes, of static or symbolic size
    (an export with dynamic batch writes `batch * heads`), as long as the chain's result holds
    each axis of its source whole: where it holds axes next to each other merged, or adds unit
    axes, the source is reshaped to that first (a view). A chain that is no such move is folded
    from the first link on where it is. A vendor then sees one move it can read as a view, and no
    copies. Exact."""
    values, readers = _bindings(mod)
    movers = {var for var, value in values.items() if _is_move(value)}
    inner = {value.args[0] for value in (values[v] for v in movers) if isinstance(value.args[0], relax.Var)}

    def rewrite(binding: relax.Binding, value: relax.Expr, builder: relax.BlockBuilder) -> relax.Expr | None:
        if binding.var not in movers or (binding.var in inner and readers.get(binding.var, 0) == 1):
            return None  # no move, or a link inside a longer chain
        links = [binding.value]
        while (operand := links[-1].args[0]) in movers and readers.get(operand, 0) == 1:
            links.append(values[operand])
        while len(links) >= 2 and (plan := _as_one_move(links)) is None:
            links.pop()
        if len(links) < 2:
            return None
        shape, order = plan
        if (shape is not None) + (order != sorted(order)) >= len(links):
            return None  # no fewer moves than written
        data = value.args[0]  # the same chain in the function being rebuilt
        for _ in links[1:]:
            data = bound_value(data, builder).args[0]
        if shape is not None:
            data = builder.emit(relax.op.reshape(data, shape))
        return data if order == sorted(order) else relax.op.permute_dims(data, order)

    return _tidy(rebuild_module(mod, replace_binding=rewrite))
