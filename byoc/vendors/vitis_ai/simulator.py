"""A simulator of the DPU: it runs a DPU program with int8 data, int32 accumulation and
power-of-two requantization (arithmetic shifts), and estimates cycles with the throughput model
of `configs`. It stands in for the device, which is not available here.

Rounding is half to even everywhere, like the quantize op of the QDQ graph the program comes
from: rounding half up instead biased the residual adds of ResNet-18 (a sum at a coarser
position ties on every odd value) and took its output 8% (relative L2) from the QDQ reference.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from byoc.vendors.vitis_ai.configs import DpuConfig
from byoc.vendors.vitis_ai.program import Act, Instruction, Op, Program


def round_shift(values: np.ndarray, shift: int) -> np.ndarray:
    """values * 2**-shift on integers, rounded half to even."""
    values = values.astype(np.int64, copy=False)
    if shift <= 0:
        return values << -shift
    quotient = values >> shift
    remainder = values - (quotient << shift)
    half = 1 << (shift - 1)
    return quotient + ((remainder > half) | ((remainder == half) & (quotient & 1 == 1)))


def saturate(values: np.ndarray) -> np.ndarray:
    return np.clip(values, -128, 127).astype(np.int8)


def _activate(values: np.ndarray, act: int, limit: int) -> np.ndarray:
    if act == Act.RELU:
        return np.maximum(values, 0)
    if act == Act.RELU6:
        return np.clip(values, 0, limit)
    return values


def _windows(x: np.ndarray, kernel: tuple[int, int], stride, padding, dilation, fill: int) -> np.ndarray:
    top, left, bottom, right = padding
    padded = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=fill)
    span = ((kernel[0] - 1) * dilation[0] + 1, (kernel[1] - 1) * dilation[1] + 1)
    windows = sliding_window_view(padded, span, axis=(2, 3))[:, :, :: stride[0], :: stride[1]]
    return windows[..., :: dilation[0], :: dilation[1]]


class DpuSimulator:
    def __init__(self, program: Program) -> None:
        self.program = program

    def _conv(self, ins: Instruction, x: np.ndarray) -> np.ndarray:
        shift, act, limit, sh, sw, top, left, bottom, right, dh, dw = ins.params
        weights = ins.weights.astype(np.float64)
        windows = _windows(x, weights.shape[2:], (sh, sw), (top, left, bottom, right), (dh, dw), 0).astype(np.float64)
        if ins.op == Op.DEPTHWISE:
            acc = np.einsum("nchwij,cij->nchw", windows, weights[:, 0], optimize=True)
        else:
            acc = np.einsum("nchwij,ocij->nohw", windows, weights, optimize=True)
        acc = acc.astype(np.int64) + ins.bias.astype(np.int64)[None, :, None, None]
        return saturate(_activate(round_shift(acc, shift), act, limit))

    def _dense(self, ins: Instruction, x: np.ndarray) -> np.ndarray:
        shift, act, limit = ins.params
        acc = (x.astype(np.float64) @ ins.weights.astype(np.float64)).astype(np.int64) + ins.bias.astype(np.int64)
        return saturate(_activate(round_shift(acc, shift), act, limit))

    def _pool(self, ins: Instruction, x: np.ndarray, requant: int) -> np.ndarray:
        kh, kw, sh, sw, top, left, bottom, right, include_pad = ins.params
        if ins.op == Op.MAXPOOL:
            pooled = _windows(x, (kh, kw), (sh, sw), (top, left, bottom, right), (1, 1), -128).max(axis=(4, 5)).astype(np.int64)
            return saturate(round_shift(pooled, requant))
        total = _windows(x.astype(np.int64), (kh, kw), (sh, sw), (top, left, bottom, right), (1, 1), 0).sum(axis=(4, 5))
        if include_pad:
            count = np.full(total.shape[2:], kh * kw)
        else:
            ones = np.ones((1, 1, *x.shape[2:]), np.int64)
            count = _windows(ones, (kh, kw), (sh, sw), (top, left, bottom, right), (1, 1), 0).sum(axis=(4, 5))[0, 0]
        # Divide and requantize in one rounding: rounding the mean at the input's position first
        # would lose the bits a finer output position keeps.
        return saturate(np.round(total * 2.0**-requant / count))

    def execute(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run on int8 inputs; returns the int8 outputs."""
        program = self.program
        values: dict[int, np.ndarray] = dict(zip(program.inputs, inputs))
        fix = [t.fix for t in program.tensors]
        for ins in program.instructions:
            args = [values[i] for i in ins.inputs]
            out_fix = fix[ins.output]
            if ins.op in (Op.CONV, Op.DEPTHWISE):
                result = self._conv(ins, args[0])
            elif ins.op == Op.DENSE:
                result = self._dense(ins, args[0])
            elif ins.op in (Op.MAXPOOL, Op.AVGPOOL):
                result = self._pool(ins, args[0], fix[ins.inputs[0]] - out_fix)
            elif ins.op == Op.ADD:
                common = max(fix[i] for i in ins.inputs)
                total = sum(round_shift(a, fix[i] - common) for a, i in zip(args, ins.inputs))
                result = saturate(_activate(round_shift(total, common - out_fix), *ins.params))
            elif ins.op == Op.CONCAT:
                parts = [saturate(round_shift(a, fix[i] - out_fix)) for a, i in zip(args, ins.inputs)]
                result = np.concatenate(parts, axis=ins.params[0])
            elif ins.op == Op.RESHAPE:
                result = saturate(round_shift(args[0], fix[ins.inputs[0]] - out_fix)).reshape(program.tensors[ins.output].shape)
            else:  # ACTIVATION
                result = saturate(_activate(round_shift(args[0], fix[ins.inputs[0]] - out_fix), *ins.params))
            values[ins.output] = result
        return [values[i] for i in program.outputs]

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        tensors = self.program.tensors
        quantized = [saturate(np.round(x * 2.0 ** tensors[t].fix)) for x, t in zip(inputs, self.program.inputs)]
        for out, value, t in zip(outputs, self.execute(quantized), self.program.outputs):
            np.copyto(out, value.astype(np.float32) * np.float32(2.0 ** -tensors[t].fix))


