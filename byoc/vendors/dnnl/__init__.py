"""The `dnnl` backend: Intel oneDNN (v3) on the CPU, through C code generation.

Data sheet: float32, NCHW activations and OIHW weights. Convolutions (grouped and depthwise
included) with bias, residual add and ReLU/clip fused as post-ops; matrix products (constant or
activation weights, batched) with bias and ReLU, GELU or a residual add fused, or with
constant scales and added masks (attention scores); max and average pooling; mean reductions
over any axes, all by default (global pooling among them); element-wise ops and broadcasting
binary ops; softmax, layer normalisation (and instance normalisation as TVM decomposes it, and
RMSNorm), rotary embeddings, GELU (erf form), concatenation, strided slices, broadcasts,
constant padding, selections by a constant mask, reshape and transpose (views where their
readers allow). Regions without MACs stay on the host: a reorder-only region costs more than
it saves.

Quantized models (QDQ, with u8 or s8 activations and per-tensor scales, and s8 weights with a
scale per output channel and zero point 0) compute in int8 with the model's own scales (s8
activations as u8, their zero point moved 128 up: exact, and x86's fast form): quantized
convolutions and dense layers with bias and ReLU/clip, a residual add fused into its convolution,
residual adds, constant biases and scales, GELU and the other element-wise ops, layer norms,
products and sums with one int8 operand, attention's products of two activations and max
pooling on the int8 data, moves of int8 data (reshapes, transposes, slices, broadcasts), float
products and softmax writing their quantized result as int8, and quantize/dequantize (and
requantization) as reorders; a dense layer or convolution of a `quantize_dynamic` model, its
input quantized per call, as one kernel (`int8.py`).
"""

from __future__ import annotations

import math

import tvm
from tvm.relax.dpl import is_const, is_op, is_tuple, wildcard

from byoc.annotate import fused_pattern
from byoc.backend import Backend, CostRules, Limits, Option, register_backend
from byoc.codegen_c import CLibrary
from byoc.flow import partition_for
from byoc.processing import UnsignedActivationsPass
from byoc.vendors.dnnl import emitters, int8, library, threads
from byoc.vendors.dnnl.predicates import (
    activation_product,
    binary_broadcast,
    concat_same_rank,
    constant_pad,
    conv_channels_first,
    dense_constant_weight,
    dense_residual,
    expected_constants,
    float_cast,
    fused_conv,
    layer_norm_last_axis,
    masked_rows_to_zero,
    matmul_shapes,
    nan_to_zero,
    normalized_last_axis,
    pool_nchw,
    power_scalar,
    rms_normalized,
    rotary_halves,
    scalar_selection,
    take_constant_index,
    trailing_reduction,
    window_slice,
)

# The kernel library; each pattern and op below binds its emitter as it is declared.
onednn = CLibrary(
    name="onednn",
    version=library.version() if library.installed() else "not installed",
    headers=["oneapi/dnnl/dnnl.h", "math.h", "stdio.h"],
    include_dirs=lambda: [library.include_dir()],
    library_dirs=library.library_dirs,
    libraries=list(library.LIBRARIES),
    prologue=library.PROLOGUE,
    ownership=library.OWNERSHIP,
    bind_buffer=library.bind_buffer,
    views=emitters.VIEWS,
    runtime_setup=threads.limit_threads,
)

dnnl = Backend(
    name="dnnl",
    codegen=onednn,
    priority=10,
    description="Intel oneDNN on the CPU (C API, fused post-ops, blocked layouts inside regions)",
    limits=Limits(dtypes=("float32",), max_rank=6, quantized=("int8", "uint8"), run_time_conditions=True, cast_dtypes=("float16",)),
    symbolic_shapes=True,  # one library for every shape: primitives made again when the dimensions they read change
    cost=CostRules(fallback_without_macs=True),
    processing=[UnsignedActivationsPass()],  # int8 activations computed as uint8, exactly (byoc.processing.unsigned)
    build_options=[Option("layout", "activation layouts inside a region: follow the producer's, let each primitive "
                          "choose, or follow only in regions with a grouped convolution (auto)", default="auto",
                          choices=emitters.LAYOUT_POLICIES)],
    unavailable=lambda: None if library.installed() else f"oneDNN is not installed ({library.RUNTIME_PACKAGE}): pip install 'byoc[dnnl]'",
)

# ---------------------------------------------------------------- composites
int8.declare(dnnl)
_ACTIVATIONS = ("relax.nn.relu", "relax.clip", "relax.nn.gelu", "relax.nn.gelu_tanh")
_CONVOLUTIONS = {"conv2d": "relax.nn.conv2d", "conv1d": "relax.nn.conv1d"}


