"""One declaration per Relax op (`TRANSLATIONS`): the ONNX op it becomes, its emitter, its limits and
the opset it needs; each op's check (`onnx_checks`), which also holds its tensors to the type
constraints of the ONNX op's schema."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import defs, helper

from byoc.codegen_json.to_onnx.limits import (
    Limit,
    Since,
    axis_given,
    conv_layout,
    gather,
    inference_batch_norm,
    int64_indices,
    integers_only,
    is_dilated,
    known_pad_mode,
    known_reduction,
    pool_limit,
    resize_limit,
    same_dtype,
    some_axes,
    trailing_axes,
)
from byoc.codegen_json.to_onnx.writer import (
    LATEST_OPSET,
    OPSET,
    OPSETS,
    Check,
    Emitter,
    attr_op,
    cumsum,
    emit_arange,
    emit_batch_norm,
    emit_cast,
    emit_clip,
    emit_conv,
    emit_layer_norm,
    emit_pad,
    emit_reduce,
    emit_reshape,
    emit_resize,
    emit_split,
    emit_take,
    emit_variance,
    expand,
    flip,
    gelu,
    gelu_writes,
    index_tensor,
    isfinite,
    not_equal,
    pool,
    prelu,
    rsqrt,
    same_op,
    scatter,
    silu,
    square,
    strided_slice,
    transpose,
    trilu,
)
from byoc.errors import CodegenError
from byoc.ir.types import dtype_name, tensor_types


@dataclass(frozen=True)
class Translation:
    """How a Relax op is written in ONNX: `onnx_op` is the op whose schema's type constraints its
    tensors must meet (the main one where the emitter writes several), `check` what ONNX cannot
    express beyond types, `since` the opset it or a form of it needs, `writes` the ONNX ops the
    emitter writes at an opset where that is more than `onnx_op`."""

    onnx_op: str
    emit: Emitter
    check: Limit | None = None
    since: Since | None = None
    writes: Callable[[int], tuple[str, ...]] | None = None

    def onnx_ops(self, opset: int) -> tuple[str, ...]:
        return self.writes(opset) if self.writes is not None else (self.onnx_op,)


def _same(onnx_op: str, **attrs) -> Translation:
    return Translation(onnx_op, same_op(onnx_op, **attrs))


def _writes(*ops: str) -> Callable[[int], tuple[str, ...]]:
    return lambda opset: ops


_ELEMENTWISE = {
    "relax.add": "Add", "relax.subtract": "Sub", "relax.multiply": "Mul", "relax.divide": "Div", "relax.power": "Pow",
    "relax.maximum": "Max", "relax.minimum": "Min", "relax.nn.relu": "Relu", "relax.sigmoid": "Sigmoid",
    "relax.tanh": "Tanh", "relax.exp": "Exp", "relax.log": "Log", "relax.erf": "Erf", "relax.sqrt": "Sqrt",
    "relax.abs": "Abs", "relax.negative": "Neg", "relax.sign": "Sign", "relax.floor": "Floor", "relax.ceil": "Ceil",
    "relax.round": "Round", "relax.sin": "Sin", "relax.cos": "Cos", "relax.tan": "Tan", "relax.asin": "Asin",
    "relax.acos": "Acos", "relax.atan": "Atan", "relax.sinh": "Sinh", "relax.cosh": "Cosh", "relax.asinh": "Asinh",
    "relax.acosh": "Acosh", "relax.atanh": "Atanh", "relax.isnan": "IsNaN", "relax.isinf": "IsInf",
    "relax.less": "Less", "relax.greater": "Greater", "relax.equal": "Equal", "relax.less_equal": "LessOrEqual",
    "relax.greater_equal": "GreaterOrEqual", "relax.logical_and": "And", "relax.logical_or": "Or",
    "relax.logical_xor": "Xor", "relax.logical_not": "Not", "relax.where": "Where",
}

TRANSLATIONS: dict[str, Translation] = {
    **{op: _same(onnx_op) for op, onnx_op in _ELEMENTWISE.items()},
    "relax.matmul": Translation("MatMul", same_op("MatMul"), same_dtype),
    "relax.mod": _same("Mod", fmod=1),  # truncated, as C's fmod: Relax's mod
    "relax.floor_mod": Translation("Mod", same_op("Mod", fmod=0), integers_only),
    "relax.rsqrt": Translation("Sqrt", rsqrt, writes=_writes("Sqrt", "Reciprocal")),
    "relax.square": Translation("Mul", square),
    "relax.not_equal": Translation("Equal", not_equal, writes=_writes("Equal", "Not")),
    "relax.isfinite": Translation("IsInf", isfinite, writes=_writes("IsInf", "IsNaN", "Or", "Not")),
    "relax.nn.silu": Translation("Sigmoid", silu, writes=_writes("Sigmoid", "Mul")),
    "relax.nn.gelu": Translation("Gelu", gelu("none"), writes=gelu_writes("none")),
    "relax.nn.gelu_tanh": Translation("Gelu", gelu("tanh"), writes=gelu_writes("tanh")),
    "relax.nn.leakyrelu": Translation("LeakyRelu", attr_op("LeakyRelu", alpha="alpha")),
    "relax.nn.prelu": Translation("PRelu", prelu, writes=_writes("Reshape", "PRelu")),
    "relax.nn.softmax": Translation("Softmax", attr_op("Softmax", axis="axis")),
    "relax.nn.log_softmax": Translation("LogSoftmax", attr_op("LogSoftmax", axis="axis")),
    "relax.nn.layer_norm": Translation("LayerNormalization", emit_layer_norm, trailing_axes),
    "relax.nn.batch_norm": Translation("BatchNormalization", emit_batch_norm, inference_batch_norm,
                                       writes=_writes("BatchNormalization", "Identity")),
    **{f"relax.nn.conv{r}d": Translation("Conv", emit_conv("Conv"), conv_layout(r)) for r in (1, 2, 3)},
    **{f"relax.nn.conv{r}d_transpose": Translation("ConvTranspose", emit_conv("ConvTranspose"), conv_layout(r, True)) for r in (1, 2)},
    **{f"relax.nn.max_pool{r}d": Translation("MaxPool", pool("MaxPool"), pool_limit(r)) for r in (1, 2, 3)},
    **{f"relax.nn.avg_pool{r}d": Translation("AveragePool", pool("AveragePool"), pool_limit(r), Since(19, "dilated", is_dilated))
       for r in (1, 2, 3)},
    "relax.clip": Translation("Clip", emit_clip),
    **{f"relax.{op}": Translation(f"Reduce{op.title()}", emit_reduce(f"Reduce{op.title()}"), some_axes)
       for op in ("mean", "max", "min", "prod")},
    "relax.variance": Translation("ReduceMean", emit_variance, some_axes, writes=_writes("ReduceMean", "Sub", "Mul")),
    "relax.sum": Translation("ReduceSum", emit_reduce("ReduceSum", axes_input_since=13), some_axes),
    "relax.argmax": Translation("ArgMax", attr_op("ArgMax", axis="axis", keepdims="keepdims"), axis_given),
    "relax.argmin": Translation("ArgMin", attr_op("ArgMin", axis="axis", keepdims="keepdims"), axis_given),
    "relax.cumsum": Translation("CumSum", cumsum, axis_given, writes=_writes("CumSum", "Cast")),
    **{f"relax.{op}": Translation("Reshape", emit_reshape) for op in ("reshape", "expand_dims", "squeeze", "flatten")},
    "relax.permute_dims": Translation("Transpose", transpose),
    "relax.concat": Translation("Concat", attr_op("Concat", axis="axis")),
    "relax.split": Translation("Split", emit_split),
    "relax.strided_slice": Translation("Slice", strided_slice),
    "relax.broadcast_to": Translation("Expand", expand),
    "relax.take": Translation("Gather", emit_take, gather),
    "relax.gather_elements": Translation("GatherElements", attr_op("GatherElements", axis="axis")),
    "relax.gather_nd": Translation("GatherND", attr_op("GatherND", batch_dims="batch_dims")),
    "relax.index_tensor": Translation("GatherND", index_tensor, int64_indices, writes=_writes("Expand", "Unsqueeze", "Concat", "GatherND")),
    "relax.scatter_elements": Translation("ScatterElements", scatter("ScatterElements"), known_reduction),
    "relax.scatter_nd": Translation("ScatterND", scatter("ScatterND"), known_reduction),
    "relax.flip": Translation("Slice", flip),
    "relax.nn.pad": Translation("Pad", emit_pad, known_pad_mode),
    "relax.image.resize2d": Translation("Resize", emit_resize, resize_limit),
    # Position ids (arange of the sequence length): constants in a static model, a Range over
    # the region's own dimension in a symbolic one.
    "relax.arange": Translation("Range", emit_arange),
    **{f"relax.bitwise_{op}": Translation(f"Bitwise{op.title()}", same_op(f"Bitwise{op.title()}"), since=Since(18))
       for op in ("and", "or", "xor", "not")},
    "relax.triu": Translation("Trilu", trilu(1)),
    "relax.tril": Translation("Trilu", trilu(0)),
    "relax.astype": Translation("Cast", emit_cast),
    # A quantized model's own quantization, as the model wrote it: onnxruntime fuses
    # DequantizeLinear -> op -> QuantizeLinear into its int8 kernels.
    "relax.quantize": Translation("QuantizeLinear", attr_op("QuantizeLinear", axis="axis")),
    "relax.dequantize": Translation("DequantizeLinear", attr_op("DequantizeLinear", axis="axis")),
}


def onnx_type(dtype: str) -> str:
    return f"tensor({onnx.TensorProto.DataType.Name(helper.np_dtype_to_tensor_dtype(np.dtype(dtype))).lower()})"


@functools.cache
def schema_of(onnx_op: str) -> defs.OpSchema:
    return defs.get_schema(onnx_op, LATEST_OPSET)


def allowed_types(schema: defs.OpSchema) -> dict[str, set[str]]:
    return {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}


def _schema_types(onnx_op: str) -> Check:
    """The tensors of a call against the type constraints of the ONNX op's inputs and outputs,
    by position (a variadic last input takes the rest)."""
    schema = schema_of(onnx_op)
    allowed = allowed_types(schema)

    def constraint(params, index: int):
        if index >= len(params) and not (params and params[-1].option == defs.OpSchema.FormalParameterOption.Variadic):
            return None
        type_str = params[min(index, len(params) - 1)].type_str
        return allowed.get(type_str, {type_str})

    def check(call) -> str | None:
        roles = [("input", [t for arg in call.args for t in tensor_types(arg.ty)], schema.inputs),
                 ("output", tensor_types(call.ty), schema.outputs)]
        for role, types, params in roles:
            for index, ty in enumerate(types):
                accepted = constraint(params, index)
                if accepted is not None and onnx_type(dtype_name(ty)) not in accepted:
                    return f"{role} {index} has dtype {dtype_name(ty)}, which ONNX {onnx_op} does not take"
        return None

    return check


def supported(opset: int) -> int:
    if opset not in OPSETS:
        raise CodegenError(f"ONNX opset {opset}: byoc's hand-off writes opsets {OPSET} to {LATEST_OPSET}")
    return opset


def _checked(translation: Translation, opset: int) -> Check:
    checks = [_schema_types(translation.onnx_op), *([translation.check] if translation.check else [])]
    since = translation.since
    if since is not None and opset < since.opset:
        checks.append(lambda call: since.reason(translation.onnx_op, opset) if since.applies(call) else None)

    def check(call) -> str | None:
        return next((reason for one in checks if (reason := one(call)) is not None), None)

    return check


@functools.cache
def checks_at(opset: int) -> Mapping[str, Check]:
    return {op: _checked(t, opset) for op, t in TRANSLATIONS.items()}


def onnx_checks(opset: int = OPSET) -> dict[str, Check]:
    """Each translation's check (why not, or None) for regions written at `opset`: a vendor that
    takes ONNX claims each op with its check, as `backend.supports(op, check=...)`, adding its
    own limits before or after it."""
    return dict(checks_at(supported(opset)))


# The views the vendors read: emitters, checks for the default opset and, for vendors whose
# ONNX importer gates ops by version, the ONNX op each Relax op becomes.
EMITTERS: dict[str, Emitter] = {op: t.emit for op, t in TRANSLATIONS.items()}
ONNX_CHECKS: dict[str, Check] = onnx_checks(OPSET)
ONNX_OPS: dict[str, str] = {op: t.onnx_op for op, t in TRANSLATIONS.items()}
