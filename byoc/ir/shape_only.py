"""Values of a model that depend on its shape alone: the bindings of `main` that read nothing
but constants and the model's named dimensions (position ids, masks built from arange, T5's
relative position bias). A static compile folds them into constants; with dynamic dimensions
partitioning keeps them on the host and the host computes them once per shape (see
byoc.runtime_metadata.shape_values).
"""

from __future__ import annotations

import tvm
from tvm import relax

from byoc.ir.dims import defined_dimensions
from byoc.ir.types import is_tensor_constant, op_name

# Ops that call out (regions, kernels) or allocate: never computed ahead.
_CALLS = ("relax.call_dps_packed", "relax.call_tir", "relax.call_packed", "relax.call_pure_packed", "relax.call_inplace_packed")


def dimension_vars(main: relax.Function) -> list:
    """The model's dimensions as `main`'s parameters define them (each a plain variable)."""
    found = defined_dimensions(param.ty for param in main.params)
    return [found[name] for name in sorted(found)]


def _static_arg(arg: relax.Expr, hoisted: set[int], dims: set[str]) -> bool:
    """An argument known from constants and dimensions alone (in TVM 0.27 a dimension and a
    Relax variable are one Python type)."""
    if isinstance(arg, relax.Var):
        return arg.id_ in hoisted or (isinstance(arg.ty, tvm.ir.PrimType) and arg.name in dims)
    if isinstance(arg, relax.Tuple):
        return all(_static_arg(field, hoisted, dims) for field in arg.fields)
    return is_tensor_constant(arg) or isinstance(arg, relax.ShapeExpr) or tvm.ir.is_prim_expr(arg) \
        or isinstance(arg, (tvm.ir.expr.StringImm, relax.DataTypeImm))


def shape_only_bindings(main: relax.Function, dims: set[str]) -> list[relax.VarBinding]:
    """`main`'s bindings that read nothing but constants and dimensions, in order."""
    hoisted: set[int] = set()
    found = []
    for block in main.body.blocks:
        if not isinstance(block, relax.DataflowBlock):
            continue
        for binding in block.bindings:
            value = binding.value
            if not isinstance(binding, relax.VarBinding) or not isinstance(binding.var.ty, (relax.TensorType, relax.TupleType)):
                continue
            if isinstance(value, relax.Call):
                ok = isinstance(value.op, tvm.ir.Op) and op_name(value) not in _CALLS and all(_static_arg(a, hoisted, dims) for a in value.args)
            elif isinstance(value, relax.TupleGetItem):
                ok = isinstance(value.tuple_value, relax.Var) and value.tuple_value.id_ in hoisted
            else:
                ok = False
            if ok:
                hoisted.add(binding.var.id_)
                found.append(binding)
    return found


def shape_only_calls(main: relax.Function) -> frozenset[int]:
    """The variables (by id) of `main`'s op calls that read only constants and the model's
    dimensions (none for a model with static shapes)."""
    dims = dimension_vars(main)
    if not dims:
        return frozenset()
    bindings = shape_only_bindings(main, {d.name for d in dims})
    return frozenset(b.var.id_ for b in bindings if isinstance(b.value, relax.Call))