def _conv_with_residual(op: str, activation: str | None, residual_first: bool):
    # One pattern per operand order rather than an OR: FuseOpsByPattern checks only the first
    # alternative that matches, and a rejected one (say, the other operand is a conv whose
    # output is read elsewhere) would hide the one that fits.
    conv = is_op(op)(wildcard(), is_const())
    biased = is_op("relax.add")(conv, is_const())
    residual = wildcard()
    added = is_op("relax.add")(residual, biased) if residual_first else is_op("relax.add")(biased, residual)
    out = is_op(activation)(added) if activation else added
    return out, {"root": conv, "residual": residual}


def _constants(*names: str) -> dict:
    return {name: is_const() for name in names}


# GELU as exporters write it, each form fused as one oneDNN element-wise op (the algorithm is
# in `emitters.GELU_FORMS`); a form's check holds its constants to their values.
def _gelu_erf(x):
    """0.5 * x * (1 + erf(x / sqrt(2))): torch's decomposition, the zoo's BERT."""
    c = _constants("sqrt2", "one", "half")
    one_plus = is_op("relax.add")(is_op("relax.erf")(is_op("relax.divide")(x, c["sqrt2"])), c["one"])
    half_x = is_op("relax.multiply")(x, c["half"])
    return is_op("relax.multiply")(half_x, one_plus), {"root": half_x, **c}


def _gelu_erf_half_last(x):
    """x * (1 + erf(x / sqrt(2))) * 0.5: torch's TorchScript exporter."""
    c = _constants("sqrt2", "one", "half")
    divided = is_op("relax.divide")(x, c["sqrt2"])
    one_plus = is_op("relax.add")(is_op("relax.erf")(divided), c["one"])
    return is_op("relax.multiply")(is_op("relax.multiply")(x, one_plus), c["half"]), {"root": divided, **c}


def _gelu_tanh(x):
    """0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))): GPT-2's NewGELU."""
    c = _constants("half", "cube", "coef", "scale", "one")
    half_x = is_op("relax.multiply")(x, c["half"])
    cubed = is_op("relax.multiply")(is_op("relax.power")(x, c["cube"]), c["coef"])
    inner = is_op("relax.multiply")(is_op("relax.add")(x, cubed), c["scale"])
    one_plus = is_op("relax.add")(is_op("relax.tanh")(inner), c["one"])
    return is_op("relax.multiply")(half_x, one_plus), {"root": half_x, **c}


_GELU_FORMS = {
    "gelu": (_gelu_erf, {"sqrt2": math.sqrt(2.0), "one": 1.0, "half": 0.5}),
    "gelu_erf_half_last": (_gelu_erf_half_last, {"sqrt2": math.sqrt(2.0), "one": 1.0, "half": 0.5}),
    "gelu_tanh": (_gelu_tanh, {"half": 0.5, "cube": 3.0, "coef": 0.044715, "scale": math.sqrt(2.0 / math.pi), "one": 1.0}),
}


def _dense_bias_then(tail: str):
    """A dense layer with bias, then a GELU form (a transformer's MLP) or a residual add (the
    end of a transformer block), each fused as a post-op."""
    dense, parts = fused_pattern("relax.matmul", bias=True, constant_weight=True)
    if tail in _GELU_FORMS:
        out, gelu_parts = _GELU_FORMS[tail][0](dense)
        return out, {**parts, **{k: v for k, v in gelu_parts.items() if k != "root"}}
    residual = wildcard()
    return is_op("relax.add")(dense, residual), {**parts, "residual": residual}


def _scaled_matmul(op: str, adds: int = 0):
    """Attention scores: a product of activations scaled by a constant, then `adds` tensors
    added (the attention mask), the scale and the sums post-ops."""
    matmul, scale = is_op("relax.matmul")(wildcard(), wildcard()), is_const()
    return _plus(is_op(op)(matmul, scale), adds, {"root": matmul, "scale": scale})


def _plus(value, adds: int, parts: dict):
    """`value` with `adds` tensors added in turn (`added0`, ...), each a binary post-op."""
    for index in range(adds):
        parts[f"added{index}"] = wildcard()
        value = is_op("relax.add")(value, parts[f"added{index}"])
    return value, parts


def _activation_product(scaled_operands: bool, adds: int):
    """Attention scores: a product of two activations, each operand first scaled by a constant
    (`scaled_operands`: torch's attention scales q and k by the root of the scale each), then
    `adds` tensors added (the attention mask; T5's position bias). The scales are one linear
    post-op, the sums binary post-ops: three primitives a layer fewer."""
    a, b, parts = wildcard(), wildcard(), {}
    if scaled_operands:
        parts = {"scale_a": is_const(), "scale_b": is_const()}
        a, b = is_op("relax.multiply")(a, parts["scale_a"]), is_op("relax.multiply")(b, parts["scale_b"])
    product = is_op("relax.matmul")(a, b)
    return _plus(product, adds, {"root": product, **parts})


