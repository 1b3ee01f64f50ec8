"""How exporters write ops that no one Relax op is, as pattern builders, each with the check that a
match is that op: the forms of GELU, a convolution's or dense layer's bias and residual add,
attention's scaled scores with their masks, instance and RMS normalisation, rotary position
embeddings, and torch's softmax forms that zero masked rows. A vendor declares those it computes
as one kernel; each builder returns the pattern and its named parts."""

from __future__ import annotations

import math

import numpy as np
from tvm import relax
from tvm.relax.dpl import is_const, is_op, is_tuple, wildcard

from byoc.annotate.patterns import fused_pattern
from byoc.annotate.predicates import expected_constants, scalar_constant
from byoc.annotate.predicates import shape as shape_of
from byoc.ir.types import constant_array


def conv_with_residual(op: str, activation: str | None, residual_first: bool):
    """A convolution with a constant bias, then a residual add [then `activation`]: a ResNet
    block's end."""
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


# GELU as exporters write it; `GELU_FORMS` gives each form's constants, which a vendor's check
# holds to their values (`expected_constants`).
def gelu_erf(x):
    """0.5 * x * (1 + erf(x / sqrt(2))): torch's decomposition, the zoo's BERT."""
    c = _constants("sqrt2", "one", "half")
    one_plus = is_op("relax.add")(is_op("relax.erf")(is_op("relax.divide")(x, c["sqrt2"])), c["one"])
    half_x = is_op("relax.multiply")(x, c["half"])
    return is_op("relax.multiply")(half_x, one_plus), {"root": half_x, **c}


def gelu_erf_half_last(x):
    """x * (1 + erf(x / sqrt(2))) * 0.5: torch's TorchScript exporter."""
    c = _constants("sqrt2", "one", "half")
    divided = is_op("relax.divide")(x, c["sqrt2"])
    one_plus = is_op("relax.add")(is_op("relax.erf")(divided), c["one"])
    return is_op("relax.multiply")(is_op("relax.multiply")(x, one_plus), c["half"]), {"root": divided, **c}


def gelu_tanh(x):
    """0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3))): GPT-2's NewGELU."""
    c = _constants("half", "cube", "coef", "scale", "one")
    half_x = is_op("relax.multiply")(x, c["half"])
    cubed = is_op("relax.multiply")(is_op("relax.power")(x, c["cube"]), c["coef"])
    inner = is_op("relax.multiply")(is_op("relax.add")(x, cubed), c["scale"])
    one_plus = is_op("relax.add")(is_op("relax.tanh")(inner), c["one"])
    return is_op("relax.multiply")(half_x, one_plus), {"root": half_x, **c}


GELU_FORMS = {
    "gelu": (gelu_erf, {"sqrt2": math.sqrt(2.0), "one": 1.0, "half": 0.5}),
    "gelu_erf_half_last": (gelu_erf_half_last, {"sqrt2": math.sqrt(2.0), "one": 1.0, "half": 0.5}),
    "gelu_tanh": (gelu_tanh, {"half": 0.5, "cube": 3.0, "coef": 0.044715, "scale": math.sqrt(2.0 / math.pi), "one": 1.0}),
}


# HardSwish and HardSigmoid as TVM's ONNX importer writes them (MobileNetV3, GhostNet, LR-ASPP):
# x * clip(x + 3, 0, 6) / 6, and clip(x * alpha + beta, 0, 1).
def hard_swish(x):
    c = _constants("three", "six")
    clipped = is_op("relax.clip")(is_op("relax.add")(x, c["three"]), wildcard(), wildcard())
    return is_op("relax.multiply")(x, is_op("relax.divide")(clipped, c["six"])), {"clip": clipped, **c}


def hard_sigmoid(x):
    c = _constants("alpha", "beta")
    clipped = is_op("relax.clip")(is_op("relax.add")(is_op("relax.multiply")(x, c["alpha"]), c["beta"]), wildcard(), wildcard())
    return clipped, {"clip": clipped, **c}


