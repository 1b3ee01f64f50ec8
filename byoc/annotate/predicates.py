"""Predicates vendors share: hardware limits that read the same on every data sheet.

Each returns None when the op is accepted and a reason when it is not. `scalar_constant` and
`expected_constants` read a pattern's constants.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from tvm import relax

from byoc.ir.types import constant_array, is_tensor_constant, static_shape

OpCheck = Callable[[relax.Call], "str | None"]


def shape(expr: relax.Expr) -> tuple[int, ...]:
    return static_shape(expr.ty)


def channel_concat(call: relax.Call) -> str | None:
    rank = len(shape(call))
    return None if rank == 4 and int(call.attrs.axis) % rank == 1 else "concatenation of 4-D tensors along channels only"


def same_shape_add(call: relax.Call) -> str | None:
    if any(is_tensor_constant(a) for a in call.args) or shape(call.args[0]) != shape(call.args[1]):
        return "only adds of two tensors of one shape (no broadcast, no constants)"
    return None


def global_average_pool(max_window: int) -> OpCheck:
    """A mean over height and width of NCHW with kept dimensions, up to a window size."""

    def check(call: relax.Call) -> str | None:
        rank = len(shape(call.args[0]))
        axes = sorted(int(a) % rank for a in call.attrs.axis) if call.attrs.axis is not None else []
        if rank != 4 or axes != [2, 3] or not call.attrs.keepdims:
            return "only a mean over height and width (global average pooling)"
        window = shape(call.args[0])[2:]
        return None if max(window) <= max_window else f"global pooling over {window[0]}x{window[1]}, more than {max_window}x{max_window}"

    return check


def clip_bounds(call: relax.Call) -> tuple[float, float]:
    """The low and high bound of a clip (numbers in the call, not tensors)."""
    low, high = (float(call.args[i].value) for i in (1, 2))
    return low, high


def relu6(call: relax.Call) -> str | None:
    low, high = clip_bounds(call)
    return None if (low, high) == (0.0, 6.0) else f"clip({low}, {high}) is not ReLU6"


def fused_relu6(match) -> str | None:
    """In a pattern ending in an activation: a clip must be ReLU6."""
    clip = next((c for c in match.calls if c.op.name == "relax.clip"), None)
    return relu6(clip) if clip is not None else None


def flatten_only(call: relax.Call) -> str | None:
    return None if len(shape(call)) == 2 else "only flatten (to 2-D)"


def two_dimensional_weights(call: relax.Call) -> str | None:
    return None if len(shape(call.args[1])) == 2 else "fully connected layers need 2-D weights"


def constant_channel_bias(match) -> str | None:
    """In a pattern with a bias add: the bias is a constant with one value per output channel
    (or one in all). `fused_pattern`'s bias is any operand, and a layer without a bias followed
    by a residual add (T5's projections) matches too; an int8 kernel has no scale for the
    product before that add, so the add must be a kernel of its own."""
    bias = match.get("bias")
    if bias is None:
        return None
    if not is_tensor_constant(bias):
        return "the add after it is of a computed tensor (a residual), not a constant bias"
    out, values = shape(match["root"]), shape(bias)
    axis = len(out) - 1 if match["root"].op.name == "relax.matmul" else 1
    padded = (1,) * (len(out) - len(values)) + values
    if len(values) > len(out) or any(d != 1 for i, d in enumerate(padded) if i != axis) or padded[axis] not in (1, out[axis]):
        return f"a bias of shape {values} is not one value per output channel of {out}"
    return None


def scalar_constant(expr: relax.Expr) -> float | None:
    """The value of a one-element constant, else None."""
    if not is_tensor_constant(expr):
        return None
    value = constant_array(expr)
    return float(value.reshape(())) if value.size == 1 else None


def expected_constants(values: dict[str, float], form: str):
    """A pattern check that the match's named constants hold `values` (one number each), or
    those values as a float16 model stores them (computed in float32, byoc.frontend.float16)."""

    def check(match) -> str | None:
        for part, want in values.items():
            got = scalar_constant(match[part])
            if got is None or not (math.isclose(got, want, rel_tol=1e-5) or got == float(np.float16(want))):
                return f"not {form}"
        return None

    return check


def all_of(*checks: Callable[..., str | None]) -> Callable[..., str | None]:
    """One check of several: the first reason any of them gives."""
    return lambda match: next((reason for check in checks if (reason := check(match)) is not None), None)
