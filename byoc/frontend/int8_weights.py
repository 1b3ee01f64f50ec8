"""A quantized model's int8 weights, kept int8 from import to the vendor that computes in int8.

A QDQ model (onnxruntime's `quantize_static`, say) stores each weight as int8 data read through a
DequantizeLinear. Constant folding would turn every such dequantize into an fp32 constant: the
vendor would lose the scales the user chose, and the weights would grow back to four times
their size (46.7 MB for ResNet-18) while TVM compiled a folding kernel for each (25-30 s for
MobileNetV2 instead of 2). So clean-up folds everything but these dequantizes (`keep_weights`),
and a backend that takes no quantized op gets them folded at partitioning
(`fold_weight_dequantize`), exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax

from byoc.frontend.fold_constants import dequantized_values, fold_constants_numpy
from byoc.frontend.reshapes import fold_reshapes
from byoc.ir.quantization import INT8_MOVES
from byoc.ir.rewrite import bound_value, rebuild_function, rebuild_module
from byoc.ir.types import calls_op, constant_array, dtype_name, is_tensor_constant, op_name, same_shape

WEIGHT_DTYPES = ("int8", "uint8")
# Ops whose second operand an int8 kernel takes as int8 weights.
_WEIGHT_READERS = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.matmul")


def has_quantize_ops(mod: tvm.IRModule) -> bool:
    """Whether the model's main function quantizes or dequantizes (else every pass here is a no-op)."""
    return calls_op(mod["main"], "relax.quantize", "relax.dequantize")


def is_weight_dequantize(expr: relax.Expr) -> bool:
    """A dequantize of constant int8/uint8 data with constant scale and zero point: a weight."""
    return (op_name(expr) == "relax.dequantize" and all(is_tensor_constant(a) for a in expr.args)
            and dtype_name(expr.args[0].ty) in WEIGHT_DTYPES)


def _transposed_weight(value: relax.Expr, builder: relax.BlockBuilder) -> relax.Expr | None:
    """permute_dims of a weight dequantize (Gemm's transposed B): the dequantize of the
    transposed int8 data, its per-channel axis moved with it, so that the weight stays int8."""
    if op_name(value) != "relax.permute_dims":
        return None
    source = bound_value(value.args[0], builder)
    if not is_weight_dequantize(source):
        return None
    data, scale, zero = source.args
    array = constant_array(data)
    axes = list(range(array.ndim))[::-1] if value.attrs.axes is None else [int(a) for a in value.attrs.axes]
    axis = axes.index(int(source.attrs.axis) % max(1, array.ndim))
    transposed = relax.const(np.ascontiguousarray(np.transpose(array, axes)), dtype_name(data.ty))
    return relax.op.dequantize(transposed, scale, zero, axis=axis, out_dtype=str(source.attrs.out_dtype))


def keep_weights(passes: Callable[[tvm.IRModule], tvm.IRModule]) -> Callable[[tvm.IRModule], tvm.IRModule]:
    """`passes` (constant folding among them) with weight dequantizes left as they are.

    TVM's FoldConstant folds every call whose operands are all constant, and takes no list of
    ops to spare. Each weight's int8 data is handed to `passes` as a function parameter, so
    that its dequantize has an operand that is not constant, and bound back afterwards."""

    def run(mod: tvm.IRModule) -> tvm.IRModule:
        if not has_quantize_ops(mod):
            return passes(mod)
        mod = rebuild_module(mod, _transposed_weight)
        hidden: dict[str, np.ndarray] = {}
        params: list[relax.Var] = []

        def hide(value: relax.Expr, _builder: relax.BlockBuilder) -> relax.Expr | None:
            if not is_weight_dequantize(value):
                return None
            data = value.args[0]
            param = relax.Var(f"byoc_int8_weight_{len(hidden)}", data.ty)
            hidden[param.name] = constant_array(data)
            params.append(param)
            return relax.op.dequantize(param, *value.args[1:], axis=int(value.attrs.axis), out_dtype=str(value.attrs.out_dtype))

        main = rebuild_function(mod["main"], replace_value=hide)
        if not hidden:
            return passes(mod)
        mod["main"] = relax.Function([*main.params, *params], main.body, main.ret_ty, main.is_pure, main.attrs)
        mod = passes(mod)
        return relax.transform.BindParams("main", hidden)(mod)

    return run