def _clipped_to(low: float, high: float, form: str):
    """The check that a match's clip bounds are `low` and `high`, and its constants scalars."""

    def check(match) -> str | None:
        values = [arg.value for arg in match["clip"].args[1:]]  # PrimValues: an immediate, or a number
        bounds = [float(getattr(v, "value", v)) for v in values]
        if bounds != [low, high]:
            return f"clip bounds {bounds}, not the {low:g} and {high:g} of {form}"
        constants = [(name, match.get(name)) for name in ("three", "six", "alpha", "beta")]
        return next((f"{name} is not one number" for name, value in constants
                     if value is not None and constant_array(value).size != 1), None)

    return check


HARD_FORMS = {
    "hard_swish": (hard_swish, lambda match: _clipped_to(0.0, 6.0, "HardSwish")(match)
                   or expected_constants({"three": 3.0, "six": 6.0}, "HardSwish")(match)),
    "hard_sigmoid": (hard_sigmoid, _clipped_to(0.0, 1.0, "HardSigmoid")),
}


def is_gelu(form: str):
    """The check that a match of GELU's `form` (a key of `GELU_FORMS`) holds its constants."""
    return expected_constants(GELU_FORMS[form][1], f"the {form} form of GELU")


def dense_bias_then(tail: str):
    """A dense layer with bias, then a GELU form (a transformer's MLP) or a residual add (the
    end of a transformer block), each fused as a post-op."""
    dense, parts = fused_pattern("relax.matmul", bias=True, constant_weight=True)
    if tail in GELU_FORMS:
        out, gelu_parts = GELU_FORMS[tail][0](dense)
        return out, {**parts, **{k: v for k, v in gelu_parts.items() if k != "root"}}
    residual = wildcard()
    return is_op("relax.add")(dense, residual), {**parts, "residual": residual}


def scaled_scores(op: str, adds: int = 0):
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


def scores(scaled_operands: bool, adds: int):
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


def instance_normalized():
    """(x - mean(x)) / sqrt(variance(x) + epsilon): instance normalisation as TVM's ONNX frontend
    decomposes it (Wav2Vec2's feature extractor), a layer norm without scale or shift."""
    x, epsilon = wildcard(), is_const()
    mean, variance = is_op("relax.mean")(x), is_op("relax.variance")(x)
    spread = is_op("relax.sqrt")(is_op("relax.add")(variance, epsilon))
    return is_op("relax.divide")(is_op("relax.subtract")(x, mean), spread), {"root": mean, "variance": variance, "epsilon": epsilon}


def rms_norm(weighted: bool):
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


def rotary():
    """x * cos + rotate_half(x) * sin, rotate_half(x) = concat(-x[..., h:], x[..., :h]): rotary
    position embeddings as Llama and its kin write them (cos and sin constants per position)."""
    x, cos, sin = wildcard(), is_const(), is_const()
    first, second = (is_op("relax.strided_slice")(x, wildcard(), wildcard(), wildcard(), wildcard()) for _ in range(2))
    rotated = is_op("relax.concat")(is_tuple([is_op("relax.negative")(second), first]))
    out = is_op("relax.add")(is_op("relax.multiply")(x, cos), is_op("relax.multiply")(rotated, sin))
    return out, {"root": rotated, "x": x, "first": first, "second": second, "cos": cos, "sin": sin}


def softmax_nan_to_zero():
    """softmax, then NaN (a row masked whole) replaced by 0: torch's attention as exported."""
    probabilities, zero = is_op("relax.nn.softmax")(wildcard()), is_const()
    return is_op("relax.where")(is_op("relax.isnan")(probabilities), zero, probabilities), {"root": probabilities, "zero": zero}


