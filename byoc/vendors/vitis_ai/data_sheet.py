"""The `vitis_ai` backend: a simulated Xilinx DPU (Vitis AI), int8 with power-of-two scales.

The real Vitis AI stack does not install here, so the device is a simulator (see `simulator`)
that runs the DPU program byoc generates, with int8 data and int32 accumulation, and estimates
cycles with a stated throughput model per DPU configuration (see `configs`).

Data sheet (public DPU data, UG1414 / PG338): convolution with kernels up to 16x16, strides up to
8, padding under the kernel size; depthwise convolution (strides up to 4) on edge DPUs
(DPUCZDX8G) only; max and average pooling with windows up to 8x8; element-wise add; channel
concatenation; ReLU and ReLU6; fully connected layers; flatten. Weights and activations int8,
per-tensor power-of-two scales calibrated at compile time, each activation's by least error as
Vitis AI's quantizer does.
"""

from __future__ import annotations

import tvm

from byoc.annotate.int8_cnn import declare_int8_cnn
from byoc.annotate.predicates import relu6, shape
from byoc.backend import Backend, CostRules, Limits, register_backend
from byoc.backend.tolerance import INT8
from byoc.flow import partition_for
from byoc.processing import QuantizationConfig, QuantizePass
from byoc.vendors.vitis_ai.configs import DpuConfig, dpu_config
from byoc.vendors.vitis_ai.runtime import DPU_PROGRAM, VitisAiSettings


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


def vitis_ai_backend(settings: VitisAiSettings | None = None) -> Backend:
    """The backend for one DPU configuration (its limits depend on it). `single_region` keeps
    only the region with the most MACs, as the BYOC paper's Vitis AI integration does."""
    settings = settings or VitisAiSettings()
    config = dpu_config(settings.dpu)
    conv = _conv_limits(config)
    backend = Backend(
        name="vitis_ai",
        priority=8,
        description=f"simulated Xilinx {config.name}, {config.description}",
        limits=Limits(dtypes=("float32",), layouts=("NCHW",), constant_weights=True, quantized=("int8", "uint8"), int8_weights=False),
        cost=CostRules(max_regions=1) if settings.single_region else CostRules(),
        # Vitis AI's own quantizer picks each fixed-point position by least error (`min_diffs` here), which
        # lowers the error of most models but ties a classifier's saturated top scores (byoc.processing.ranges):
        # until calibration keeps model outputs unclipped, minmax stays the default and min_diffs an option.
        processing=[QuantizePass(QuantizationConfig(power_of_two=True, per_channel=False))],
        codegen=DPU_PROGRAM,
        settings=settings,
        configure=vitis_ai_backend,
        tolerance=INT8,
    )

    declare_int8_cnn(backend, conv, _pool_limits, mean_window=8)
    backend.supports("relax.nn.relu")
    backend.supports("relax.clip", check=relu6)
    return backend


register_backend(vitis_ai_backend(), origin="byoc (built-in)")


def partition_for_vitis_ai(mod: tvm.IRModule, **options) -> tvm.IRModule:
    """`byoc.partition_for(mod, "vitis_ai", **options)`: `dpu` ("DPUCZDX8G", "DPUCZDX8G-B1024",
    "DPUCAHX8H", ...), `single_region`, `calibration` (a list of model inputs; required),
    `num_calibration_samples`, `calibration_method`, and cost rules."""
    return partition_for(mod, "vitis_ai", **options)
