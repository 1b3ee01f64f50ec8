"""How a quantized model writes each quantized op, as pattern builders: onnxruntime's `quantize_static`
(QDQ: dequantize -> op -> quantize around every op it quantizes) and `quantize_dynamic` (the input
quantized at run time by DynamicQuantizeLinear), as TVM imports them. A vendor that computes a
quantized model in int8 declares the chains it takes with these, and its own checks of the scales
and types; each returns the pattern and its named parts."""

from __future__ import annotations

from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

from byoc.annotate.patterns import unary

ACTIVATIONS = ("relax.nn.relu", "relax.clip")
# Constants of DynamicQuantizeLinear as TVM imports it (see `dynamically_quantized`).
DYNAMIC_QUANTIZE_CONSTANTS = {"high_floor": 0.0, "low_ceiling": 0.0, "levels": 255.0, "origin": 0.0}


def dequantized(constant: bool) -> DFPattern:
    return is_op("relax.dequantize")(is_const() if constant else wildcard(), is_const(), is_const())


def quantized(value: DFPattern) -> DFPattern:
    return is_op("relax.quantize")(value, is_const(), is_const())


def quantized_op(op: str, bias: bool, activation: bool, quantized_output: bool) -> tuple[DFPattern, dict[str, DFPattern]]:
    """dequantize(x), dequantize(constant w) -> `op` [-> add a constant bias] [-> ReLU or clip] [-> quantize]."""
    source, weights = dequantized(False), dequantized(True)
    out = root = is_op(op)(source, weights)
    parts: dict[str, DFPattern] = {"root": root, "source": source, "weights": weights}
    if bias:
        parts["bias"] = is_const()
        out = is_op("relax.add")(out, parts["bias"])
    if activation:
        out = unary(ACTIVATIONS[0], out) | unary(ACTIVATIONS[1], out)
    if quantized_output:
        out = parts["output"] = quantized(out)
    return out, parts


def quantized_residual(op: str, residual_first: bool, relu: bool) -> tuple[DFPattern, dict[str, DFPattern]]:
    """A quantized convolution whose quantized result is added to another quantized tensor and
    quantized again (a residual block's end): quantize([ReLU](dequantize(quantize(conv + bias)) +
    dequantize(b))). One pattern per operand order, as for the float residual patterns."""
    convolution, parts = quantized_op(op, bias=True, activation=False, quantized_output=True)
    parts["inner_quantize"] = parts.pop("output")
    parts["inner"] = is_op("relax.dequantize")(convolution, is_const(), is_const())
    parts["residual"] = dequantized(False)
    added = is_op("relax.add")(*((parts["residual"], parts["inner"]) if residual_first else (parts["inner"], parts["residual"])))
    out = parts["output"] = quantized(unary("relax.nn.relu", added) if relu else added)
    return out, parts


def quantized_product(quantized_output: bool) -> tuple[DFPattern, dict[str, DFPattern]]:
    """[quantize](matmul(dequantize(a), dequantize(b))) of two quantized activations: attention's
    scores and its weighted sum of the values."""
    parts = {"source": dequantized(False), "weights": dequantized(False)}
    out = parts["root"] = is_op("relax.matmul")(parts["source"], parts["weights"])
    if quantized_output:
        out = parts["output"] = quantized(out)
    return out, parts


BATCH_NORM = ("relax.subtract", "relax.divide", "relax.multiply", "relax.add")  # as TVM decomposes it, by constants


def dynamically_quantized(op: str, bias: bool, batch_norm: bool = False, activation: bool = False) -> tuple[DFPattern, dict[str, DFPattern]]:
    """x, quantized at run time by ONNX's DynamicQuantizeLinear as TVM imports it (the range of
    x widened to 0, scale = range / 255, zero point = round(clip(0 - low / scale, 0, 255)) as
    uint8) and read back, times dequantized constant int8 weights (a dense layer or a
    convolution) [+ a constant bias] [then a batch normalisation] [then ReLU or clip]: how
    `quantize_dynamic` writes them (see byoc.frontend.onnx.qoperator). The batch normalisation
    after a convolution (which a float model folds into its weights, but int8 weights cannot
    take) and the activation become post-ops of the int8 kernel."""
    x = wildcard()
    parts: dict[str, DFPattern] = {name: is_const() for name in ("high_floor", "low_ceiling", "levels", "origin")}
    parts["greatest"], parts["least"] = is_op("relax.max")(x), is_op("relax.min")(x)
    high = is_op("relax.maximum")(parts["high_floor"], parts["greatest"])
    low = is_op("relax.minimum")(parts["low_ceiling"], parts["least"])
    scale = is_op("relax.divide")(is_op("relax.subtract")(high, low), parts["levels"])
    parts["clip"] = unary("relax.clip", is_op("relax.subtract")(parts["origin"], is_op("relax.divide")(low, scale)))
    zero = is_op("relax.astype")(is_op("relax.round")(parts["clip"]))
    parts["quantize"] = is_op("relax.quantize")(x, scale, zero)
    parts["source"] = is_op("relax.dequantize")(parts["quantize"], scale, zero)
    parts["weights"] = dequantized(True)
    out = parts["root"] = is_op(op)(parts["source"], parts["weights"])
    if bias:
        parts["bias"] = is_const()
        out = is_op("relax.add")(out, parts["bias"])
    for index, step in enumerate(BATCH_NORM if batch_norm else ()):
        parts[f"normalization{index}"] = is_const()
        out = is_op(step)(out, parts[f"normalization{index}"])
    if activation:
        out = unary(ACTIVATIONS[0], out) | unary(ACTIVATIONS[1], out)
    return out, parts