def softmax_masked_rows_to_zero():
    """softmax, then 0 for a row whose scores are all -inf: torch's safe softmax as torch.export
    decomposes it (a row is kept where any score is not -inf)."""
    scores, minus_inf, zero = wildcard(), is_const(), is_const()
    probabilities = is_op("relax.nn.softmax")(scores)
    kept = is_op("relax.logical_not")(is_op("relax.equal")(scores, minus_inf))
    any_kept = is_op("relax.max")(is_op("relax.astype")(kept))
    masked = is_op("relax.logical_not")(is_op("relax.astype")(any_kept))
    return is_op("relax.where")(masked, zero, probabilities), {"root": probabilities, "zero": zero, "minus_inf": minus_inf,
                                                               "any": any_kept}


def _over_last_axis(*reductions: relax.Call) -> str | None:
    """A normalisation's statistics reduced over the last axis, kept."""
    for call in reductions:
        rank, axes = len(shape_of(call.args[0])), call.attrs.axis
        if axes is None or [int(a) % rank for a in axes] != [rank - 1] or not call.attrs.keepdims:
            return "normalisation over the last axis only"
    return None


def _scalar_epsilon(match) -> str | None:
    return None if scalar_constant(match["epsilon"]) is not None else "epsilon must be one constant number"


def is_instance_normalized(match) -> str | None:
    return _over_last_axis(match["root"], match["variance"]) or _scalar_epsilon(match)


def is_rms_norm(match) -> str | None:
    channels = shape_of(match["x"])[-1]
    if reason := _over_last_axis(match["root"]):
        return reason
    if scalar_constant(match["exponent"]) != 2.0:
        return "not a root mean square: the power must be 2"
    if reason := _scalar_epsilon(match):
        return reason
    if match.get("one") is not None and scalar_constant(match["one"]) != 1.0:
        return "not 1 / sqrt"
    weight = match.get("weight")
    if weight is not None and (math.prod(shape_of(weight)) != channels or any(d != 1 for d in shape_of(weight)[:-1])):
        return "the weight must hold one value per channel of the last axis"
    return None


def is_rotary(match) -> str | None:
    """Rotary embeddings: the negated slice is the last axis's second half, the other its first;
    cos and sin hold one value per position and channel (the same for every head and batch)."""
    shape = shape_of(match["x"])
    half = shape[-1] // 2
    for name, bounds in (("first", (0, half)), ("second", (half, shape[-1]))):
        axes, begin, end, *steps = ([int(v) for v in arg.fields] for arg in match[name].args[1:])
        window = tuple(min(b + shape[-1] if b < 0 else b, shape[-1]) for b in (begin[0], end[0]))
        if shape[-1] % 2 or [a % len(shape) for a in axes] != [len(shape) - 1] or window != bounds \
                or any(step != 1 for step in sum(steps, [])):
            return "not rotate_half: the second half negated, then the first"
    for name in ("cos", "sin"):
        table = shape_of(match[name])
        if len(table) > len(shape) or tuple(table[-2:]) != tuple(shape[-2:]) or any(d != 1 for d in table[:-2]):
            return "cos and sin must hold one value per position and channel"
    return None


def is_softmax_nan_to_zero(match) -> str | None:
    return None if scalar_constant(match["zero"]) == 0.0 else "where() replaces NaN with a value other than 0"


def is_softmax_masked_rows_to_zero(match) -> str | None:
    """torch's safe softmax over the last axis: rows all -inf become 0."""
    zero, minus_inf = constant_array(match["zero"]), constant_array(match["minus_inf"])
    if zero.size == 0 or np.any(zero != 0):
        return "where() gives masked rows a value other than 0"
    if minus_inf.size != 1 or not np.isneginf(minus_inf.reshape(())):
        return "rows are masked by a value other than -inf"
    rank = match["root"].ty.ndim
    axis, reduced = int(match["root"].attrs.axis) % rank, match["any"].attrs
    axes = [int(a) % rank for a in reduced.axis] if reduced.axis is not None else list(range(rank))
    if axis != rank - 1 or axes != [axis] or not reduced.keepdims:
        return "softmax and the mask must both run over the last axis"
    return None
