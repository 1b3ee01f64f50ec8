"""The `dnnl` backend: Intel oneDNN (v3) on the CPU, through C code generation.

Data sheet: float32, NCHW activations and OIHW weights. Convolutions (grouped and depthwise
included; one with a channel multiplier as a depthwise one over its input repeated, see
`channel_multiplier.py`) with bias, residual add and ReLU/clip fused as post-ops; transposed
convolutions (deconvolutions) with bias and ReLU/clip; matrix products (constant or
activation weights, batched) with bias and ReLU, GELU or a residual add fused, or with constant
scales and added masks (attention scores); max and average pooling; mean reductions over any axes,
all by default (global pooling among them); element-wise ops and broadcasting binary ops; softmax,
layer normalisation (and instance normalisation as TVM decomposes it, and RMSNorm, and group
normalisation over the axes after the channels), rotary embeddings, GELU (erf form), HardSwish
and HardSigmoid (as TVM's importer writes them, one primitive each),
concatenation, strided slices, broadcasts, repeats, constant padding, selections by a constant mask,
reshape and transpose (views where their readers allow). Regions without MACs stay on the host: a
reorder-only region costs more than it saves.

Quantized models (QDQ, with u8 or s8 activations and per-tensor scales, and s8 weights with a
scale per output channel and zero point 0) compute in int8 with the model's own scales (s8
activations as u8, their zero point moved 128 up: exact, and x86's fast form): quantized
convolutions and dense layers with bias and ReLU/clip, a residual add fused into its convolution,
residual adds, constant biases and scales, GELU and the other element-wise ops, layer norms,
products and sums with one int8 operand, attention's products of two activations and max
pooling on the int8 data, moves of int8 data (reshapes, transposes, slices, broadcasts), float
products and softmax writing their quantized result as int8, and quantize/dequantize (and
requantization) as reorders; a dense layer or convolution of a `quantize_dynamic` model, its
input quantized per call, as one kernel (`int8.py`). Without VNNI, the int8 kernels whose 16-bit
pair sums would saturate (`int8.saturates`) are computed in float32 from the model's own weights
and scales (byoc.processing.saturation), unless the build option `int8_without_vnni` is "int8".
"""

from __future__ import annotations

import tvm
from tvm.relax.dpl import wildcard

from byoc.annotate import fused_pattern, idioms
from byoc.annotate.predicates import all_of
from byoc.backend import Backend, CostRules, Limits, register_backend
from byoc.codegen_c.onednn import ELTWISE_OPS, RESHAPES, emitters
from byoc.flow import partition_for
from byoc.processing import Int8InFloat32Pass, UnsignedActivationsPass
from byoc.vendors.dnnl import int8
from byoc.vendors.dnnl.channel_multiplier import ChannelMultiplierPass
from byoc.vendors.dnnl.predicates import (
    activation_product,
    binary_broadcast,
    concat_same_rank,
    constant_pad,
    conv_channels_first,
    deconvolution_nchw,
    dense_constant_weight,
    dense_residual,
    float_cast,
    fused_conv,
    fused_deconvolution,
    group_norm_channels_first,
    layer_norm_last_axis,
    matmul_shapes,
    onednn_resampling,
    pool_nchw,
    power_scalar,
    repeat_along_an_axis,
    scalar_selection,
    sum_axes,
    take_constant_index,
    window_slice,
)
from byoc.vendors.dnnl.runtime import RUNTIME


def _float_composite(pattern: str) -> str | None:
    """The float composite of an int8 one whose float ops stay consecutive once its quantizes and
    dequantizes run apart (`qconv2d_bias_act_float` -> `conv2d_bias_act`); None for the others
    (a fused residual reads its operand through a dequantize, a product of activations has none)."""
    name = pattern.removeprefix("dnnl.q").removesuffix("_float")
    return f"dnnl.{name}" if "_add" not in name and any(p.name == name for p in dnnl.patterns) else None


