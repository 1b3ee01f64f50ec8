"""What ONNX cannot express of an op (`Limit`: a check returning the reason, with its rule in
words), and the opset an op or a form of it needs (`Since`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tvm
from tvm import relax

from byoc.codegen_json.to_onnx.writer import NEAREST_MODES, PAD_MODES, REDUCTIONS, RESIZE_MODES, Check, onnx_window
from byoc.ir.types import dtype_name, shape_dims, static_shape, tensor_types


# ---------------------------------------------------------------- checks: what ONNX cannot express
@dataclass(frozen=True)
class Limit:
    """What ONNX cannot express of an op: `reason(call)` says why a call is refused (None: it is
    not), `rule` says in words which calls pass (the op table prints it)."""

    rule: str
    reason: Check

    def __call__(self, call: relax.Call) -> str | None:
        return self.reason(call)


def _limit(rule: str) -> Callable[[Check], Limit]:
    return lambda reason: Limit(rule, reason)


@_limit("out_dtype unset or the input's")
def same_dtype(call) -> str | None:
    out_dtype = getattr(call.attrs, "out_dtype", None)
    if out_dtype is None or str(out_dtype) in ("", "void", dtype_name(call.args[0].ty)):
        return None
    return f"out_dtype {out_dtype}; ONNX {call.op.name.rsplit('.', 1)[-1]} keeps the input's dtype"


_LAYOUTS = {1: ("NCW", "OIW", "IOW"), 2: ("NCHW", "OIHW", "IOHW"), 3: ("NCDHW", "OIDHW", "IODHW")}


def _layout_reason(call, data: str, kernel: str) -> str | None:
    attrs = call.attrs
    layout = getattr(attrs, "data_layout", None) or attrs.layout
    kernel_layout = getattr(attrs, "kernel_layout", kernel)  # pools have none
    out_layout = getattr(attrs, "out_layout", None) or layout
    if (layout, kernel_layout, out_layout) != (data, kernel, data):
        return f"layout {layout}/{kernel_layout} to {out_layout}; ONNX takes {data}/{kernel} to {data}"
    return same_dtype(call)


def conv_layout(rank: int, transposed: bool = False) -> Limit:
    data, kernel = _LAYOUTS[rank][0], _LAYOUTS[rank][2 if transposed else 1]
    return Limit(f"layout {data}/{kernel} to {data}; {same_dtype.rule}", lambda call: _layout_reason(call, data, kernel))


def _ints(values) -> list[int]:
    return [int(v) for v in values]


def pool_limit(rank: int) -> Limit:
    data, kernel = _LAYOUTS[rank][:2]

    def check(call) -> str | None:
        reason = _layout_reason(call, data, kernel)
        if reason is not None:
            return reason
        a = call.attrs
        spatial = [static_shape(e.ty)[-rank:] for e in (call.args[0], call)]
        if onnx_window(*spatial, _ints(a.pool_size), _ints(a.strides), _ints(a.dilation), _ints(a.padding), bool(a.ceil_mode)) is None:
            return ("ceil_mode where one axis drops its last window (Relax, as PyTorch) and another's last window "
                    "reaches past its end padding; ONNX before opset 22 expresses neither in one pooling")
        return None

    return Limit(f"layout {data} to {data}; in ceil mode, no axis dropping its last window while another's reaches "
                 "past its end padding", check)


@_limit("trailing axes, with center and scale")
def trailing_axes(call) -> str | None:
    rank = call.args[0].ty.ndim
    axes = sorted(int(a) % rank for a in call.attrs.axes)
    if axes != list(range(axes[0], rank)):
        return "ONNX LayerNormalization normalises trailing axes"
    return None if call.attrs.center and call.attrs.scale else "layer_norm without center or scale"


@_limit("inference mode, with center and scale, over axis 1")
def inference_batch_norm(call) -> str | None:
    attrs = call.attrs
    if attrs.training:
        return "batch_norm in training mode"
    if not (attrs.center and attrs.scale):
        return "batch_norm without center or scale"
    return None if int(attrs.axis) % call.args[0].ty.ndim == 1 else "ONNX BatchNormalization normalises axis 1"


@_limit(f"mode {', '.join(PAD_MODES)}")
def known_pad_mode(call) -> str | None:
    mode = call.attrs.pad_mode
    return None if mode in PAD_MODES else f"pad mode {mode!r}; written are {', '.join(PAD_MODES)}"


@_limit(f"NCHW, sizes known at build; nearest rounding {', '.join(NEAREST_MODES)}; no crop (tf_crop_and_resize)")
def resize_limit(call) -> str | None:
    a = call.attrs
    if a.layout != "NCHW":
        return f"layout {a.layout}; ONNX Resize here takes NCHW"
    dims = shape_dims(call.ty)
    if dims is None or not all(isinstance(d, tvm.tirx.IntImm) for d in dims):
        return "output sizes computed at run time"
    if a.method not in RESIZE_MODES:
        return f"method {a.method!r}; written are {', '.join(RESIZE_MODES)}"
    if a.method == "nearest_neighbor" and a.rounding_method not in NEAREST_MODES:
        return f"rounding {a.rounding_method!r}; ONNX's nearest modes are {', '.join(NEAREST_MODES)}"
    if a.coordinate_transformation_mode == "tf_crop_and_resize":
        return "crop and resize (a region of interest)"
    return same_dtype(call)


@_limit("int64 indices")
def int64_indices(call) -> str | None:
    dtypes = {dtype_name(t) for t in tensor_types(call.args[1].ty)}
    return None if dtypes == {"int64"} else f"indices of dtype {', '.join(sorted(dtypes))}; ONNX GatherND takes int64"


@_limit("mode fast, clip or wrap")
def gather(call) -> str | None:
    return None if call.attrs.mode in ("fast", "clip", "wrap") else f"take mode {call.attrs.mode}"


@_limit("one axis given (not over the flattened tensor)")
def axis_given(call) -> str | None:
    return None if call.attrs.axis is not None else f"{call.op.name} over the flattened tensor; ONNX takes one axis"


@_limit("axes unset (all) or at least one")
def some_axes(call) -> str | None:
    axes = call.attrs.axis
    return "a reduction over no axes" if axes is not None and len(axes) == 0 else None


@_limit("integer dtypes only")
def integers_only(call) -> str | None:
    dtype = dtype_name(call.args[0].ty)
    return None if "int" in dtype else f"floor_mod of {dtype}; ONNX Mod floors only integers (fmod=0)"


_REDUCTION_WORDS = ", ".join(REDUCTIONS)


@_limit(f"reduction {_REDUCTION_WORDS}")
def known_reduction(call) -> str | None:
    reduction = call.attrs.reduction
    return None if reduction in REDUCTIONS else f"reduction {reduction!r}; ONNX takes {_REDUCTION_WORDS}"


@dataclass(frozen=True)
class Since:
    """The opset ONNX takes an op from, or one form of it (`form` in words, `applies` telling a
    call of that form)."""

    opset: int
    form: str = ""
    applies: Callable[[relax.Call], bool] = lambda call: True

    def reason(self, onnx_op: str, opset: int) -> str:
        if not self.form:
            return f"ONNX {onnx_op} arrived in opset {self.opset}; the region is written at {opset}"
        return f"ONNX {onnx_op} takes this form from opset {self.opset}; the region is written at {opset}"


def is_dilated(call) -> bool:
    return any(int(d) != 1 for d in call.attrs.dilation)
