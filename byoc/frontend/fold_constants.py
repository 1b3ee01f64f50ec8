"""Constant folding of layout and arithmetic ops in numpy.

TVM's FoldConstant compiles and runs a kernel for every foldable expression with a new shape:
2 s for the bias reshapes of a small MobileNetV2 on this machine. The ops ONNX importers leave
on constants (bias reshapes, Gemm weight transposes, scalar arithmetic, position ids' aranges)
are folded here in numpy first; FoldConstant then only sees what is left. So are the dequantizes of a quantized
model's int32 biases (its int8 weights stay int8, see byoc.frontend.quantized): FoldConstant
compiled a kernel for each, 5 s for a quantized MobileNetV2. And so are a batch norm's constants
as TVM decomposes it (its statistics expanded to the channel axis, sqrt(variance + epsilon)),
where the norm cannot be folded into the weights before it: 312 kernels, 9 s, for a
MobileNetV2 from `quantize_dynamic`, whose weights stay int8.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from byoc.ir.quantization import dequantize_array
from byoc.ir.rewrite import bound_value, rebuild_module
from byoc.ir.types import constant_array, is_tensor_constant

_BINARY = {
    "relax.add": np.add,
    "relax.subtract": np.subtract,
    "relax.multiply": np.multiply,
    "relax.divide": np.divide,
}


def dequantized_values(call: relax.Call) -> np.ndarray:
    """The values of a dequantize of constants: (data - zero point) * scale along its axis."""
    data, scale, zero = (constant_array(a) for a in call.args)
    return dequantize_array(data, scale, zero, int(call.attrs.axis)).astype(str(call.attrs.out_dtype) or "float32")


def _fold(call: relax.Expr, builder: relax.BlockBuilder) -> relax.Expr | None:
    if not isinstance(call, relax.Call) or not isinstance(call.op, tvm.ir.Op):
        return None
    name = call.op.name
    if name == "relax.arange":  # TVM's FoldConstant leaves it: its operands are numbers, not tensors
        return _arange(call)
    # an operand folded earlier is a variable bound to a constant
    args = [bound if is_tensor_constant(bound := bound_value(a, builder)) else a for a in call.args]
    if not args or not is_tensor_constant(args[0]):
        return None
    data = constant_array(args[0])
    if name == "relax.reshape" and isinstance(args[1], relax.ShapeExpr) and \
            all(isinstance(d, tvm.ir.prim.expr.IntImm) for d in args[1].values):
        result = data.reshape([int(d) for d in args[1].values])
    elif name == "relax.permute_dims":
        axes = call.attrs.axes
        result = np.transpose(data, None if axes is None else [int(a) for a in axes])
    elif name == "relax.dequantize" and all(is_tensor_constant(a) for a in args):
        result = dequantized_values(relax.Call(call.op, args, call.attrs))
    elif name == "relax.expand_dims":  # axes count in the result, negative ones from its end
        rank = data.ndim + len(call.attrs.axis)
        result = np.expand_dims(data, tuple(sorted(int(a) % rank for a in call.attrs.axis)))
    elif name == "relax.sqrt" and data.dtype.kind == "f":  # correctly rounded in numpy as in TVM
        result = np.sqrt(data)
    elif name in _BINARY and len(args) == 2 and is_tensor_constant(args[1]):
        result = _BINARY[name](data, constant_array(args[1]))
        result = result.astype(np.result_type(data.dtype, constant_array(args[1]).dtype), copy=False)
    else:
        return None
    return relax.const(np.require(result, requirements="C"), str(data.dtype) if result.dtype == data.dtype else str(result.dtype))


def _arange(call: relax.Call) -> relax.Expr | None:
    if not all(isinstance(a, (tvm.ir.prim.expr.IntImm, tvm.ir.prim.expr.FloatImm)) for a in call.args):
        return None  # a bound from a dimension (`arange(sequence)`)
    start, end, step = (a.value for a in call.args)
    dtype = str(call.attrs.dtype)
    return relax.const(np.arange(start, end, step).astype(dtype), dtype)


def fold_constants_numpy(mod: tvm.IRModule) -> tvm.IRModule:
    return rebuild_module(mod, _fold)
