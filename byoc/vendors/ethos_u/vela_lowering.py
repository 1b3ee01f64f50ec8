"""Ethos-U program -> Vela NPU operations -> register command streams (ethos-u-vela's API).

Feature maps live in the NPU's scratch region (SRAM), placed by lifetime so that tensors that
are never alive together share addresses; weights and biases are encoded by Vela into the
permanent-storage region. Consecutive NPU operations form one command-stream segment; an
operation the NPU lacks (a boundary transpose, a reshape) ends a segment and runs on the CPU.
Cycle estimates come from Vela's own performance model (`ethosu.vela.npu_performance`, not part
of its public API, used as Vela's compiler uses it).
"""

from __future__ import annotations

import contextlib
import functools
import io

import numpy as np
from ethosu.vela import api as vela
from ethosu.vela.scaling import quantise_scale

from byoc.errors import CodegenError
from byoc.vendors.ethos_u.payload import Lowered
from byoc.vendors.ethos_u.program import ACCELERATORS, EOp, EProgram, ETensor

# Vela's accelerator of each configuration name ("ethos-u55-32" -> Ethos_U55_32).
NPU_ACCELERATORS = {name: getattr(vela.NpuAccelerator, "Ethos_U" + name.removeprefix("ethos-u").replace("-", "_")) for name in ACCELERATORS}
WEIGHTS_REGION = 0
SCRATCH_REGION = 1
_ALIGN = 16


def _shape3d(tensor: ETensor) -> vela.NpuShape3D:
    # Row-major NHWC with a batch of one: the last axis is depth, the one before it width, so a
    # fully connected layer over (rows, K) or (A, B, K) is a 1x1 convolution over every row.
    shape = [int(d) for d in tensor.shape]
    if len(shape) == 4:
        return vela.NpuShape3D(shape[1], shape[2], shape[3])
    if len(shape) == 3:
        return vela.NpuShape3D(*shape)
    return vela.NpuShape3D(1, int(np.prod(shape[:-1], dtype=np.int64)), shape[-1] if shape else 1)


