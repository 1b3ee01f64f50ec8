"""What quantized CNN accelerators (a DPU, an NPU) take, declared once: convolutions with bias
and ReLU/ReLU6 fused, dense layers with constant weights, residual adds, pooling, global average
pooling, channel concatenation and flattening. Each device brings its own limits: the checks on
convolutions and pooling windows, and the largest global pooling it runs.

A quantized model's own quantize and dequantize ops are taken too, one scale and zero point per
tensor: the region then computes with the model's scales (byoc.processing.adopt) instead of
calibrating again."""

from __future__ import annotations

from collections.abc import Callable

from byoc.annotate.patterns import fused_pattern
from byoc.annotate.predicates import (
    channel_concat,
    constant_channel_bias,
    flatten_only,
    fused_relu6,
    global_average_pool,
    same_shape_add,
    two_dimensional_weights,
)
from byoc.backend.spec import Backend
from byoc.ir.types import constant_array, is_tensor_constant

OpCheck = Callable[..., "str | None"]


def per_tensor_quantization(call) -> str | None:
    """A quantize or dequantize of activations the device can take: one constant scale and zero point."""
    if not all(is_tensor_constant(a) for a in call.args[1:3]):
        return "scale and zero point must be constants"
    if constant_array(call.args[1]).size != 1 or constant_array(call.args[2]).size != 1:
        return "activations quantized per channel; the device takes one scale and zero point per tensor"
    return None


def declare_int8_cnn(backend: Backend, conv: OpCheck, pool: OpCheck, mean_window: int) -> None:
    def fused_conv(match):
        return conv(match["root"]) or constant_channel_bias(match) or fused_relu6(match)

    backend.pattern("conv2d_bias_act", *fused_pattern("relax.nn.conv2d", bias=True, activation=("relax.nn.relu", "relax.clip")),
                    check=fused_conv)
    backend.pattern("conv2d_bias", *fused_pattern("relax.nn.conv2d", bias=True), check=lambda m: conv(m["root"]) or constant_channel_bias(m))
    backend.pattern("dense_bias_relu", *fused_pattern("relax.matmul", bias=True, activation="relax.nn.relu", constant_weight=True),
                    check=constant_channel_bias)
    backend.pattern("dense_bias", *fused_pattern("relax.matmul", bias=True, constant_weight=True), check=constant_channel_bias)
    backend.pattern("add_relu", *fused_pattern("relax.add", activation="relax.nn.relu"), check=lambda m: same_shape_add(m["root"]))
    backend.supports("relax.nn.conv2d", check=conv)
    backend.supports("relax.matmul", check=two_dimensional_weights)
    backend.supports("relax.nn.max_pool2d", "relax.nn.avg_pool2d", check=pool)
    backend.supports("relax.mean", check=global_average_pool(mean_window))
    backend.supports("relax.add", check=same_shape_add)
    backend.supports("relax.concat", check=channel_concat)
    backend.supports("relax.reshape", check=flatten_only)
    backend.supports("relax.quantize", "relax.dequantize", check=per_tensor_quantization)
