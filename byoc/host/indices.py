"""Index operands checked on the host before an op reads memory with them.

TVM's CPU kernels for take, gather_elements, gather_nd, scatter_nd and scatter_elements read or
write wherever an index points: an embedding lookup with the id equal to the vocabulary size
returned the next row's bytes, 5x that returned NaN, 1e8 crashed the process. Here each such op
whose indices are known only at run time first goes through a small kernel that checks every
index against its axis and counts negatives from the end; the first index out of range calls
back into Python, which raises an `IndexOutOfRangeError` naming the node (the binding's name,
which the frontend gives after the ONNX node), the op, the index and the valid range.

The index operand follows ONNX's rule, [-n, n-1] (see `byoc.frontend.onnx.index_operands`), except
for a take in fast mode, which TVM's converters emit with indices that must be in [0, n-1].

The check is one kernel call where TVM's normalisation (less, add, where) was three: a Gather of
32 ids from a 1000x128 table took 3.5 us per VM call unchecked, 2.4 us checked (measured on 2
shared cores). A Relax assert before each op would have cost a min, a max, comparisons and the
assert: more calls, not fewer.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import tvm
from tvm import relax, te, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from byoc.host.index_ranges import COORDINATES, ONNX_OPS, RAISE, index_axes
from byoc.ir.types import has_static_shape, is_tensor_constant, op_name


@dataclass(frozen=True)
class _Site:
    """One op's index operand: the tensor to check, the axis and size each index (or each
    coordinate slot of the last dimension) addresses, and whether negatives count from the end."""

    indices: relax.Expr
    axes: tuple[int, ...]
    extents: tuple[int, ...]
    per_slot: bool
    negatives: bool


def _dims(expr: relax.Expr) -> tuple[int, ...]:
    return tuple(int(d) for d in expr.ty.shape.values)


def _site(call: relax.Call) -> _Site | None:
    op = op_name(call)
    if op not in ONNX_OPS or (op == "relax.take" and call.attrs.mode not in ("fast", "wrap")):
        return None
    data, indices = call.args[0], call.args[1]
    # Constant indices were checked at import. The indices may have any shape, symbolic
    # included (token ids of any batch and length): the kernel loops over what they hold. The
    # data's shape must be known: it gives each index's range.
    if is_tensor_constant(indices) or not has_static_shape(data.ty) or indices.ty.shape is None:
        return None
    shape = _dims(data)
    if op == "relax.take" and call.attrs.axis is None:  # a take from the flattened tensor
        shape, axes = (math.prod(shape),), (0,)
    else:
        slots = indices.ty.shape.values[-1] if indices.ty.ndim > 0 else None
        if op in COORDINATES and not isinstance(slots, tirx.IntImm):
            return None  # a coordinate's length is a dimension of its own: no fixed set of axes to check
        attrs = {name: getattr(call.attrs, name) for name in ("axis", "batch_dims") if hasattr(call.attrs, name)}
        axes = index_axes(op, attrs, len(shape), [int(slots)] if op in COORDINATES else [])
    negatives = op != "relax.take" or call.attrs.mode == "wrap"
    return _Site(indices, axes, tuple(shape[a] for a in axes), op in COORDINATES, negatives)


def _checked(indices: te.Tensor, site: _Site, node: str, op: str) -> te.Tensor:
    """`indices` with negatives counted from the end; an index out of range calls `RAISE`."""
    dims = list(indices.shape)  # numbers, or a model's dimensions
    signed = not str(indices.dtype).startswith("uint")
    loop_dims = dims[:-1] if site.per_slot else dims

    def ir(source, target):
        with IRBuilder() as ib:
            src, dst = T.buffer_proxy(source), T.buffer_proxy(target)
            with contextlib.ExitStack() as loops:
                # Nested serial loops: index tensors are small, and a thread-pool job would cost
                # more than the checks (see nms.py on TVM's pool after a oneDNN region).
                position = [loops.enter_context(T.serial(0, d)) for d in loop_dims]
                for slot in range(len(site.extents) if site.per_slot else 1):
                    where = (*position, slot) if site.per_slot else tuple(position)
                    size = site.extents[slot]
                    low = -size if site.negatives and signed else 0
                    value = src[where]
                    bad = tirx.Or(value < low, value >= size) if signed else value >= size
                    with T.If(bad):
                        with T.Then():
                            T.evaluate(T.call_packed(RAISE, node, op, T.Cast("int64", value), T.int64(low),
                                                     T.int64(size - 1), site.axes[slot]))
                    dst[where] = T.if_then_else(value < 0, value + size, value) if low < 0 else value
            return ib.get()

    return te.extern([indices.shape], [indices], lambda ins, outs: ir(ins[0], outs[0]), dtype=[indices.dtype],
                     name="checked_indices", tag="checked_indices")


@mutator
class _IndexChecks(PyExprMutator):
    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        call = binding.value
        site = _site(call) if isinstance(call, relax.Call) else None
        if site is None:
            super().visit_var_binding_(binding)
            return
        node, op = binding.var.name, ONNX_OPS[call.op.name]
        kernel = self.builder_.call_te(lambda indices: _checked(indices, site, node, op), self.visit_expr(site.indices),
                                       primfunc_name_hint="checked_indices")
        checked = self.builder_.emit(kernel, f"{node}/indices")
        args = [self.visit_expr(a) for a in call.args]
        args[1] = checked
        attrs = call.attrs
        if call.op.name == "relax.take":  # the indices are in range now: no wrap-around needed
            value = relax.op.take(args[0], checked, attrs.axis, mode="fast")
        else:
            value = relax.Call(call.op, args, attrs)
        self.builder_.emit_normalized(relax.VarBinding(binding.var, self.builder_.normalize(value)))


@tvm.transform.module_pass(opt_level=0, name="CheckIndices")
def check_indices(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Every index operand known only at run time checked before its op (see the module)."""
    for gvar, func in list(mod.functions.items()):
        if not isinstance(func, relax.Function) or (func.attrs is not None and "Codegen" in func.attrs):
            continue
        values = [b.value for block in func.body.blocks for b in block.bindings]
        if not any(_site(v) for v in values if isinstance(v, relax.Call)):
            continue
        checker = _IndexChecks(mod)
        rewritten = checker.visit_expr(func)
        mod = checker.builder_.get()
        mod[gvar] = rewritten
    return mod
