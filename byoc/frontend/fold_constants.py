"""Constant folding of layout and arithmetic ops in numpy.

TVM's FoldConstant compiles and runs a kernel for every foldable expression with a new shape:
2 s for the bias reshapes of a small MobileNetV2 on this machine. The ops ONNX importers leave
on constants (bias reshapes, Gemm weight transposes, scalar arithmetic) are folded here in
numpy first; FoldConstant then only sees what is left.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from byoc.ir.rewrite import rebuild_function
from byoc.ir.types import constant_array, is_tensor_constant

_BINARY = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
}


def _fold(call: relax.Expr, _builder: relax.BlockBuilder) -> relax.Expr | None:
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return None
    name = call.op.name
    args = list(call.args)
    if not args or not is_tensor_constant(args[0]):
        return None
    data = constant_array(args[0])
    if name == "relax.reshape" and isinstance(args[1], relax.ShapeExpr):
        result = data.reshape([int(d) for d in args[1].values])
    elif name == "relax.permute_dims":
        axes = call.attrs.axes
        result = np.transpose(data, None if axes is None else [int(a) for a in axes])
    elif name in _BINARY and len(args) == 2 and is_tensor_constant(args[1]):
        result = _BINARY[name](data, constant_array(args[1]))
        result = result.astype(np.result_type(data.dtype, constant_array(args[1]).dtype), copy=False)
    else:
        return None
    return relax.const(np.require(result, requirements="C"), str(data.dtype) if result.dtype == data.dtype else str(result.dtype))


def fold_constants_numpy(mod: tvm.IRModule) -> tvm.IRModule:
    mod = mod.clone() if hasattr(mod, "clone") else mod
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gvar] = rebuild_function(func, replace_value=_fold)
    return mod
