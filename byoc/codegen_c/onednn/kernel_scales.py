"""The quantization of a oneDNN int8 kernel, read off its composite: dequantize -> op -> quantize.

oneDNN (v3) computes an int8 convolution or matrix product as
`dst = saturate(round((scale_src * scale_wei * sum((src - zp_src) * wei) + bias -> post-ops) / scale_dst + zp_dst))`,
which is what the QDQ graph says: the dequantizes give the source's and the weights' scales
and zero points, the quantize the result's. The emitters take the int8 buffers behind the
dequantizes as the primitive's operands, and these scales as its attributes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from byoc.codegen_c.kernel_call import CBuffer, KernelCall

DNNL_TYPES = {"float32": "dnnl_f32", "int8": "dnnl_s8", "uint8": "dnnl_u8", "int32": "dnnl_s32", "float16": "dnnl_f16"}


@dataclass(frozen=True)
class Scales:
    """A quantize or dequantize node's scale (one value, or one per channel along `axis`) and zero point."""

    scale: np.ndarray  # float32, 1-D
    zero_point: np.ndarray  # int32, 1-D
    axis: int
    # The region constant holding the scale, when it is float32: the kernel reads it there rather
    # than from a copy in the C source (a BERT's per-channel scales were 2 of its 4.9 MB of C).
    scale_buffer: CBuffer | None = None

    @property
    def per_channel(self) -> bool:
        return self.scale.size > 1

    @property
    def has_zero_point(self) -> bool:
        return bool(np.any(self.zero_point != 0))


def scales_of(call: KernelCall, node: dict) -> Scales:
    """The scale and zero point of a quantize or dequantize node of `call`."""
    scale, zero = (np.asarray(call.constants[call.arg(node, i).name]).reshape(-1) for i in (1, 2))
    buffer = call.arg(node, 1)
    return Scales(scale.astype(np.float32), zero.astype(np.int32), int(node["attrs"]["axis"]),
                  buffer if buffer.dtype == "float32" else None)


@dataclass(frozen=True)
class KernelQuantization:
    """The int8 operands of a quantized kernel and their scales."""

    source: CBuffer  # the int8 activation behind the source's dequantize
    source_scales: Scales
    weights: CBuffer | None  # the int8 constant behind the weights' dequantize
    weight_scales: Scales | None
    output_scales: Scales | None  # None: the kernel's result is float


def dequantized(call: KernelCall, buffer: CBuffer) -> dict | None:
    """The dequantize node of `call` whose result is `buffer`, if any."""
    for node, outputs in zip(call.nodes, call.node_outputs):
        if node["op"] == "relax.dequantize" and outputs and outputs[0] == buffer:
            return node
    return None


def dequantized_source(call: KernelCall) -> dict | None:
    """The dequantize node that reads a kernel's int8 input, if any (the int8 data behind it is
    `call.arg(node, 0)`)."""
    return next((n for n in call.nodes if n["op"] == "relax.dequantize" and call.arg(n, 0) in call.inputs), None)


def result_quantize(call: KernelCall) -> dict | None:
    """The kernel's last quantize node, which quantizes its result; None for a float result."""
    return next((n for n in reversed(call.nodes) if n["op"] == "relax.quantize"), None)


def kernel_quantization(call: KernelCall, root: dict) -> KernelQuantization | None:
    """The quantization of the kernel around `root` (a convolution or matrix product), or None
    for a float kernel."""
    source = dequantized(call, call.arg(root, 0))
    if source is None:
        return None
    weights = dequantized(call, call.arg(root, 1))
    quantize = result_quantize(call)
    return KernelQuantization(
        source=call.arg(source, 0),
        source_scales=scales_of(call, source),
        weights=call.arg(weights, 0) if weights is not None else None,
        weight_scales=scales_of(call, weights) if weights is not None else None,
        output_scales=scales_of(call, quantize) if quantize is not None else None,
    )
