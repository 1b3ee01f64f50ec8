"""The `vitis_ai` backend: a simulated Xilinx DPU (Vitis AI), int8 with power-of-two scales.

The real Vitis AI stack does not install here, so the device is a simulator (see `simulator`)
that runs the DPU program byoc generates, with int8 data and int32 accumulation, and estimates
cycles with a stated throughput model per DPU configuration (see `configs`).

Data sheet (public DPU data, UG1414 / PG338): convolution with kernels up to 16x16, strides up to
8, padding under the kernel size; depthwise convolution (strides up to 4) on edge DPUs
(DPUCZDX8G) only; max and average pooling with windows up to 8x8; element-wise add; channel
concatenation; ReLU and ReLU6; fully connected layers; flatten. Weights and activations int8,
per-tensor power-of-two scales calibrated at compile time.
"""

from __future__ import annotations

import struct

import tvm

from byoc.annotate import fused_pattern
from byoc.annotate.predicates import (
    channel_concat,
    flatten_only,
    fused_relu6,
    global_average_pool,
    relu6,
    same_shape_add,
    shape,
    two_dimensional_weights,
)
from byoc.backend import Backend, Limits, register_backend
from byoc.custom_formats import CustomFormat
from byoc.errors import CustomFormatError
from byoc.partition.pipeline import partition_for
from byoc.partition.report import report
from byoc.processing import QuantizationConfig, QuantizePass
from byoc.processing.calibration import TARGET_ATTR, calibrate_for_target
from byoc.vendors.vitis_ai import bitstream
from byoc.vendors.vitis_ai.configs import DpuConfig, dpu_config
from byoc.vendors.vitis_ai.program import compile_program
from byoc.vendors.vitis_ai.simulator import DpuSimulator, estimate_cycles

DEFAULT_DPU = "DPUCZDX8G"


# ------------------------------------------------------------------ binary format
def _target(options: dict) -> str | None:
    name = options.get("dpu") or options.get(TARGET_ATTR)
    return dpu_config(name).name if name else None


def _serialize(graph, constants, options) -> bytes:
    return bitstream.encode(compile_program(graph, constants, _target(options) or dpu_config(DEFAULT_DPU).name))


def _deserialize(payload: bytes, options) -> DpuSimulator:
    try:
        return DpuSimulator(bitstream.decode(payload))
    except (struct.error, ValueError, IndexError) as error:
        raise CustomFormatError(f"the DPU program is damaged: {error}") from error


def _describe(payload: bytes, options) -> dict:
    program = bitstream.decode(payload)
    weights = sum(i.weights.nbytes for i in program.instructions if i.weights is not None)
    return {**estimate_cycles(program, dpu_config(program.target)), "instructions": len(program.instructions), "weight_bytes": weights}


DPU_PROGRAM = CustomFormat(name="dpu-program", version=1, serialize=_serialize, deserialize=_deserialize, config=_target, describe=_describe)


# -------------------------------------------------------------------- data sheet
def _conv_limits(config: DpuConfig):
    def check(call) -> str | None:
        attrs = call.attrs
        kernel = shape(call.args[1])[2:]
        channels = shape(call.args[0])[1]
        depthwise = attrs.groups > 1 and attrs.groups == channels == shape(call)[1]
        if attrs.groups > 1 and not depthwise:
            return "grouped convolution other than depthwise"
        if depthwise and not config.depthwise:
            return f"{config.family} has no depthwise convolution engine"
        if max(kernel) > 16:
            return f"kernel {kernel[0]}x{kernel[1]} is over 16x16"
        if max(attrs.strides) > (4 if depthwise else 8):
            return f"stride {max(attrs.strides)} is over {4 if depthwise else 8}"
        if any(p >= k for p, k in zip(attrs.padding, [*kernel, *kernel])):
            return "padding must be smaller than the kernel"
        return None

    return check