def _normalized():
    """(x - mean(x)) / sqrt(variance(x) + epsilon): instance normalisation as TVM's ONNX frontend
    decomposes it (Wav2Vec2's feature extractor), a layer norm without scale or shift."""
    x, epsilon = wildcard(), is_const()
    mean, variance = is_op("relax.mean")(x), is_op("relax.variance")(x)
    spread = is_op("relax.sqrt")(is_op("relax.add")(variance, epsilon))
    return is_op("relax.divide")(is_op("relax.subtract")(x, mean), spread), {"root": mean, "variance": variance, "epsilon": epsilon}


def _rms_normalized(weighted: bool):
    """x / sqrt(mean(x^2) + epsilon), then (`weighted`) times a weight per channel: RMSNorm
    (Llama and its kin, T5), as exporters write it (1 / sqrt or rsqrt, either operand order)."""
    x, exponent, epsilon, one = wildcard(), is_const(), is_const(), is_const()
    mean = is_op("relax.mean")(is_op("relax.power")(x, exponent))
    spread = is_op("relax.add")(mean, epsilon)
    inverse = is_op("relax.rsqrt")(spread) | is_op("relax.divide")(one, is_op("relax.sqrt")(spread))
    normalized = is_op("relax.multiply")(x, inverse) | is_op("relax.multiply")(inverse, x)
    parts = {"root": mean, "x": x, "exponent": exponent, "epsilon": epsilon, "one": one}
    if not weighted:
        return normalized, parts
    weight = is_const()
    return is_op("relax.multiply")(weight, normalized) | is_op("relax.multiply")(normalized, weight), {**parts, "weight": weight}


def _rotary():
    """x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x[..., h:], x[..., :h]): rotary
    position embeddings as Llama and its kin write them (cos and sin constants per position)."""
    x, cos, sin = wildcard(), is_const(), is_const()
    first, second = (is_op("relax.strided_slice")(x, wildcard(), wildcard(), wildcard(), wildcard()) for _ in range(2))
    rotated = is_op("relax.concat")(is_tuple([is_op("relax.negative")(second), first]))
    out = is_op("relax.add")(is_op("relax.multiply")(x, cos), is_op("relax.multiply")(rotated, sin))
    return out, {"root": rotated, "x": x, "first": first, "second": second, "cos": cos, "sin": sin}


def _softmax_nan_to_zero():
    """softmax, then NaN (a row masked whole) replaced by 0: torch's attention as exported."""
    probabilities, zero = is_op("relax.nn.softmax")(wildcard()), is_const()
    return is_op("relax.where")(is_op("relax.isnan")(probabilities), zero, probabilities), {"root": probabilities, "zero": zero}


def _softmax_masked_rows_to_zero():
    """softmax, then 0 for a row whose scores are all -inf: torch's safe softmax as torch.export
    decomposes it (a row is kept where any score is not -inf)."""
    scores, minus_inf, zero = wildcard(), is_const(), is_const()
    probabilities = is_op("relax.nn.softmax")(scores)
    kept = is_op("relax.logical_not")(is_op("relax.equal")(scores, minus_inf))
    any_kept = is_op("relax.max")(is_op("relax.astype")(kept))
    masked = is_op("relax.logical_not")(is_op("relax.astype")(any_kept))
    return is_op("relax.where")(masked, zero, probabilities), {"root": probabilities, "zero": zero, "minus_inf": minus_inf,
                                                               "any": any_kept}


_conv = emitters.convolution
for _name, _op in _CONVOLUTIONS.items():
    dnnl.pattern(f"{_name}_bias_add_relu", *_conv_with_residual(_op, "relax.nn.relu", False), check=fused_conv, emit=_conv)
    dnnl.pattern(f"{_name}_bias_add_relu_swapped", *_conv_with_residual(_op, "relax.nn.relu", True), check=fused_conv, emit=_conv)
    dnnl.pattern(f"{_name}_bias_add", *_conv_with_residual(_op, None, False), check=fused_conv, emit=_conv)
    dnnl.pattern(f"{_name}_bias_add_swapped", *_conv_with_residual(_op, None, True), check=fused_conv, emit=_conv)
    dnnl.pattern(f"{_name}_bias_act", *fused_pattern(_op, bias=True, activation=_ACTIVATIONS, constant_weight=True), check=fused_conv,
                 emit=_conv)
    dnnl.pattern(f"{_name}_bias", *fused_pattern(_op, bias=True, constant_weight=True), check=fused_conv, emit=_conv)
    dnnl.pattern(f"{_name}_act", *fused_pattern(_op, activation=_ACTIVATIONS, constant_weight=True), check=fused_conv, emit=_conv)
