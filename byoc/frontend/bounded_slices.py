"""Shape arithmetic simplified by the ranges of a model's dimensions.

PyTorch clamps a slice's end to the tensor's extent, so TVM's PyTorch frontend writes
`position_ids[:, :sequence]` as a strided slice that may run out of bounds, whose length is
`min(sequence, 512)`, and reshapes to that length after it. That length matches no other
dimension, and every op after it loses its shape (`R.Tensor(ndim=3)`): nothing after it could
be offloaded or compiled. With the ranges declared for the dimensions (`dims=`):

- a slice whose every end they prove within the extent is marked in bounds
  (`assume_inbound`), which is then exact: its length is `sequence`;
- the sizes an op is given (a reshape's target shape) are simplified: `min(sequence, 512)` is
  `sequence` for `sequence` up to 512.

The shapes downstream are then known again.
"""

from __future__ import annotations

from collections.abc import Mapping

import tvm
from tvm import relax

from byoc.ir.dims import DimRange, symbolic_vars
from byoc.ir.rewrite import rebuild_function
from byoc.ir.types import op_name


def _analyzer(func: relax.Function, ranges: Mapping[str, DimRange]) -> tvm.sym.Analyzer:
    analyzer = tvm.sym.Analyzer()
    for param in func.params:
        for name, var in symbolic_vars(param.ty).items():
            if name in ranges:
                analyzer.bind(var, tvm.ir.Range(ranges[name].low, ranges[name].high + 1))
    return analyzer


def _in_bounds(call: relax.Call, analyzer: tvm.sym.Analyzer) -> relax.Expr | None:
    if op_name(call) != "relax.strided_slice" or call.attrs.assume_inbound or len(call.args) < 5:
        return None
    data, axes, begins, ends, strides = call.args[:5]
    shape = getattr(data.ty, "shape", None)
    if not isinstance(shape, relax.ShapeExpr) or not all(isinstance(t, relax.Tuple) for t in (axes, begins, ends, strides)):
        return None
    axes_list = [int(a.value) if hasattr(a, "value") else int(a) for a in axes.fields]
    for axis, begin, end, stride in zip(axes_list, begins.fields, ends.fields, strides.fields):
        extent = shape.values[axis]
        if not (isinstance(stride, tvm.ir.prim.expr.IntImm) and int(stride) == 1):
            return None
        if not (analyzer.can_prove(0 <= begin) and analyzer.can_prove(begin <= end) and analyzer.can_prove(end <= extent)):
            return None
    return relax.op.strided_slice(data, axes_list, list(begins.fields), list(ends.fields), list(strides.fields),
                                  assume_inbound=True)


def _simplified(arg: relax.Expr, analyzer: tvm.sym.Analyzer) -> relax.Expr:
    if isinstance(arg, relax.ShapeExpr):
        return relax.ShapeExpr([analyzer.simplify(d) for d in arg.values])
    if isinstance(arg, relax.Tuple):
        return relax.Tuple([_simplified(f, analyzer) for f in arg.fields])
    if tvm.ir.is_prim_expr(arg) and not isinstance(arg, relax.Var):
        return analyzer.simplify(arg)
    return arg


def _rewritten(call: relax.Call, analyzer: tvm.sym.Analyzer) -> relax.Expr | None:
    args = [_simplified(arg, analyzer) for arg in call.args]
    changed = any(not new.same_as(old) and str(new) != str(old) for new, old in zip(args, call.args))
    call = relax.Call(call.op, args, call.attrs, call.ty_args) if changed else call
    sliced = _in_bounds(call, analyzer)
    return sliced if sliced is not None else (call if changed else None)


def bound_slices(mod: tvm.IRModule, ranges: Mapping[str, DimRange]) -> tvm.IRModule:
    """`mod` with its shape arithmetic simplified by its dimensions' ranges (see above)."""
    if not ranges:
        return mod
    main = mod["main"]
    analyzer = _analyzer(main, ranges)
    rewritten = rebuild_function(main, replace_value=lambda value, builder: _rewritten(value, analyzer)
                                 if isinstance(value, relax.Call) else None)
    mod = mod.clone() if hasattr(mod, "clone") else mod
    mod["main"] = rewritten
    return mod
