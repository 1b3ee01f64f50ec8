"""Rebuilding a Relax function binding by binding.

TVM's expression mutator remaps variable uses but not their definitions, and Relax variable
names cannot be changed in place, so renaming or replacing values means re-emitting every
binding through a BlockBuilder while the mutator substitutes the new variables into later uses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator


@mutator
class VarSubstitution(PyExprMutator):
    """Substitutes variables in expressions; the traversal itself runs in C++."""

    def __init__(self) -> None:
        super().__init__()

    def substitute(self, expr: relax.Expr) -> relax.Expr:
        return self.visit_expr(expr)

    def bind(self, old: relax.Var, new: relax.Var) -> None:
        self.set_var_remap(old, new)

    def bind_argument(self, param: relax.Var, arg: relax.Expr, builder: relax.BlockBuilder) -> None:
        """Bind a function parameter to a call argument; an argument that is not a variable (a
        constant) is bound to one first, as the remapping only maps variables to variables."""
        self.set_var_remap(param, arg if isinstance(arg, relax.Var) else builder.emit(arg, param.name))


NameRule = Callable[[relax.Var], "str | None"]
# A value rule may emit bindings of its own through the builder before returning the value.
ValueRule = Callable[[relax.Expr, relax.BlockBuilder], "relax.Expr | None"]
BindingRule = Callable[[relax.Binding, relax.Expr, relax.BlockBuilder], "relax.Expr | None"]


def rebuild_function(
    func: relax.Function,
    name_of: NameRule | None = None,
    replace_value: ValueRule | None = None,
    replace_binding: BindingRule | None = None,
) -> relax.Function:
    """A copy of `func` with bound variables renamed by `name_of` and bound values (after
    substitution of earlier changes) replaced by `replace_value`, or by `replace_binding`, which
    is also told which binding of `func` the value is; None keeps what was there."""
    substitution = VarSubstitution()
    builder = relax.BlockBuilder()
    attrs = dict(func.attrs) if func.attrs else None
    with builder.function("main", params=list(func.params), attrs=attrs, pure=func.is_pure):
        for block in func.body.blocks:
            is_dataflow = isinstance(block, relax.DataflowBlock)
            with builder.dataflow() if is_dataflow else contextlib.nullcontext():
                for binding in block.bindings:
                    value = substitution.substitute(binding.value)
                    replacement = replace_value(value, builder) if replace_value is not None else None
                    if replacement is None and replace_binding is not None:
                        replacement = replace_binding(binding, value, builder)
                    if replacement is not None:
                        value = replacement
                    name = (name_of(binding.var) if name_of else None) or binding.var.name
                    if value.same_as(binding.value) and name == binding.var.name:
                        # Nothing changed: the binding is kept as it is, and so are its readers,
                        # which then need no new types (normalizing a call costs 0.1 ms).
                        builder.emit_normalized(binding)
                        continue
                    value = builder.normalize(value)
                    # Emitting a pre-made variable keeps the name exact: BlockBuilder.emit would
                    # append a counter to every repeated name.
                    var_type = type(binding.var)
                    if isinstance(binding, relax.MatchCast):
                        new_var = var_type(name, binding.ty)
                        builder.emit_normalized(relax.MatchCast(new_var, value, binding.ty))
                    else:
                        new_var = var_type(name, value.ty)
                        builder.emit_normalized(relax.VarBinding(new_var, value))
                    substitution.bind(binding.var, new_var)
        builder.emit_func_output(substitution.substitute(func.body.body))
    return builder.get()["main"]


def rebuild_module(mod: tvm.IRModule, replace_value: ValueRule | None = None, replace_binding: BindingRule | None = None) -> tvm.IRModule:
    """A copy of `mod` with every Relax function rebuilt by `rebuild_function` with
    `replace_value` or `replace_binding`."""
    mod = mod.clone() if hasattr(mod, "clone") else mod
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gvar] = rebuild_function(func, replace_value=replace_value, replace_binding=replace_binding)
    return mod


def bound_value(expr: relax.Expr, builder: relax.BlockBuilder) -> relax.Expr:
    """In a value rule, what variable `expr` was bound to in the function being rebuilt; `expr`
    itself for anything else (a constant, a parameter, a variable of an earlier block)."""
    if isinstance(expr, relax.Var):
        try:
            value = builder.lookup_binding(expr)
        except Exception:  # TVM raises where the variable has no binding in the builder's scope
            value = None
        return value if value is not None else expr
    return expr
