"""The `ethos_u` backend: Arm Ethos-U55/U65 NPUs, compiled with Vela (`ethos-u-vela`).

Regions are converted to NHWC, quantized to int8 (per-channel weights, calibrated at compile
time), lowered to Vela NPU operations whose weights Vela encodes, and turned into register
command streams by Vela. No NPU is available here: a reference int8 executor (TFLite semantics)
runs the region, and Vela's performance model estimates its cycles.

Data sheet (Vela's constraints for Ethos-U): convolution with strides up to 3, dilated kernels up
to 64 high and 64x64 in area; depthwise convolution with a depth multiplier of 1; max and
average pooling with strides up to 3 and windows up to 8x8 (256x256 without padding, as for
global pooling); element-wise add of two tensors of one shape; channel concatenation; fully
connected layers; ReLU and ReLU6 fused; tensor dimensions up to 65535; int8 throughout.
"""

from __future__ import annotations

import tvm

from byoc.annotate.int8_cnn import declare_int8_cnn
from byoc.annotate.predicates import shape
from byoc.backend import Backend, Limits, register_backend
from byoc.backend.tolerance import INT8
from byoc.flow import partition_for
from byoc.processing import LayoutPass, QuantizationConfig, QuantizePass
from byoc.vendors.ethos_u import vela_lowering  # noqa: F401 (Vela builds the streams: without it the vendor is missing, with its extra)
from byoc.vendors.ethos_u.runtime import ETHOS_U_PAYLOAD, EthosUSettings


# -------------------------------------------------------------------- data sheet
def _conv(call) -> str | None:
    attrs = call.attrs
    kernel = shape(call.args[1])[2:]
    channels = shape(call.args[0])[1]
    if attrs.groups > 1 and not (attrs.groups == channels == shape(call)[1]):
        return "grouped convolution other than depthwise with depth multiplier 1"
    if max(attrs.strides) > 3:
        return f"stride {max(attrs.strides)} is over 3"
    dilated = [(k - 1) * d + 1 for k, d in zip(kernel, attrs.dilation)]
    if dilated[0] > 64 or dilated[0] * dilated[1] > 64 * 64:
        return f"dilated kernel {dilated[0]}x{dilated[1]} is over 64 high or 64x64 in area"
    return None


def _pool(call) -> str | None:
    attrs = call.attrs
    window = tuple(int(v) for v in attrs.pool_size)
    if max(attrs.strides) > 3:
        return f"stride {max(attrs.strides)} is over 3"
    limit = 8 if any(int(p) for p in attrs.padding) else 256
    if max(window) > limit:
        return f"window {window} is over {limit}x{limit}"
    return None


def ethos_u_backend() -> Backend:
    """The Ethos-U backend. Vela's operator limits are the same on every configuration; the
    configuration (its settings) decides the command streams and the performance estimate."""
    backend = Backend(
        name="ethos_u",
        priority=8,
        description="Arm Ethos-U NPU (Vela command streams; reference int8 executor, no NPU here)",
        limits=Limits(dtypes=("float32",), layouts=("NCHW",), constant_weights=True, max_rank=4,
                      quantized=("int8", "uint8"), int8_weights=False),
        processing=[LayoutPass(), QuantizePass(QuantizationConfig(per_channel=True, symmetric=False))],
        codegen=ETHOS_U_PAYLOAD,
        settings=EthosUSettings(),
        tolerance=INT8,
    )

    declare_int8_cnn(backend, _conv, _pool, mean_window=256)
    return backend


register_backend(ethos_u_backend(), origin="byoc (built-in)")


def partition_for_ethos_u(mod: tvm.IRModule, **options) -> tvm.IRModule:
    """`byoc.partition_for(mod, "ethos_u", **options)`: `accelerator` ("ethos-u55-32" ...
    "ethos-u65-512"), `calibration` (a list of model inputs; required),
    `num_calibration_samples`, `calibration_method`, and cost rules."""
    return partition_for(mod, "ethos_u", **options)
