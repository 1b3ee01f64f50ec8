"""Constant folding of layout and arithmetic ops in numpy.

TVM's FoldConstant compiles and runs a kernel for every foldable expression with a new shape:
2 s for the bias reshapes of a small MobileNetV2 on this machine. The ops ONNX importers leave
on constants (bias reshapes, Gemm weight transposes, scalar arithmetic, position ids' aranges)
are folded here in numpy first; FoldConstant then only sees what is left. So are the dequantizes of a quantized
model's int32 biases (its int8 weights stay int8, see byoc.frontend.int8_weights): FoldConstant
compiled a kernel for each, 5 s for a quantized MobileNetV2. And so are a batch norm's constants
as TVM decomposes it (its statistics expanded to the channel axis, sqrt(variance + epsilon)),
where the norm cannot be folded into the weights before it: 312 kernels, 9 s, for a
MobileNetV2 from `quantize_dynamic`, whose weights stay int8.

FoldConstant also legalizes every call it visits, to a TE compute, before it finds out that the
call's operands are not constant: 0.3 s for the convolutions, quantizes and dequantizes of a
quantized MobileNetV2, which fold nothing. `fold_constants_tvm` hands it the constant part of
the function alone.
"""

from __future__ import annotations

from collections.abc import Container

import numpy as np
import tvm
from tvm import relax

from byoc.ir.quantization import dequantize_array
from byoc.ir.rewrite import VarSubstitution, bound_value, rebuild_function, rebuild_module
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


def _is_constant(expr: relax.Expr, constant: Container[relax.Var]) -> bool:
    """Whether `expr` is computed from constants alone (`constant`: variables bound to such)."""
    if isinstance(expr, (tvm.ir.Constant, tvm.ir.StringImm)):  # tensors and numbers (IntImm, FloatImm)
        return True
    if isinstance(expr, relax.ShapeExpr):  # a symbolic dimension is known at run time only
        return all(isinstance(d, tvm.ir.prim.expr.IntImm) for d in expr.values)
    if isinstance(expr, relax.Var):
        return expr in constant
    if isinstance(expr, relax.Tuple):
        return all(_is_constant(f, constant) for f in expr.fields)
    if isinstance(expr, relax.TupleGetItem):
        return _is_constant(expr.tuple_value, constant)
    if isinstance(expr, relax.Call):
        return isinstance(expr.op, tvm.ir.Op) and all(_is_constant(a, constant) for a in expr.args)
    return False


def fold_constants_tvm(mod: tvm.IRModule) -> tvm.IRModule:
    """TVM's FoldConstant on what `main` computes from constants alone, for what numpy leaves.

    Those bindings are copied into a function of their own, which FoldConstant folds; `main`'s
    bindings whose copy became a constant are replaced by it."""
    main = mod["main"]
    constant: dict[relax.Var, relax.Expr] = {}
    for block in main.body.blocks:
        for binding in block.bindings:
            if isinstance(binding, relax.VarBinding) and _is_constant(binding.value, constant):
                constant[binding.var] = binding.value
    if not any(isinstance(v, relax.Call) for v in constant.values()):
        return mod
    builder, substitution = relax.BlockBuilder(), VarSubstitution()
    with builder.function("constants", params=[]):
        with builder.dataflow():  # FoldConstant folds inside dataflow blocks only
            copies = []
            for var, value in constant.items():
                copies.append(builder.emit(substitution.substitute(value)))
                substitution.bind(var, copies[-1])
            output = builder.emit_output(relax.Tuple(copies))
        builder.emit_func_output(output)
    folded = relax.transform.FoldConstant()(builder.get())["constants"]
    values = {b.var: b.value for block in folded.body.blocks for b in block.bindings}

    def resolved(expr: relax.Expr) -> relax.Expr:
        return values.get(expr, expr) if isinstance(expr, relax.Var) else expr

    results = {var: result for var, field in zip(constant, resolved(folded.body.body).fields)
               if is_tensor_constant(result := resolved(field)) and not is_tensor_constant(constant[var])}
    if not results:
        return mod
    mod = mod.clone() if hasattr(mod, "clone") else mod
    mod["main"] = rebuild_function(main, replace_binding=lambda binding, _value, _builder: results.get(binding.var))
    return mod
