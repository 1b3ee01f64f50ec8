"""Multiply-accumulate counts of the ops that carry them (convolutions and matrix products).

These are the MACs of the paper's offload-ratio tables: every other op counts zero.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from byoc.ir.types import has_static_shape, static_shape

_CONV_OPS = {"relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d"}
_TRANSPOSED_CONV_OPS = {"relax.nn.conv1d_transpose", "relax.nn.conv2d_transpose"}


def op_macs(call: relax.Call) -> int:
    """MACs of one op call with static shapes; 0 for ops without MACs or unknown shapes."""
    if not isinstance(call.op, tvm.ir.Op):
        return 0
    name = call.op.name
    if name not in _CONV_OPS and name not in _TRANSPOSED_CONV_OPS and name != "relax.matmul":
        return 0
    types = [arg.ty for arg in call.args[:2]] + [call.ty]
    if not all(isinstance(t, relax.TensorType) and has_static_shape(t) for t in types):
        return 0
    lhs, rhs, out = (static_shape(t) for t in types)
    if name == "relax.matmul":
        reduction = lhs[-1] if lhs else 1
        return math.prod(out) * reduction
    kernel_layout = str(getattr(call.attrs, "kernel_layout", "OIHW"))
    if name in _CONV_OPS:
        # Each output element reduces over (input channels / groups) x kernel window, which is
        # the weight's size divided by its output-channel extent, whatever the kernel layout.
        return math.prod(out) * (math.prod(rhs) // rhs[kernel_layout.index("O")])
    # A transposed convolution scatters each input element over (output channels / groups) x
    # kernel window.
    return math.prod(lhs) * (math.prod(rhs) // rhs[kernel_layout.index("I")])
