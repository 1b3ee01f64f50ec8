"""Bindings named after the model's own nodes (ONNX node names, a PyTorch module's qualified
names), so that reports and errors name the parts of the model a user knows."""

from __future__ import annotations

from collections.abc import Callable

import tvm
from tvm import relax

from byoc.errors import ModelLoadError
from byoc.frontend.cleanup import cleanup
from byoc.ir.rewrite import rebuild_function


def named_module(convert: Callable[[], tvm.IRModule], node_of_var: dict[int, str], what: str, clean: bool) -> tvm.IRModule:
    """The module `convert()` makes (a conversion error not byoc's own names `what`), its
    bindings named after their nodes, and cleaned up unless `clean` is False."""
    try:
        mod = convert()
    except ModelLoadError:
        raise
    except Exception as error:
        raise ModelLoadError(f"cannot convert {what}: {error}") from error
    mod["main"] = name_helper_bindings(mod["main"], node_of_var)
    return cleanup(mod) if clean else mod


def name_helper_bindings(func: relax.Function, node_of_var: dict[int, str]) -> relax.Function:
    """Name every binding after the node whose conversion made it: a node's result is
    known, and the helper bindings made while converting it come right before it."""
    names: dict[int, str] = {}
    pending: list[int] = []
    for block in func.body.blocks:
        for binding in block.bindings:
            var_id = binding.var.id_
            pending.append(var_id)
            if isinstance(binding.value, relax.Var) and binding.value.id_ in node_of_var:
                # A graph output is an alias (`gv`) of its node's result, and clean-up keeps the
                # alias's variable: it takes the node's name, or reports and errors say "gv".
                node_of_var[var_id] = node_of_var[binding.value.id_]
            if var_id in node_of_var:
                for helper_id in pending:
                    names[helper_id] = node_of_var[var_id]
                pending.clear()
    return rebuild_function(func, name_of=lambda var: names.get(var.id_))
