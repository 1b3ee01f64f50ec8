"""Undoing offload: inlining region functions back into the host function.

Used when a region's code generation fails and the build falls back to the host for it.
"""

from __future__ import annotations

from collections.abc import Iterable

import tvm
from tvm import relax

from byoc.ir.rewrite import VarSubstitution, rebuild_function


def _emit_body(func: relax.Function, args: list[relax.Expr], builder: relax.BlockBuilder) -> relax.Expr:
    """Emit `func`'s bindings with its parameters bound to `args`; local functions (composites)
    are inlined where they are called."""
    substitution = VarSubstitution()
    for param, arg in zip(func.params, args):
        substitution.bind_argument(param, arg, builder)
    local_functions: dict[int, relax.Function] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Function):
                local_functions[binding.var.id_] = value
                continue
            if isinstance(value, relax.Call) and isinstance(value.op, relax.Var) and value.op.id_ in local_functions:
                args_here = [substitution.substitute(a) for a in value.args]
                result = _emit_body(local_functions[value.op.id_], args_here, builder)
            else:
                result = substitution.substitute(value)
            substitution.bind(binding.var, builder.emit(builder.normalize(result), binding.var.name))
    return substitution.substitute(func.body.body)


def inline_regions(mod: tvm.IRModule, symbols: Iterable[str]) -> tvm.IRModule:
    """`mod` with the named region functions inlined into `main` and removed."""
    symbols = set(symbols)
    regions = {gv.name_hint: f for gv, f in mod.functions.items() if gv.name_hint in symbols}

    def expand(value: relax.Expr, builder: relax.BlockBuilder) -> relax.Expr | None:
        if isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar) and value.op.name_hint in regions:
            return _emit_body(regions[value.op.name_hint], list(value.args), builder)
        return None

    main = rebuild_function(mod["main"], replace_value=expand)
    kept = {gv: f for gv, f in mod.functions.items() if gv.name_hint not in symbols and gv.name_hint != "main"}
    result = tvm.IRModule(kept, attrs=mod.attrs)
    result["main"] = main
    return result