# The kernel library is oneDNN's C API (byoc.codegen_c.onednn); each pattern and op below binds
# its emitter as it is declared.
dnnl = Backend(
    name=RUNTIME.name,
    codegen=RUNTIME.codegen,
    priority=10,
    description="Intel oneDNN on the CPU (C API, fused post-ops, blocked layouts inside regions)",
    limits=Limits(dtypes=("float32",), max_rank=6, quantized=("int8", "uint8"), run_time_conditions=True, cast_dtypes=("float16",)),
    symbolic_shapes=True,  # one library for every shape: primitives made again when the dimensions they read change
    cost=CostRules(fallback_without_macs=True),
    # convolutions with a channel multiplier made depthwise (channel_multiplier); int8 activations
    # computed as uint8, exactly (byoc.processing.unsigned); then, on a CPU without
    # VNNI, the int8 kernels that would saturate computed in float32 (byoc.processing.saturation)
    processing=[ChannelMultiplierPass(), UnsignedActivationsPass(), Int8InFloat32Pass(int8.saturates, _float_composite,
                                                       lambda settings: settings.int8_without_vnni == "int8", "VNNI for oneDNN",
                                                       "int8_without_vnni")],
    settings=RUNTIME.settings,
    unavailable=RUNTIME.unavailable,
)

# ---------------------------------------------------------------- composites
int8.declare(dnnl)
_ACTIVATIONS = ("relax.nn.relu", "relax.clip", "relax.nn.gelu", "relax.nn.gelu_tanh")
_CONVOLUTIONS = {"conv2d": "relax.nn.conv2d", "conv1d": "relax.nn.conv1d"}
_conv = emitters.convolution
for _name, _op in _CONVOLUTIONS.items():
    dnnl.pattern(f"{_name}_bias_add_relu", *idioms.conv_with_residual(_op, "relax.nn.relu", False), check=fused_conv, emit=_conv)
    dnnl.pattern(f"{_name}_bias_add_relu_swapped", *idioms.conv_with_residual(_op, "relax.nn.relu", True), check=fused_conv, emit=_conv)
    dnnl.pattern(f"{_name}_bias_add", *idioms.conv_with_residual(_op, None, False), check=fused_conv, emit=_conv)
    dnnl.pattern(f"{_name}_bias_add_swapped", *idioms.conv_with_residual(_op, None, True), check=fused_conv, emit=_conv)
    dnnl.pattern(f"{_name}_bias_act", *fused_pattern(_op, bias=True, activation=_ACTIVATIONS, constant_weight=True), check=fused_conv,
                 emit=_conv)
    dnnl.pattern(f"{_name}_bias", *fused_pattern(_op, bias=True, constant_weight=True), check=fused_conv, emit=_conv)
    dnnl.pattern(f"{_name}_act", *fused_pattern(_op, activation=_ACTIVATIONS, constant_weight=True), check=fused_conv, emit=_conv)
_deconv = emitters.deconvolution
dnnl.pattern("conv2d_transpose_bias_act", *fused_pattern("relax.nn.conv2d_transpose", bias=True, activation=_ACTIVATIONS, constant_weight=True),
             check=fused_deconvolution, emit=_deconv)
dnnl.pattern("conv2d_transpose_bias", *fused_pattern("relax.nn.conv2d_transpose", bias=True, constant_weight=True),
             check=fused_deconvolution, emit=_deconv)
_dense = emitters.matmul
for _form in idioms.GELU_FORMS:
    dnnl.pattern(f"dense_bias_{_form}", *idioms.dense_bias_then(_form), check=all_of(dense_constant_weight, idioms.is_gelu(_form)),
                 emit=_dense)
dnnl.pattern("dense_bias_add", *idioms.dense_bias_then("add"), check=dense_residual, emit=_dense)
dnnl.pattern("scores_scaled_add", *idioms.scores(True, 1), check=activation_product, emit=_dense)
dnnl.pattern("scores_scaled", *idioms.scores(True, 0), check=activation_product, emit=_dense)
for _op in ("divide", "multiply"):
    dnnl.pattern(f"matmul_{_op}_add", *idioms.scaled_scores(f"relax.{_op}", 1), check=activation_product, emit=_dense)
    dnnl.pattern(f"matmul_{_op}", *idioms.scaled_scores(f"relax.{_op}"), check=activation_product, emit=_dense)
dnnl.pattern("matmul_add_add", *idioms.scores(False, 2), check=activation_product, emit=_dense)
dnnl.pattern("matmul_add", *idioms.scores(False, 1), check=activation_product, emit=_dense)
dnnl.pattern("dense_bias_act", *fused_pattern("relax.matmul", bias=True, activation=_ACTIVATIONS, constant_weight=True),
             check=dense_constant_weight, emit=_dense)
