"""The reference int8 executor of Ethos-U programs (TFLite reference kernel semantics).

No NPU is available here, so a region's numerics are checked by executing its program with
TFLite's reference arithmetic: int32 accumulation, per-channel requantization with a 31-bit
multiplier and a shift (SaturatingRoundingDoublingHighMul, RoundingDivideByPOT), and TFLite's
fixed-point element-wise add. The NPU computes the same functions; its rounding of the
requantization scale (Vela's) can differ from TFLite's by one unit in the last place.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from byoc.vendors.ethos_u.program import EOp, EProgram, quantize_multiplier

_ADD_LEFT_SHIFT = 20


def _doubling_high_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    product = a.astype(np.int64) * b.astype(np.int64)
    nudge = np.where(product >= 0, 1 << 30, 1 - (1 << 30))
    total = product + nudge
    # C's integer division truncates toward zero
    return np.where(total >= 0, total >> 31, -((-total) >> 31))


def _divide_by_pot(values: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    exponent = np.asarray(exponent, np.int64)
    mask = (np.int64(1) << exponent) - 1
    remainder = values & mask
    threshold = (mask >> 1) + (values < 0)
    return (values >> exponent) + (remainder > threshold)


def requantize(acc: np.ndarray, multiplier, shift) -> np.ndarray:
    """TFLite MultiplyByQuantizedMultiplier, broadcasting per-channel parameters on the last axis."""
    shift = np.asarray(shift, np.int64)
    left, right = np.maximum(shift, 0), np.maximum(-shift, 0)
    shifted = np.clip(acc.astype(np.int64) << left, -(2**31), 2**31 - 1)
    return _divide_by_pot(_doubling_high_mul(shifted, np.asarray(multiplier, np.int64)), right)


def _windows(x: np.ndarray, kernel, strides, padding, dilation, fill: int) -> np.ndarray:
    """NHWC windows: [N, OH, OW, C, KH, KW]."""
    top, left, bottom, right = padding
    padded = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=fill)
    span = ((kernel[0] - 1) * dilation[0] + 1, (kernel[1] - 1) * dilation[1] + 1)
    windows = sliding_window_view(padded, span, axis=(1, 2))[:, :: strides[0], :: strides[1]]
    return windows[..., :: dilation[0], :: dilation[1]]


class EthosUExecutor:
    def __init__(self, program: EProgram) -> None:
        self.program = program

    def _weighted(self, op: EOp, x: np.ndarray, x_zero: int) -> np.ndarray:
        p = op.params
        w = op.weights.astype(np.float64)
        centred = (x.astype(np.int64) - x_zero).astype(np.float64)
        if op.kind == "fully_connected":
            # TFLite's fully connected: every row of the last axis, whatever the leading axes.
            rows = centred.reshape(-1, w.shape[-1]) @ w.reshape(w.shape[0], -1).T
            acc = rows.reshape(*centred.shape[:-1], w.shape[0])
        else:
            windows = _windows(centred, w.shape[1:3], p["strides"], p["padding"], p["dilation"], 0)
            if op.kind == "depthwise":
                acc = np.einsum("nhwcij,cij->nhwc", windows, w[..., 0], optimize=True)
            else:
                acc = np.einsum("nhwcij,oijc->nhwo", windows, w, optimize=True)
        acc = acc.astype(np.int64) + op.bias.astype(np.int64)
        return requantize(acc, op.multipliers, op.shifts)

    def _pool(self, op: EOp, x: np.ndarray, source, out) -> np.ndarray:
        p = op.params
        if op.kind == "maxpool":
            pooled = _windows(x, p["pool"], p["strides"], p["padding"], (1, 1), -128).max(axis=(4, 5)).astype(np.int64) - source.zero_point
        else:
            centred = x.astype(np.int64) - source.zero_point
            total = _windows(centred, p["pool"], p["strides"], p["padding"], (1, 1), 0).sum(axis=(4, 5))
            if p["count_include_pad"]:
                count = p["pool"][0] * p["pool"][1]
            else:
                ones = np.ones((1, *x.shape[1:3], 1), np.int64)
                count = _windows(ones, p["pool"], p["strides"], p["padding"], (1, 1), 0).sum(axis=(4, 5))[0, :, :, :1]
            pooled = np.where(total >= 0, (total + count // 2) // count, -((-total + count // 2) // count))
        multiplier, shift = quantize_multiplier(source.scale / out.scale)
        return requantize(pooled, multiplier, shift)

    def _add(self, a: np.ndarray, b: np.ndarray, ta, tb, out) -> np.ndarray:
        twice_max = 2 * max(ta.scale, tb.scale)
        m1, s1 = quantize_multiplier(ta.scale / twice_max)
        m2, s2 = quantize_multiplier(tb.scale / twice_max)
        mo, so = quantize_multiplier(twice_max / ((1 << _ADD_LEFT_SHIFT) * out.scale))
        scaled_a = requantize((a.astype(np.int64) - ta.zero_point) << _ADD_LEFT_SHIFT, m1, s1)
        scaled_b = requantize((b.astype(np.int64) - tb.zero_point) << _ADD_LEFT_SHIFT, m2, s2)
        return requantize(scaled_a + scaled_b, mo, so)

    def _rescale(self, x: np.ndarray, source, out) -> np.ndarray:
        centred = x.astype(np.int64) - source.zero_point
        if source.scale == out.scale:
            return centred
        multiplier, shift = quantize_multiplier(source.scale / out.scale)
        return requantize(centred, multiplier, shift)

    def execute(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        tensors = self.program.tensors
        values = dict(zip(self.program.inputs, inputs))
        for op in self.program.ops:
            args = [values[i] for i in op.inputs]
            sources = [tensors[i] for i in op.inputs]
            out = tensors[op.output]
            if op.kind in ("conv", "depthwise", "fully_connected"):
                result = self._weighted(op, args[0], sources[0].zero_point)
            elif op.kind in ("maxpool", "avgpool"):
                result = self._pool(op, args[0], sources[0], out)
            elif op.kind == "add":
                result = self._add(args[0], args[1], sources[0], sources[1], out)
            elif op.kind == "concat":
                result = np.concatenate([self._rescale(a, s, out) for a, s in zip(args, sources)], axis=op.params["axis"])
            elif op.kind == "transpose":
                result = np.transpose(self._rescale(args[0], sources[0], out), op.params["axes"])
            else:  # reshape
                result = self._rescale(args[0], sources[0], out).reshape(out.shape)
            low, high = op.params.get("act_min", -128), op.params.get("act_max", 127)
            values[op.output] = np.clip(result + out.zero_point, low, high).astype(np.int8)
        return [values[i] for i in self.program.outputs]

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        tensors = self.program.tensors
        quantized = []
        for x, t in zip(inputs, self.program.inputs):
            spec = tensors[t]
            quantized.append(np.clip(np.round(x / spec.scale) + spec.zero_point, -128, 127).astype(np.int8))
        for out, value, t in zip(outputs, self.execute(quantized), self.program.outputs):
            spec = tensors[t]
            np.copyto(out, ((value.astype(np.float32) - spec.zero_point) * np.float32(spec.scale)).reshape(out.shape))
