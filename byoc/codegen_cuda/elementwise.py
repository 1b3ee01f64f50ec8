"""Element-wise ops as CUDA expressions, and the chains of them fused into one kernel.

An element-wise node whose one reader is another element-wise node of the same shape is not
written to memory: its expression is inlined into its reader's (GELU's five ops, a bias add and
its activation after a product). Each operand is read at the output's coordinates, broadcast by
NumPy's rules (an axis of size 1 reads index 0). Values are computed in float32 whatever the
tensors hold (float16 and bfloat16 are converted on load and store), as cuBLAS and cuDNN
accumulate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

UNARY: dict[str, Callable[[str], str]] = {
    "relax.nn.relu": lambda a: f"fmaxf({a}, 0.0f)",
    "relax.erf": lambda a: f"erff({a})",
    "relax.exp": lambda a: f"expf({a})",
    "relax.sigmoid": lambda a: f"(1.0f / (1.0f + expf(-({a}))))",
    "relax.tanh": lambda a: f"tanhf({a})",
    "relax.sqrt": lambda a: f"sqrtf({a})",
    "relax.rsqrt": lambda a: f"rsqrtf({a})",
    "relax.negative": lambda a: f"(-({a}))",
    "relax.abs": lambda a: f"fabsf({a})",
    "relax.astype": lambda a: a,  # the conversion is the store's
}
BINARY: dict[str, Callable[[str, str], str]] = {
    "relax.add": lambda a, b: f"({a} + {b})",
    "relax.subtract": lambda a, b: f"({a} - {b})",
    "relax.multiply": lambda a, b: f"({a} * {b})",
    "relax.divide": lambda a, b: f"({a} / {b})",
    "relax.maximum": lambda a, b: f"fmaxf({a}, {b})",
    "relax.minimum": lambda a, b: f"fminf({a}, {b})",
    "relax.power": lambda a, b: f"powf({a}, {b})",
}
ELEMENTWISE = {*UNARY, *BINARY, "relax.clip"}


def is_elementwise(node: Mapping[str, Any]) -> bool:
    return node["op"] in ELEMENTWISE


def _float(value: float) -> str:
    return "INFINITY" if value == math.inf else "-INFINITY" if value == -math.inf else f"{float(value)!r}f"


def operator(node: Mapping[str, Any], operands: Sequence[str]) -> str:
    """`node`'s value from its tensor operands' (float expressions)."""
    op = node["op"]
    if op in UNARY:
        return UNARY[op](operands[0])
    if op in BINARY:
        return BINARY[op](operands[0], operands[1])
    low, high = (arg["prim"] for arg in node["args"][1:3])  # clip(x, min, max)
    return f"fminf(fmaxf({operands[0]}, {_float(low)}), {_float(high)})"


def strides(shape: Sequence[int]) -> list[int]:
    out, step = [], 1
    for size in reversed(shape):
        out.append(step)
        step *= size
    return out[::-1]


def broadcast_offset(operand: Sequence[int], output: Sequence[int]) -> str:
    """The offset of the element of a tensor of shape `operand` that the output element at
    coordinates `c0, c1, ...` (of shape `output`) reads."""
    if list(operand) == list(output):
        return "i"
    if math.prod(operand) == 1:
        return "0"
    skip = len(output) - len(operand)
    terms = [f"c{skip + k} * {step}" for k, (size, step) in enumerate(zip(operand, strides(operand))) if size != 1]
    return " + ".join(terms) or "0"


def coordinates(shape: Sequence[int]) -> str:
    """C that sets `c0, c1, ...` to the coordinates of flat index `i` in `shape` (of the kernel's
    index type, `byoc_index_t`)."""
    lines, rest = [], "i"
    for axis in range(len(shape) - 1, -1, -1):
        lines.append(f"  const byoc_index_t c{axis} = {rest} % {shape[axis]};")
        rest = f"({rest} / {shape[axis]})"
    return "\n".join(lines)