def quantized_add() -> tuple[DFPattern, dict[str, DFPattern]]:
    """quantize(add(dequantize(a), dequantize(b))), a ReLU before the quantize or not: a residual add."""
    parts = {"a": dequantized(False), "b": dequantized(False)}
    added = parts["root"] = is_op("relax.add")(parts["a"], parts["b"])
    parts["output"] = quantized(added | unary("relax.nn.relu", added))
    return parts["output"], parts


def quantized_with(op: str, other: str) -> tuple[DFPattern, dict[str, DFPattern]]:
    """quantize(op(dequantize(a), x)), x on either side: a float constant (`other` "constant"),
    or ("other") a float tensor computed in the region: a RMSNorm's or SiLU's product."""
    parts = {"a": dequantized(False), other: is_const() if other == "constant" else wildcard()}
    parts["root"] = is_op(op)(parts["a"], parts[other]) | is_op(op)(parts[other], parts["a"])
    parts["output"] = quantized(parts["root"])
    return parts["output"], parts


def quantized_result(op: str, operands: int = 2) -> tuple[DFPattern, dict[str, DFPattern]]:
    """quantize(op(x, ...)) of float operands: a float op between int8 kernels (a SiLU's product,
    a rotary embedding's, attention's softmax), its result written as int8 by the op itself."""
    parts = {"root": is_op(op)(*(wildcard() for _ in range(operands)))}
    parts["output"] = quantized(parts["root"])
    return parts["output"], parts


def quantized_layer_norm(quantized_output: bool) -> tuple[DFPattern, dict[str, DFPattern]]:
    """[quantize](layer_norm(dequantize(x))): a layer norm that can read the int8 data as it is."""
    parts = {"source": dequantized(False)}
    out = parts["root"] = is_op("relax.nn.layer_norm")(parts["source"], is_const(), is_const())
    if quantized_output:
        out = parts["output"] = quantized(out)
    return out, parts


def quantized_gelu() -> tuple[DFPattern, dict[str, DFPattern]]:
    """0.5 * x * (1 + erf(x / sqrt(2))) with every intermediate result quantized and read back,
    as onnxruntime's tool writes a model's erf GELU: x is read through two dequantizes."""
    x = wildcard()

    def read_back(value: DFPattern) -> DFPattern:
        return is_op("relax.dequantize")(quantized(value), is_const(), is_const())

    parts = {"source": is_op("relax.dequantize")(x, is_const(), is_const()), "half": is_const(), "sqrt2": is_const(), "one": is_const()}
    half_x = read_back(is_op("relax.multiply")(parts["source"], parts["half"]))
    divided = is_op("relax.divide")(is_op("relax.dequantize")(x, is_const(), is_const()), parts["sqrt2"])
    one_plus = read_back(is_op("relax.add")(read_back(is_op("relax.erf")(divided)), parts["one"]))
    parts["root"] = is_op("relax.multiply")(half_x, one_plus)
    parts["output"] = quantized(parts["root"])
    return parts["output"], parts


def quantized_eltwise(op: str) -> tuple[DFPattern, dict[str, DFPattern]]:
    """quantize(op(dequantize(x))), `op` element-wise: exporters' GELU op between two quantized
    dense layers (once `fold_reshapes` has taken the reshapes around it)."""
    parts = {"source": dequantized(False)}
    parts["root"] = unary(op, parts["source"])
    parts["output"] = quantized(parts["root"])
    return parts["output"], parts


def quantized_max_pool() -> tuple[DFPattern, dict[str, DFPattern]]:
    parts = {"source": dequantized(False)}
    parts["root"] = is_op("relax.nn.max_pool2d")(parts["source"])
    parts["output"] = quantized(parts["root"])
    return parts["output"], parts


def requantized() -> tuple[DFPattern, dict[str, DFPattern]]:
    """quantize(dequantize(x)) with another scale: int8 data requantized (a softmax's result for
    the product that reads it)."""
    parts = {"source": dequantized(False)}
    parts["output"] = quantized(parts["source"])
    return parts["output"], parts