_dense = emitters.matmul
for _form, (_, _values) in _GELU_FORMS.items():
    _check = expected_constants(_values, f"the {_form} form of GELU")
    dnnl.pattern(f"dense_bias_{_form}", *_dense_bias_then(_form), check=lambda m, c=_check: dense_constant_weight(m) or c(m), emit=_dense)
dnnl.pattern("dense_bias_add", *_dense_bias_then("add"), check=dense_residual, emit=_dense)
dnnl.pattern("scores_scaled_add", *_activation_product(True, 1), check=activation_product, emit=_dense)
dnnl.pattern("scores_scaled", *_activation_product(True, 0), check=activation_product, emit=_dense)
for _op in ("divide", "multiply"):
    dnnl.pattern(f"matmul_{_op}_add", *_scaled_matmul(f"relax.{_op}", 1), check=activation_product, emit=_dense)
    dnnl.pattern(f"matmul_{_op}", *_scaled_matmul(f"relax.{_op}"), check=activation_product, emit=_dense)
dnnl.pattern("matmul_add_add", *_activation_product(False, 2), check=activation_product, emit=_dense)
dnnl.pattern("matmul_add", *_activation_product(False, 1), check=activation_product, emit=_dense)
dnnl.pattern("dense_bias_act", *fused_pattern("relax.matmul", bias=True, activation=_ACTIVATIONS, constant_weight=True),
             check=dense_constant_weight, emit=_dense)
dnnl.pattern("dense_bias", *fused_pattern("relax.matmul", bias=True, constant_weight=True), check=dense_constant_weight, emit=_dense)
for _form, (_build, _values) in _GELU_FORMS.items():
    dnnl.pattern(_form, *_build(wildcard()), check=expected_constants(_values, f"the {_form} form of GELU"), emit=emitters.eltwise)
dnnl.pattern("normalized", *_normalized(), check=normalized_last_axis, emit=emitters.layer_norm)
dnnl.pattern("rms_norm", *_rms_normalized(weighted=True), check=rms_normalized, emit=emitters.rms_norm)
dnnl.pattern("rms_normalized", *_rms_normalized(weighted=False), check=rms_normalized, emit=emitters.rms_norm)
dnnl.pattern("rotary", *_rotary(), check=rotary_halves, emit=emitters.rotary)
dnnl.pattern("softmax_nan_to_zero", *_softmax_nan_to_zero(), check=nan_to_zero, emit=emitters.softmax)
dnnl.pattern("softmax_masked_rows_to_zero", *_softmax_masked_rows_to_zero(), check=masked_rows_to_zero, emit=emitters.softmax)
int8.declare_results(dnnl)

# ------------------------------------------------------------------ single ops
dnnl.supports(*_CONVOLUTIONS.values(), check=conv_channels_first, emit=_conv)
dnnl.supports("relax.matmul", check=matmul_shapes, emit=_dense)
dnnl.supports("relax.nn.max_pool2d", "relax.nn.avg_pool2d", check=pool_nchw, emit=emitters.pooling)
dnnl.supports("relax.mean", emit=emitters.reduction)
dnnl.supports("relax.sum", check=trailing_reduction, emit=emitters.reduction)
dnnl.supports("relax.add", "relax.subtract", "relax.multiply", "relax.divide", check=binary_broadcast, emit=emitters.binary)
dnnl.supports("relax.power", check=power_scalar, emit=emitters.eltwise)
dnnl.supports(*emitters.ELTWISE_OPS, emit=emitters.eltwise)
dnnl.supports("relax.nn.softmax", emit=emitters.softmax)
dnnl.supports("relax.concat", check=concat_same_rank, emit=emitters.concat)
dnnl.supports("relax.split", emit=emitters.split)
dnnl.supports("relax.take", check=take_constant_index, emit=emitters.take)
dnnl.supports("relax.nn.layer_norm", check=layer_norm_last_axis, emit=emitters.layer_norm)
dnnl.supports(*emitters.RESHAPES, emit=emitters.reshape)
dnnl.supports("relax.strided_slice", check=window_slice, emit=emitters.strided_slice)
dnnl.supports("relax.broadcast_to", emit=emitters.broadcast_to)
dnnl.supports("relax.nn.pad", check=constant_pad, emit=emitters.pad)
dnnl.supports("relax.where", check=scalar_selection, emit=emitters.select)
dnnl.supports("relax.permute_dims", emit=emitters.permute_dims)
dnnl.supports("relax.astype", check=float_cast, emit=emitters.reorder)

register_backend(dnnl, origin="byoc (built-in)")


def partition_for_dnnl(mod: tvm.IRModule, **options) -> tvm.IRModule:
    """Partition for oneDNN; `byoc.partition_for(mod, "dnnl", **options)`; options are cost rules."""
    return partition_for(mod, "dnnl", **options)