def fold_weight_dequantize(mod: tvm.IRModule) -> tvm.IRModule:
    """Every weight dequantize replaced by its float32 values: what a backend that takes no
    quantized op partitions."""

    def fold(value: relax.Expr, _builder: relax.BlockBuilder) -> relax.Expr | None:
        return relax.const(dequantized_values(value)) if is_weight_dequantize(value) else None

    if not any(is_weight_dequantize(b.value) for block in mod["main"].body.blocks for b in block.bindings):
        return mod
    return relax.transform.CanonicalizeBindings()(fold_constants_numpy(rebuild_module(mod, fold)))


def fold_float_weights(mod: tvm.IRModule, keep: bool = False) -> tvm.IRModule:
    """Weight dequantizes read by anything but a convolution or matrix product as its weights (a
    layer norm's scale, a bias added on its own: onnxruntime's tool quantizes those too) replaced,
    for that reader, by their float32 values: no int8 kernel takes them; with `keep`, left as the
    file had them (`Limits.quantized_as_written`). An embedding lookup gathers its rows as int8
    instead (`_int8_rows`)."""

    def fold(binding: relax.Binding, value: relax.Expr, builder: relax.BlockBuilder) -> relax.Expr | None:
        if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
            return None
        if value.op.name == "relax.take" and (rows := _int8_rows(binding, value, builder)) is not None:
            return rows
        args = list(value.args)
        for index, arg in enumerate(args):
            source = bound_value(arg, builder)
            if not keep and is_weight_dequantize(source) and not (value.op.name in _WEIGHT_READERS and index == 1):
                args[index] = relax.const(dequantized_values(source))
        if all(a.same_as(b) for a, b in zip(args, value.args)):
            return None
        return relax.Call(value.op, args, value.attrs, value.ty_args)

    return relax.transform.DeadCodeElimination(["main"])(rebuild_module(mod, replace_binding=fold))


def _int8_rows(binding: relax.Binding, take: relax.Call, builder: relax.BlockBuilder) -> relax.Expr | None:
    """take(dequantize(table), ids) of a table quantized per tensor, as dequantize(take(table, ids)):
    the same values, with only the rows read dequantized and the table kept int8 (a quantized
    BERT's word embedding is 23 MB so, 94 MB in float, and took 0.17 s to dequantize). The take
    keeps the node's name, which its index check reports."""
    source = bound_value(take.args[0], builder)
    if not is_weight_dequantize(source) or any(constant_array(a).size != 1 for a in source.args[1:]):
        return None
    rows = builder.normalize(relax.Call(take.op, [source.args[0], *take.args[1:]], take.attrs, take.ty_args))
    var = type(binding.var)(binding.var.name, rows.ty)
    builder.emit_normalized(relax.VarBinding(var, rows))
    return relax.op.dequantize(var, *source.args[1:], axis=int(source.attrs.axis), out_dtype=str(source.attrs.out_dtype))


def dequantize_per_consumer(mod: tvm.IRModule) -> tvm.IRModule:
    """A copy of every dequantize for each op that reads it.

    A quantized kernel is dequantize -> op -> quantize, and a pattern can take the dequantize in
    only where nothing else reads it; in a QDQ model a residual block's input is read by its
    convolution and by the residual add through one DequantizeLinear. onnxruntime makes the same
    copies before it fuses QDQ node units."""
    readers: dict[int, int] = {}

    def copy(value: relax.Expr, builder: relax.BlockBuilder) -> relax.Expr | None:
        if not isinstance(value, relax.Call):
            return None
        args = list(value.args)
        for index, arg in enumerate(args):
            source = bound_value(arg, builder)
            if op_name(source) != "relax.dequantize":
                continue
            readers[arg.id_] = readers.get(arg.id_, 0) + 1
            if readers[arg.id_] > 1:  # the first reader keeps the original
                # a new call, not the same object bound twice: FuseOpsByPattern maps each value
                # object to one variable
                args[index] = builder.emit(relax.Call(source.op, source.args, source.attrs, source.ty_args), f"{arg.name}_{readers[arg.id_]}")
        if all(a.same_as(b) for a, b in zip(args, value.args)):
            return None
        return relax.Call(value.op, args, value.attrs, value.ty_args)

    return rebuild_module(mod, copy)