def estimate_cycles(program: Program, config: DpuConfig) -> dict:
    """Cycles per instruction kind and in total, with the time at the configuration's clock."""
    per_kind: dict[str, int] = {}
    for ins in program.instructions:
        out = program.tensors[ins.output].shape
        batch, channels, height, width = out if len(out) == 4 else (out[0], int(np.prod(out[1:])), 1, 1)
        if ins.op in (Op.CONV, Op.DEPTHWISE):
            in_channels = program.tensors[ins.inputs[0]].shape[1]
            window = ins.weights.shape[2] * ins.weights.shape[3]
            cycles = config.conv_cycles(height, width, in_channels, channels, window, ins.op == Op.DEPTHWISE)
        elif ins.op == Op.DENSE:
            cycles = config.conv_cycles(1, 1, ins.weights.shape[0], ins.weights.shape[1], 1)
        elif ins.op in (Op.MAXPOOL, Op.AVGPOOL):
            cycles = config.elementwise_cycles(height, width, channels, ins.params[0] * ins.params[1])
        else:
            cycles = config.elementwise_cycles(height, width, channels)
        per_kind[ins.op.name.lower()] = per_kind.get(ins.op.name.lower(), 0) + cycles * batch
    total = sum(per_kind.values())
    return {"target": config.name, "cycles": total, "ms_at_clock": total / (config.clock_mhz * 1e3), "clock_mhz": config.clock_mhz,
            "peak_ops_per_cycle": config.peak_ops_per_cycle, "cycles_by_instruction": per_kind}
