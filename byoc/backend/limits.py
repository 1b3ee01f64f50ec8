"""Limits a backend declares once instead of re-checking them in every predicate.

They are applied to every op a backend would take, whether by an op rule or inside a pattern,
before the backend's own predicate runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from byoc.ir.quantization import INT8_MOVES
from byoc.ir.types import dtype_name, has_static_shape, is_tensor_constant, tensor_types

# Ops whose second operand is a weight in the usual sense (constant in a trained model).
WEIGHT_OPS = frozenset(
    {
        "relax.nn.conv1d",
        "relax.nn.conv2d",
        "relax.nn.conv3d",
        "relax.nn.conv2d_transpose",
        "relax.matmul",
    }
)
_LAYOUT_ATTRS = ("data_layout", "layout")
# Ops that take the integer side of a quantized model where `quantized` dtypes are declared: its
# quantize and dequantize, the layout ops that move its int8 data as they are, and the cast that
# makes a zero point computed at run time (ONNX DynamicQuantizeLinear as TVM imports it).
_QUANTIZED_DATA_OPS = ("relax.quantize", "relax.dequantize", *INT8_MOVES, "relax.astype")


def _parameter(arg: relax.Expr) -> bool:
    """A one-number integer constant (an index, an axis): code generation reads its value; it
    is no tensor the hardware holds."""
    return is_tensor_constant(arg) and tensor_types(arg.ty)[0].ndim <= 1 and dtype_name(arg.ty).startswith(("int", "uint")) \
        and int(np.prod([int(d) for d in arg.ty.shape])) == 1


def _selection(op_name: str, index: int, arg: relax.Expr, run_time: bool) -> bool:
    """The boolean condition of a where: fixed in the model (a causal mask), which code
    generation reads, so its bools are no tensor the hardware holds; or, where the backend says
    so (`run_time_conditions`), one the host computes at run time."""
    return op_name == "relax.where" and index == 0 and dtype_name(arg.ty) == "bool" and (run_time or is_tensor_constant(arg))


@dataclass(frozen=True)
class Limits:
    """Hardware-wide limits: supported dtypes, data layouts, tensor rank, constant weights."""

    dtypes: tuple[str, ...] | None = ("float32",)
    layouts: tuple[str, ...] | None = None
    max_rank: int | None = None
    constant_weights: bool = False
    static_shapes: bool = True
    # Integer dtypes taken on the integer side of quantize and dequantize ops, and by reshapes and
    # transposes of int8 data: a backend that lists any takes a quantized model's own quantization
    # (its weights stay int8, see byoc.frontend.int8_weights); one that lists none gets the weights
    # folded to float.
    quantized: tuple[str, ...] = ()
    # Whether the model's int8 weights are taken as int8 data behind their dequantize. A device
    # whose weights need their own quantization (the DPU's power-of-two scales per tensor) takes
    # them in float32 and quantizes them again at code generation (byoc.processing.adopt).
    int8_weights: bool = True
    # Whether a quantized model reaches the backend as the file wrote it: its other int8
    # constants (a bias added on its own, a layer norm's scale) behind their dequantize, and a
    # NaN check of a dequantized value kept. onnxruntime fuses a quantize/dequantize unit only
    # whole (an Add of a dequantized activation and a float32 constant stays a float Add) and
    # picks its int8 softmax by the ops around it. A backend with int8 kernels of its own takes
    # the constants as float32 and the checks dropped (see byoc.frontend.int8_weights).
    quantized_as_written: bool = False
    # Whether a where's boolean condition may be computed by the host at run time (a padding
    # mask), not only fixed in the model: a backend whose code reads it on the CPU (dnnl).
    run_time_conditions: bool = False
    # Dtypes taken only by a cast (relax.astype) from or to one of `dtypes`: a float16 model's
    # inputs and outputs, computed in float32 in between (byoc.frontend.float16).
    cast_dtypes: tuple[str, ...] = ()

    def violation(self, call: relax.Call, inside: Callable[[relax.Expr], bool] | None = None, output: bool = True) -> str | None:
        """Why `call` breaks these limits, or None. In a composite, values that never leave it
        (operands for which `inside` holds; the output unless `output`) are the kernel's own
        business: a bool mask between two ops of one fused kernel is not a tensor the
        hardware holds."""
        op_name = call.op.name if isinstance(call.op, tvm.ir.Op) else str(call.op)
        operands = [("input", i, t) for i, arg in enumerate(call.args)
                    if not (inside is not None and inside(arg)) and not _parameter(arg)
                    and not _selection(op_name, i, arg, self.run_time_conditions)
                    for t in tensor_types(arg.ty)]
        if output:
            operands += [("output", i, t) for i, t in enumerate(tensor_types(call.ty))]
        dtypes = (*self.dtypes, *self.quantized) if self.dtypes is not None and op_name in _QUANTIZED_DATA_OPS else self.dtypes
        if dtypes is not None and op_name == "relax.astype":
            dtypes = (*dtypes, *self.cast_dtypes)
        for role, index, ty in operands:
            if self.static_shapes and not has_static_shape(ty):
                return f"{role} {index} has a dynamic shape"
            if dtypes is not None and dtype_name(ty) not in dtypes:
                return f"{role} {index} has dtype {dtype_name(ty)}; supported: {', '.join(dtypes)}"
            if self.max_rank is not None and ty.ndim > self.max_rank:
                return f"{role} {index} has rank {ty.ndim}; at most {self.max_rank} supported"
        if self.layouts is not None and call.attrs is not None:
            for attr in _LAYOUT_ATTRS:
                layout = getattr(call.attrs, attr, None)
                if isinstance(layout, str) and layout not in self.layouts:
                    return f"{attr} {layout}; supported: {', '.join(self.layouts)}"
        if self.constant_weights and op_name in WEIGHT_OPS and len(call.args) > 1 and not is_tensor_constant(call.args[1]):
            return "weights must be constants"
        return None
