"""The host's values of the shape alone hoisted out of `main` at build (see
byoc.runtime_metadata.shape_values, which answers their call at run time)."""

from __future__ import annotations

import tvm
from tvm import relax

from byoc.ir.rewrite import VarSubstitution, rebuild_function
from byoc.ir.shape_only import dimension_vars, shape_only_bindings
from byoc.partition.dataflow import used_vars
from byoc.runtime_metadata.shape_values import SHAPE_VALUES, SHAPE_VALUES_FUNCTION


def hoist_shape_values(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` with `main`'s shape-only values computed by `byoc_shape_values` (see above); `mod`
    itself where there are none or the model has no dimensions."""
    main = mod["main"]
    dims, bindings, boundary = _hoisted(main)
    if not boundary:
        return mod
    values = _values_function(bindings, boundary, dims)
    position = {var.id_: index for index, var in enumerate(boundary)}
    state: dict[str, relax.Var] = {}

    def replace(binding: relax.Binding, value: relax.Expr, builder: relax.BlockBuilder) -> relax.Expr | None:
        if binding.var.id_ not in position:
            return None
        if "cached" not in state:
            state["cached"] = builder.emit(relax.call_pure_packed(SHAPE_VALUES, relax.ShapeExpr(dims),
                                                                  ty_args=[values.ret_ty]), "shape_values")
        return relax.TupleGetItem(state["cached"], position[binding.var.id_])

    rewritten = rebuild_function(main, replace_binding=replace)
    result = mod.clone() if hasattr(mod, "clone") else mod
    result["main"] = rewritten
    result[SHAPE_VALUES_FUNCTION] = values
    return relax.transform.DeadCodeElimination(["main", SHAPE_VALUES_FUNCTION])(result)


def _hoisted(main: relax.Function) -> tuple[list, list[relax.VarBinding], list[relax.Var]]:
    """The model's dimensions, `main`'s shape-only bindings and the values of them the rest of
    `main` reads (what `byoc_shape_values` returns, in order); no values where nothing is
    computed."""
    dims = dimension_vars(main)
    bindings = shape_only_bindings(main, {d.name for d in dims})
    if not dims or not any(isinstance(b.value, relax.Call) for b in bindings):
        return dims, bindings, []
    hoisted = {b.var.id_ for b in bindings}
    used_outside = _used_outside(main, hoisted)
    return dims, bindings, [b.var for b in bindings if b.var.id_ in used_outside and isinstance(b.var.ty, relax.TensorType)]


def shape_value_positions(main: relax.Function) -> tuple[tuple[str, ...], set[int], dict[int, int]]:
    """For a model's `main` before hoisting: the dimensions `byoc_shape_values` is called
    with, in order, the variables (by id) it computes, and the position among its results of
    each value the rest of `main` reads."""
    dims, bindings, boundary = _hoisted(main)
    if not boundary:
        return (), set(), {}
    return tuple(d.name for d in dims), {b.var.id_ for b in bindings}, {var.id_: index for index, var in enumerate(boundary)}


def _used_outside(main: relax.Function, hoisted: set[int]) -> set[int]:
    used: set[int] = set()
    for block in main.body.blocks:
        for binding in block.bindings:
            if binding.var.id_ not in hoisted:
                used |= {v.id_ for v in used_vars(binding.value)}
    used |= {v.id_ for v in used_vars(main.body.body)}
    return used & hoisted


def _values_function(bindings: list[relax.VarBinding], boundary: list[relax.Var], dims: list) -> relax.Function:
    param = relax.Var("dims", relax.ShapeType(dims))
    builder = relax.BlockBuilder()
    substitution = VarSubstitution()
    with builder.function(SHAPE_VALUES_FUNCTION, params=[param], pure=True):
        with builder.dataflow():
            for binding in bindings:
                var = builder.emit(substitution.substitute(binding.value), binding.var.name)
                substitution.bind(binding.var, var)
            result = builder.emit_output(relax.Tuple([substitution.substitute(v) for v in boundary]))
        builder.emit_func_output(result)
    return builder.get()[SHAPE_VALUES_FUNCTION]