def _align(value: int) -> int:
    return -(-value // _ALIGN) * _ALIGN


def _plan_addresses(program: EProgram) -> tuple[dict[int, int], int]:
    """Scratch addresses by tensor: first fit over the lifetimes (in operations)."""
    last_use = {t: len(program.ops) for t in program.outputs}
    first = {t: -1 for t in program.inputs}
    for position, op in enumerate(program.ops):
        first.setdefault(op.output, position)
        for t in op.inputs:
            last_use[t] = max(last_use.get(t, position), position)
    placed: list[tuple[int, int, int, int]] = []  # (start, end, address, size)
    addresses, peak = {}, 0
    for tensor in sorted(first, key=lambda t: first[t]):
        start, end = first[tensor], last_use.get(tensor, first[tensor])
        size = _align(int(np.prod(program.tensors[tensor].shape)))
        busy = sorted((a, a + s) for (b, e, a, s) in placed if not (e < start or b > end))
        address = 0
        for low, high in busy:
            if address + size <= low:
                break
            address = max(address, _align(high))
        addresses[tensor] = address
        placed.append((start, end, address, size))
        peak = max(peak, address + size)
    return addresses, peak


class _Lowering:
    def __init__(self, program: EProgram) -> None:
        if program.accelerator not in ACCELERATORS:
            raise CodegenError(f"unknown Ethos-U accelerator {program.accelerator!r}; known: {', '.join(ACCELERATORS)}")
        self.program = program
        self.accelerator = NPU_ACCELERATORS[program.accelerator]
        self.addresses, self.sram_bytes = _plan_addresses(program)
        self.weights = bytearray()

    def feature_map(self, tensor_id: int, shape: vela.NpuShape3D | None = None, offset: int = 0, strides=None) -> vela.NpuFeatureMap:
        tensor = self.program.tensors[tensor_id]
        fm = vela.NpuFeatureMap()
        fm.data_type = vela.NpuDataType.INT8
        fm.region = SCRATCH_REGION
        fm.shape = shape or _shape3d(tensor)
        fm.tiles = vela.NpuTileBox(height_0=fm.shape.height, height_1=fm.shape.height, width_0=fm.shape.width,
                                   addresses=[self.addresses[tensor_id] + offset, 0, 0, 0])
        fm.quantization = vela.NpuQuantization(scale_f32=tensor.scale, zero_point=tensor.zero_point)
        fm.layout = vela.NpuLayout.NHWC
        fm.strides = strides
        fm.name = f"t{tensor_id}"
        return fm

    def _blob(self, data: bytes | bytearray) -> vela.NpuAddressRange:
        """Append to the weights region; the NPU reads weight and bias streams in 16-byte units."""
        start = _align(len(self.weights))
        padded = bytes(data) + bytes(_align(len(data)) - len(data))
        self.weights.extend(bytes(start - len(self.weights)))
        self.weights.extend(padded)
        return vela.NpuAddressRange(region=WEIGHTS_REGION, address=start, length=len(padded))

    def _activation(self, op: EOp) -> vela.NpuActivation | None:
        out = self.program.tensors[op.output]
        low, high = op.params.get("act_min", -128), op.params.get("act_max", 127)
        if (low, high) == (-128, 127):
            return None
        activation = vela.NpuActivation(vela.NpuActivationOp.NONE_OR_RELU)
        activation.min = (low - out.zero_point) * out.scale if low > -128 else None
        activation.max = (high - out.zero_point) * out.scale if high < 127 else None
        return activation

    def _block_config(self, npu_op: vela.NpuBlockOperation) -> vela.NpuShape3D:
        with contextlib.redirect_stdout(io.StringIO()):  # Vela prints configuration notes
            configs = vela.npu_find_block_configs(npu_op, self.accelerator)
        if not configs:
            raise CodegenError(f"Vela found no block configuration for {npu_op.name}")
        return configs[0]

    def _weighted(self, op: EOp) -> vela.NpuBlockOperation:
        depthwise = op.kind == "depthwise"
        npu_op = vela.NpuConvDepthWiseOperation() if depthwise else vela.NpuConv2DOperation()
        npu_op.ifm = self.feature_map(op.inputs[0])
        npu_op.ofm = self.feature_map(op.output)
        _, kh, kw, _ = op.weights.shape
        p = op.params
        strides, dilation, padding = p.get("strides", [1, 1]), p.get("dilation", [1, 1]), p.get("padding", [0, 0, 0, 0])
        npu_op.kernel = vela.NpuKernel(kw, kh, strides[1], strides[0], dilation[1], dilation[0])
        npu_op.padding = vela.NpuPadding(*padding)
        npu_op.activation = self._activation(op)
        if depthwise:
            traversal = vela.NpuBlockTraversal.DEPTH_FIRST
        else:
            traversal = npu_op.block_traversal
        npu_op.name = op.name
        npu_op.block_config = self._block_config(npu_op)
        encoded = vela.npu_encode_weights(self.accelerator, op.weights, (dilation[1], dilation[0]), 8, npu_op.block_config.depth, depthwise, traversal)
        npu_op.weights = [self._blob(encoded)]
        in_scale, out_scale = self.program.tensors[op.inputs[0]].scale, self.program.tensors[op.output].scale
        bias = bytearray()
        for value, weight_scale in zip(op.bias, op.weight_scales):
            bias += vela.npu_encode_bias(np.int64(value), *quantise_scale(in_scale * float(weight_scale) / out_scale))
        npu_op.biases = [self._blob(bias)]
        return npu_op

    def _pool(self, op: EOp, source: int, target: vela.NpuFeatureMap, kind, pool=(1, 1), strides=(1, 1), padding=(0, 0, 0, 0)):
        npu_op = vela.NpuPoolingOperation(kind)
        npu_op.ifm = self.feature_map(source)
        npu_op.ofm = target
        npu_op.kernel = vela.NpuKernel(pool[1], pool[0], strides[1], strides[0])
        npu_op.padding = vela.NpuPadding(*padding)
        npu_op.activation = self._activation(op)
        npu_op.name = op.name
        npu_op.block_config = self._block_config(npu_op)
        return npu_op

    def lower_op(self, op: EOp) -> list[vela.NpuOperation]:
        if op.kind in ("conv", "depthwise", "fully_connected"):
            return [self._weighted(op)]
        if op.kind in ("maxpool", "avgpool"):
            kind = vela.NpuPoolingOp.MAX if op.kind == "maxpool" else vela.NpuPoolingOp.AVERAGE
            p = op.params
            return [self._pool(op, op.inputs[0], self.feature_map(op.output), kind, p["pool"], p["strides"], p["padding"])]
        if op.kind == "add":
            npu_op = vela.NpuElementWiseOperation(vela.NpuElementWiseOp.ADD)
            npu_op.ifm, npu_op.ifm2, npu_op.ofm = (self.feature_map(t) for t in (*op.inputs, op.output))
            npu_op.activation = self._activation(op)
            npu_op.name = op.name
            npu_op.block_config = self._block_config(npu_op)
            return [npu_op]
        # Concatenation along channels: each input is copied (rescaled by an identity pooling)
        # into its depth slice of the output, written with the output's strides.
        out = self.program.tensors[op.output]
        _, height, width, depth = out.shape
        strides = vela.NpuShape3D(height=width * depth, width=depth, depth=1)
        ops, offset = [], 0
        for source in op.inputs:
            channels = self.program.tensors[source].shape[-1]
            target = self.feature_map(op.output, vela.NpuShape3D(height, width, channels), offset, strides)
            ops.append(self._pool(op, source, target, vela.NpuPoolingOp.AVERAGE))
            offset += channels
        return ops

    def run(self) -> Lowered:
        segments, current, npu_ops = [], [], []
        for op in self.program.ops:
            if not op.on_npu:
                if current:
                    segments.append(current)
                current = []
                continue
            lowered = self.lower_op(op)
            current += lowered
            npu_ops += [(op, n) for n in lowered]
        if current:
            segments.append(current)
        streams = [vela.npu_generate_register_command_stream(ops, self.accelerator) for ops in segments]
        return Lowered(streams, bytes(self.weights), self.sram_bytes, estimate_performance(self.program, npu_ops, self.sram_bytes))


def lower(program: EProgram) -> Lowered:
    return _Lowering(program).run()


@functools.cache
def _architecture(accelerator: str):
    from ethosu.vela import architecture_features

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return architecture_features.ArchitectureFeatures(
            vela_config_files=None, accelerator_config=accelerator, system_config="internal-default",
            memory_mode="internal-default", max_blockdep=3, verbose_config=False, arena_cache_size=None,
        )


def estimate_performance(program: EProgram, npu_ops, sram_bytes: int) -> dict:
    """Vela's cycle estimate per NPU operation (compute cycles, its performance model), the
    peak scratch (SRAM) use of the feature maps, and the time at the core clock."""
    from ethosu.vela import npu_performance as perf
    from ethosu.vela.operation import Kernel, NpuBlockType, Op
    from ethosu.vela.shape4d import Shape4D
    from ethosu.vela.tensor import MemArea

    arch = _architecture(program.accelerator)
    kinds = {
        vela.NpuOperationType.Conv2D: (NpuBlockType.ConvolutionMxN, Op.Conv2DBias),
        vela.NpuOperationType.ConvDepthWise: (NpuBlockType.ConvolutionDepthWise, Op.DepthwiseConv2DBias),
        vela.NpuOperationType.Pooling: (NpuBlockType.Pooling, Op.AvgPool),
        vela.NpuOperationType.ElementWise: (NpuBlockType.ElementWise, Op.Add),
    }
    total, macs, by_kind = 0, 0, {}
    for op, npu_op in npu_ops:
        block_type, vela_op = kinds[npu_op.op_type]
        query = perf.PerformanceQuery(block_type)
        ifm, ofm = npu_op.ifm.shape, npu_op.ofm.shape
        query.ifm_shape = Shape4D(1, ifm.height, ifm.width, ifm.depth)
        query.ofm_shape = Shape4D(1, ofm.height, ofm.width, ofm.depth)
        if npu_op.ifm2 is not None:
            query.ifm2_shape = query.ifm_shape
        query.ifm_bits = query.ofm_bits = 8
        query.ifm_memory_area = query.ofm_memory_area = MemArea.Sram
        query.const_memory_area = MemArea.OffChipFlash
        kernel = npu_op.kernel or vela.NpuKernel(1, 1)
        query.kernel = Kernel(kernel.width, kernel.height, kernel.stride_x, kernel.stride_y, kernel.dilation_x, kernel.dilation_y)
        query.config = _arch_block_config(arch, block_type, query)
        cost = perf.measure_cycle_cost(arch, vela_op, Op.Relu if npu_op.activation else None, query)
        total += int(cost.op_cycles)
        macs += int(cost.op_macs)
        by_kind[op.kind] = by_kind.get(op.kind, 0) + int(cost.op_cycles)
    clock = float(arch.core_clock)
    return {"accelerator": program.accelerator, "cycles": total, "ms_at_clock": total / clock * 1e3, "clock_mhz": clock / 1e6,
            "macs": macs, "sram_bytes": sram_bytes, "cycles_by_operation": by_kind, "estimator": "Vela npu_performance"}


def _arch_block_config(arch, block_type, query):
    from ethosu.vela.architecture_allocator import find_block_config
    from ethosu.vela.ethos_u55_regs.ethos_u55_regs import resampling_mode

    with contextlib.redirect_stdout(io.StringIO()):
        return find_block_config(arch, block_type, query.ofm_shape, query.ifm_shape, query.ifm2_shape, False, 8, query.kernel, 0, False,
                                 resampling_mode.NONE)