def _pool_limits(call) -> str | None:
    attrs = call.attrs
    if max(attrs.pool_size) > 8 or max(attrs.strides) > 8:
        return f"pooling window {tuple(attrs.pool_size)} or stride {tuple(attrs.strides)} is over 8"
    if call.op.name == "relax.nn.avg_pool2d" and attrs.pool_size[0] != attrs.pool_size[1]:
        return "average pooling needs a square window"
    return None


def vitis_ai_backend(config: DpuConfig) -> Backend:
    """The backend for one DPU configuration (its limits depend on it)."""
    conv = _conv_limits(config)
    backend = Backend(
        name="vitis_ai",
        codegen="custom",
        priority=8,
        description=f"simulated Xilinx {config.name}, {config.description}",
        limits=Limits(dtypes=("float32",), layouts=("NCHW",), constant_weights=True),
        processing=[QuantizePass(QuantizationConfig(power_of_two=True, per_channel=False))],
        custom_format=DPU_PROGRAM,
        configure=lambda target: vitis_ai_backend(dpu_config(target)),
    )

    def fused_conv(match):
        return conv(match["root"]) or fused_relu6(match)

    backend.pattern("conv2d_bias_act", *fused_pattern("relax.nn.conv2d", bias=True, activation=("relax.nn.relu", "relax.clip")), check=fused_conv)
    backend.pattern("conv2d_bias", *fused_pattern("relax.nn.conv2d", bias=True), check=lambda m: conv(m["root"]))
    backend.pattern("dense_bias_relu", *fused_pattern("relax.matmul", bias=True, activation="relax.nn.relu", constant_weight=True))
    backend.pattern("dense_bias", *fused_pattern("relax.matmul", bias=True, constant_weight=True))
    backend.pattern("add_relu", *fused_pattern("relax.add", activation="relax.nn.relu"), check=lambda m: same_shape_add(m["root"]))
    backend.supports("relax.nn.conv2d", check=conv)
    backend.supports("relax.matmul", check=two_dimensional_weights)
    backend.supports("relax.nn.max_pool2d", "relax.nn.avg_pool2d", check=_pool_limits)
    backend.supports("relax.mean", check=global_average_pool(8))
    backend.supports("relax.add", check=same_shape_add)
    backend.supports("relax.nn.relu")
    backend.supports("relax.clip", check=relu6)
    backend.supports("relax.concat", check=channel_concat)
    backend.supports("relax.reshape", check=flatten_only)
    return backend


register_backend(vitis_ai_backend(dpu_config(DEFAULT_DPU)), origin="byoc (built-in)")


def _largest_region_only(original: tvm.IRModule, partitioned: tvm.IRModule, backend: Backend, options: dict) -> tvm.IRModule:
    """Partition again, keeping only the region with the most MACs of the first partition."""
    regions = report(partitioned).regions
    if len(regions) <= 1:
        return partitioned
    keep = max(regions, key=lambda r: r.macs).nodes[0]
    user_filter = options.pop("region_filter", None)

    def only_largest(summary):
        if summary.nodes[0] != keep:
            return "the single-region integration keeps only the region with the most MACs"
        return user_filter(summary) if user_filter else None

    return partition_for(original, backend, region_filter=only_largest, **options)


def partition_for_vitis_ai(
    mod: tvm.IRModule,
    dpu: str = DEFAULT_DPU,
    calibration=None,
    num_calibration_samples: int | None = None,
    single_region: bool = False,
    **options,
) -> tvm.IRModule:
    """Partition for a DPU configuration ("DPUCZDX8G", "DPUCZDX8G-B1024", "DPUCAHX8H", ...) and
    calibrate its regions on `calibration` (a list of model inputs, by name or position) for
    int8 with power-of-two scales. `single_region` keeps only the region with the most MACs, as
    the Vitis AI integration of the BYOC paper does. Other options are cost rules."""
    config = dpu_config(dpu)
    backend = vitis_ai_backend(config)
    partitioned = partition_for(mod, backend, **options)
    if single_region:
        partitioned = _largest_region_only(mod, partitioned, backend, dict(options))
    return calibrate_for_target(partitioned, backend, config.name, calibration, num_calibration_samples)