dnnl.pattern("dense_bias", *fused_pattern("relax.matmul", bias=True, constant_weight=True), check=dense_constant_weight, emit=_dense)
for _form, (_build, _) in idioms.GELU_FORMS.items():
    dnnl.pattern(_form, *_build(wildcard()), check=idioms.is_gelu(_form), emit=emitters.eltwise)
for _form, (_build, _check) in idioms.HARD_FORMS.items():
    dnnl.pattern(_form, *_build(wildcard()), check=_check, emit=emitters.eltwise)
dnnl.pattern("normalized", *idioms.instance_normalized(), check=idioms.is_instance_normalized, emit=emitters.layer_norm)
dnnl.pattern("rms_norm", *idioms.rms_norm(weighted=True), check=idioms.is_rms_norm, emit=emitters.rms_norm)
dnnl.pattern("rms_normalized", *idioms.rms_norm(weighted=False), check=idioms.is_rms_norm, emit=emitters.rms_norm)
dnnl.pattern("rotary", *idioms.rotary(), check=idioms.is_rotary, emit=emitters.rotary)
dnnl.pattern("softmax_nan_to_zero", *idioms.softmax_nan_to_zero(), check=idioms.is_softmax_nan_to_zero, emit=emitters.softmax)
dnnl.pattern("softmax_masked_rows_to_zero", *idioms.softmax_masked_rows_to_zero(), check=idioms.is_softmax_masked_rows_to_zero, emit=emitters.softmax)
int8.declare_results(dnnl)

# ------------------------------------------------------------------ single ops
dnnl.supports(*_CONVOLUTIONS.values(), check=conv_channels_first, emit=_conv)
dnnl.supports("relax.nn.conv2d_transpose", check=deconvolution_nchw, emit=_deconv)
dnnl.supports("relax.matmul", check=matmul_shapes, emit=_dense)
dnnl.supports("relax.nn.max_pool2d", "relax.nn.avg_pool2d", check=pool_nchw, emit=emitters.pooling)
dnnl.supports("relax.image.resize2d", check=onednn_resampling, emit=emitters.resize)
dnnl.supports("relax.mean", emit=emitters.reduction)
dnnl.supports("relax.sum", check=sum_axes, emit=emitters.reduction)
dnnl.supports("relax.add", "relax.subtract", "relax.multiply", "relax.divide", check=binary_broadcast, emit=emitters.binary)
dnnl.supports("relax.power", check=power_scalar, emit=emitters.eltwise)
dnnl.supports(*ELTWISE_OPS, emit=emitters.eltwise)
dnnl.supports("relax.nn.softmax", emit=emitters.softmax)
dnnl.supports("relax.concat", check=concat_same_rank, emit=emitters.concat)
dnnl.supports("relax.split", emit=emitters.split)
dnnl.supports("relax.take", check=take_constant_index, emit=emitters.take)
dnnl.supports("relax.nn.layer_norm", check=layer_norm_last_axis, emit=emitters.layer_norm)
dnnl.supports("relax.nn.group_norm", check=group_norm_channels_first, emit=emitters.group_norm)
dnnl.supports(*RESHAPES, emit=emitters.reshape)
dnnl.supports("relax.strided_slice", check=window_slice, emit=emitters.strided_slice)
dnnl.supports("relax.broadcast_to", emit=emitters.broadcast_to)
dnnl.supports("relax.repeat", check=repeat_along_an_axis, emit=emitters.repeat)
dnnl.supports("relax.nn.pad", check=constant_pad, emit=emitters.pad)
dnnl.supports("relax.where", check=scalar_selection, emit=emitters.select)
dnnl.supports("relax.permute_dims", emit=emitters.permute_dims)
dnnl.supports("relax.astype", check=float_cast, emit=emitters.reorder)

register_backend(dnnl, origin="byoc (built-in)")


def partition_for_dnnl(mod: tvm.IRModule, **options) -> tvm.IRModule:
    """Partition for oneDNN; `byoc.partition_for(mod, "dnnl", **options)`; options are cost rules."""
    return partition_for(mod, "dnnl", **options)