def same_quantization(quantize: relax.Call, dequantize: relax.Call) -> bool:
    """Whether two quantize or dequantize calls have the same constant scale and zero point."""
    operands = (*quantize.args[1:3], *dequantize.args[1:3])
    return all(is_tensor_constant(a) for a in operands) and all(
        np.array_equal(constant_array(a), constant_array(b)) for a, b in zip(quantize.args[1:3], dequantize.args[1:3]))


def layout_on_int8_data(mod: tvm.IRModule) -> tvm.IRModule:
    """quantize(move(dequantize(x))) with one scale and zero point on both sides, where the move is
    a reshape, transpose, slice, broadcast or new axis (`INT8_MOVES`) or none, is that move of the
    int8 data x, exactly: onnxruntime's tool quantizes around every such op of a quantized
    transformer's attention (and a Llama's rotary embedding), and each pair was two passes over
    the tensor in float."""

    def rewrite(value: relax.Expr, builder: relax.BlockBuilder) -> relax.Expr | None:
        if op_name(value) != "relax.quantize":
            return None
        moves = []  # from the quantize back: a chain of moves (BERT's broadcast, then reshape)
        source = bound_value(value.args[0], builder)
        while op_name(source) in INT8_MOVES:
            moves.append(source)
            source = bound_value(source.args[0], builder)
        if op_name(source) != "relax.dequantize" or not same_quantization(value, source) or \
                dtype_name(source.args[0].ty) != str(value.attrs.out_dtype):
            return None
        data = source.args[0]
        if not moves:  # quantize(dequantize(x)) alone: what `fold_reshapes` leaves of a reshape between them
            return data
        for move in reversed(moves[1:]):
            data = builder.emit(relax.Call(move.op, [data, *move.args[1:]], move.attrs, move.ty_args))
        return relax.Call(moves[0].op, [data, *moves[0].args[1:]], moves[0].attrs, moves[0].ty_args)

    # quantize(dequantize(x)) is now an alias of x: its readers read x.
    tidy = tvm.transform.Sequential([relax.transform.CanonicalizeBindings(), relax.transform.DeadCodeElimination(["main"])])
    return tidy(rebuild_module(mod, rewrite))


def _never_nan(call: relax.Call, builder: relax.BlockBuilder) -> relax.Expr | None:
    """`where(isnan(x), v, x)` as `x` where `x` is dequantized with finite constant scales."""
    if op_name(call) != "relax.where":
        return None
    condition, kept = bound_value(call.args[0], builder), call.args[2]
    if op_name(condition) != "relax.isnan" or not condition.args[0].same_as(kept) or not same_shape(kept.ty, call.ty):
        return None
    source = bound_value(kept, builder)
    if op_name(source) != "relax.dequantize" or not is_tensor_constant(source.args[1]) or \
            not np.isfinite(constant_array(source.args[1])).all():
        return None
    return kept


def drop_nan_checks(mod: tvm.IRModule) -> tvm.IRModule:
    """The safe softmax of a quantized model reads its probabilities back through
    QuantizeLinear/DequantizeLinear, which never give NaN: its check is the value itself. Dropped
    for backends with int8 kernels of their own, where the check cut the int8 region at every
    attention layer; kept for one that takes the file as written (onnxruntime picks its int8
    softmax by the ops around it: without the check, its results moved 2.8% on a quantized BERT)."""
    return rebuild_module(mod, _never_nan)


def for_partitioning(mod: tvm.IRModule, takes_quantized: bool, int8_weights: bool = True, as_written: bool = False) -> tvm.IRModule:
    """A quantized model as the backends being partitioned for take it: with the rewrites above
    where one of them takes quantized ops (`Limits.quantized`), its weights int8 unless none of
    those takes int8 weights (`Limits.int8_weights`), its other int8 constants and its NaN checks
    as the file had them where all of them take the file as written (`Limits.quantized_as_written`);
    with float weights otherwise; a model without quantize or dequantize ops as it is."""
    if not has_quantize_ops(mod):
        return mod
    if takes_quantized:
        weights = (lambda m: fold_float_weights(m, keep=as_written)) if int8_weights else fold_weight_dequantize
        checked = mod if as_written else drop_nan_checks(mod)
        return dequantize_per_consumer(fold_reshapes(layout_on_int8_data(weights(checked))))
    return fold_weight_dequantize(mod)
