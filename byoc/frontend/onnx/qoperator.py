"""Quantized operators (QOperator format, and `quantize_dynamic`'s integer products) rewritten
before import: in the QDQ form, or in float.

onnxruntime's `quantize_static(..., quant_format=QuantFormat.QOperator)` writes a quantized model
as QLinearConv, QLinearMatMul and its own com.microsoft ops (QLinearAdd, QLinearMul,
QLinearGlobalAveragePool, QGemm), with MaxPool and Flatten applied to the uint8 data as it is.
TVM's frontend converts none of them. Each is exactly dequantize -> float op -> quantize with the
scales and zero points it carries (that is how ONNX and onnxruntime define them), so it is
written so here, and the model goes the way of a QDQ model: its weights stay int8, and a vendor
that takes quantized ops computes the chains in int8 (see byoc.frontend.int8_weights).

`quantize_dynamic` writes a dense layer as MatMulInteger, and a convolution as ConvInteger, on
DynamicQuantizeLinear's result, read back as float and scaled by the product of the two scales:
that is DequantizeLinear(DynamicQuantizeLinear(x)) op DequantizeLinear(W), and is written so.
Other integer products are computed in float.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from byoc.ir.quantization import dequantize_array

_MICROSOFT = "com.microsoft"
# Ops onnxruntime's tool leaves on quantized data: they move or select values, so they commute
# with the quantization and their result is quantized as their input.
_ON_QUANTIZED_DATA = frozenset({"MaxPool", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity"})
MIN_OPSET = 13  # per-axis DequantizeLinear


class _Writer:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.initializers = {i.name: i for i in model.graph.initializer}
        self.added: list[onnx.TensorProto] = []
        self.nodes: list[onnx.NodeProto] = []
        self.quantization: dict[str, tuple[str, str]] = {}  # int8 tensor -> (scale, zero point)
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        self.producers: dict[str, onnx.NodeProto] = {}
        for node in model.graph.node:
            for name in node.input:
                self.readers.setdefault(name, []).append(node)
            for name in node.output:
                self.producers[name] = node
        self.outputs = {o.name for o in model.graph.output}
        self.dropped: set[int] = set()  # nodes a rewrite made unnecessary

    def float_cast_of(self, name: str) -> onnx.NodeProto | None:
        """The Cast to float that is the only reader of `name`, if it is."""
        readers = self.readers.get(name, [])
        if name in self.outputs or len(readers) != 1:
            return None
        cast = readers[0]
        return cast if cast.op_type == "Cast" and _attrs(cast).get("to") == onnx.TensorProto.FLOAT else None

    def array(self, name: str) -> np.ndarray | None:
        init = self.initializers.get(name)
        return numpy_helper.to_array(init) if init is not None else None

    def dequantize(self, value: str, scale: str, zero: str, base: str, axis: int | None = None) -> str:
        out = f"{base}/{value}_dequantized"
        self.nodes.append(helper.make_node("DequantizeLinear", [value, scale, zero] if zero else [value, scale], [out],
                                           name=f"{base}/{value}_DequantizeLinear", **({"axis": axis} if axis is not None else {})))
        return out

    def quantized(self, op_type: str, inputs: list[str], node: onnx.NodeProto, scale: str, zero: str, **attrs) -> None:
        """`op_type` on float `inputs`, its result quantized by `scale` and `zero` into `node`'s output."""
        base = node.name or node.output[0]
        result = f"{base}/float"
        self.nodes.append(helper.make_node(op_type, inputs, [result], name=base, **attrs))
        self.nodes.append(helper.make_node("QuantizeLinear", [result, scale, zero], [node.output[0]], name=f"{base}_QuantizeLinear"))
        self.quantization[node.output[0]] = (scale, zero)

    def bias(self, bias: str, scales: tuple[str, str], base: str) -> str | None:
        """The int32 bias of a QLinearConv/QGemm, dequantized by the product of the input's and
        the weights' scales (how the op defines it); None when those are not constants."""
        values = [self.array(s) for s in scales]
        if any(v is None for v in values):
            return None
        name = f"{bias}_scale_product"
        if name not in {t.name for t in self.added}:
            self.added.append(numpy_helper.from_array((values[0].astype(np.float32) * values[1].astype(np.float32)).reshape(-1), name))
        return self.dequantize(bias, name, "", base, axis=0)


def _attrs(node: onnx.NodeProto, drop: tuple[str, ...] = ()) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name not in drop}


def _per_channel_axis(w: _Writer, scale: str, axis: int) -> int | None:
    values = w.array(scale)
    return axis if values is not None and values.size > 1 else None


def _conv(w: _Writer, node: onnx.NodeProto) -> bool:
    x, xs, xz, wt, ws, wz, ys, yz, *bias = node.input
    base = node.name or node.output[0]
    inputs = [w.dequantize(x, xs, xz, base), w.dequantize(wt, ws, wz, base, _per_channel_axis(w, ws, 0))]
    if bias and bias[0]:
        dequantized = w.bias(bias[0], (xs, ws), base)
        if dequantized is None:
            return False
        inputs.append(dequantized)
    w.quantized("Conv", inputs, node, ys, yz, **_attrs(node))
    return True


def _matmul(w: _Writer, node: onnx.NodeProto) -> bool:
    a, a_s, a_z, b, b_s, b_z, ys, yz = node.input
    base = node.name or node.output[0]
    w.quantized("MatMul", [w.dequantize(a, a_s, a_z, base), w.dequantize(b, b_s, b_z, base, _per_channel_axis(w, b_s, 1))], node, ys, yz)
    return True


def _binary(op_type: str) -> Callable[[_Writer, onnx.NodeProto], bool]:
    def rewrite(w: _Writer, node: onnx.NodeProto) -> bool:
        a, a_s, a_z, b, b_s, b_z, ys, yz = node.input
        base = node.name or node.output[0]
        w.quantized(op_type, [w.dequantize(a, a_s, a_z, base), w.dequantize(b, b_s, b_z, base)], node, ys, yz)
        return True

    return rewrite


def _global_average_pool(w: _Writer, node: onnx.NodeProto) -> bool:
    if _attrs(node).get("channels_last", 0):
        return False
    x, xs, xz, ys, yz = node.input
    w.quantized("GlobalAveragePool", [w.dequantize(x, xs, xz, node.name or node.output[0])], node, ys, yz)
    return True


def _softmax(w: _Writer, node: onnx.NodeProto) -> bool:
    """com.microsoft QLinearSoftmax; its `opset` attribute is the Softmax it fused, whose axis
    flattened the tensor before opset 13: both agree over the last axis alone."""
    attrs = _attrs(node)
    axis = int(attrs.get("axis", -1))
    if int(attrs.get("opset", 13)) < 13 and axis != -1:
        return False
    x, xs, xz, ys, yz = node.input
    w.quantized("Softmax", [w.dequantize(x, xs, xz, node.name or node.output[0])], node, ys, yz, axis=axis)
    return True


def _where(w: _Writer, node: onnx.NodeProto) -> bool:
    condition, x, xs, xz, y, ys, yz, zs, zz = node.input
    base = node.name or node.output[0]
    w.quantized("Where", [condition, w.dequantize(x, xs, xz, base), w.dequantize(y, ys, yz, base)], node, zs, zz)
    return True


def _gemm(w: _Writer, node: onnx.NodeProto) -> bool:
    a, a_s, a_z, b, b_s, b_z, *rest = node.input
    c, ys, yz = (rest + ["", "", ""])[:3]
    attrs = _attrs(node)
    base = node.name or node.output[0]
    inputs = [w.dequantize(a, a_s, a_z, base), w.dequantize(b, b_s, b_z, base, _per_channel_axis(w, b_s, 0 if attrs.get("transB", 0) else 1))]
    if c:
        dequantized = w.bias(c, (a_s, b_s), base)
        if dequantized is None:
            return False
        inputs.append(dequantized)
    if not ys:  # no output quantization: the result is float
        w.nodes.append(helper.make_node("Gemm", inputs, [node.output[0]], name=base, **attrs))
    else:
        w.quantized("Gemm", inputs, node, ys, yz, **attrs)
    return True


def _integer(op_type: str, weight_axis: int) -> Callable[[_Writer, onnx.NodeProto], bool]:
    """MatMulInteger or ConvInteger (onnxruntime's `quantize_dynamic`): the int32 result of
    (A - a_zero) op (B - b_zero), computed in float. Constant int8 weights less their zero points
    become a float constant, so the product is a float layer with constant weights; weights
    computed at run time (Wav2Vec2's positional convolution, its weight normalised per call and
    quantized by DynamicQuantizeLinear) are centred at run time as the input is. A Cast of the
    result to float that the model applies next is the float result itself. (Sums past 2^24 round
    in float32; the model casts them to float anyway.)"""
    cast = onnx.TensorProto.FLOAT

    def centred(w: _Writer, value: str, zero: str, base: str) -> str:
        """`value` - `zero` in float, computed per call."""
        source = f"{base}/{value}_float"
        w.nodes.append(helper.make_node("Cast", [value], [source], name=f"{base}/{value}_Cast", to=cast))
        if not zero:
            return source
        w.nodes.append(helper.make_node("Cast", [zero], [f"{base}/{zero}_float"], name=f"{base}/{zero}_Cast", to=cast))
        w.nodes.append(helper.make_node("Sub", [source, f"{base}/{zero}_float"], [f"{source}_centred"], name=f"{base}/{value}_Sub"))
        return f"{source}_centred"

    def rewrite(w: _Writer, node: onnx.NodeProto) -> bool:
        a, b, *zeros = node.input
        a_zero, b_zero = (zeros + ["", ""])[:2]
        base = node.name or node.output[0]
        weights, weight_zero = w.array(b), w.array(b_zero) if b_zero else np.zeros(1, np.int8)
        if weights is None:  # computed at run time: a zero point per channel would need its axis laid out
            if weight_zero is not None and weight_zero.size > 1:
                return False
            name = centred(w, b, b_zero, base)
        elif weight_zero is None:
            return False
        else:
            name = f"{b}_less_zero_point"
            w.added.append(numpy_helper.from_array(dequantize_array(weights, np.float32(1), weight_zero, weight_axis), name))
        source = centred(w, a, a_zero, base)
        out = node.output[0]
        reader = w.float_cast_of(out)
        result = reader.output[0] if reader is not None else f"{base}/float"
        w.nodes.append(helper.make_node(op_type, [source, name], [result], name=base, **_attrs(node)))
        if reader is not None:
            w.dropped.add(id(reader))
        else:
            w.nodes.append(helper.make_node("Cast", [result], [out], name=f"{base}/Cast_int32", to=onnx.TensorProto.INT32))
        return True

    return rewrite


def _dynamic(op_type: str, weight_axis: int) -> Callable[[_Writer, onnx.NodeProto], bool]:
    """MatMulInteger or ConvInteger of DynamicQuantizeLinear's result by constant int8 weights,
    read back as float and scaled by the product of the two scales (how `quantize_dynamic` writes
    a dense layer or a convolution): exactly DequantizeLinear(DynamicQuantizeLinear(x)) op
    DequantizeLinear(W), written so, with a DynamicQuantizeLinear of its own for each product (the
    input's scale is computed at run time; a vendor that takes the chain whole quantizes the input
    in the same kernel). The weights' scales run along `weight_axis` (a MatMul's columns, a Conv's
    output channels)."""

    def rewrite(w: _Writer, node: onnx.NodeProto) -> bool:
        a, b, *zeros = node.input
        a_zero, b_zero = (zeros + ["", ""])[:2]
        quantize = w.producers.get(a)
        weights = w.array(b)
        cast = w.float_cast_of(node.output[0])
        if quantize is None or quantize.op_type != "DynamicQuantizeLinear" or quantize.output[0] != a or a_zero != quantize.output[2] \
                or weights is None or (weights.ndim == 2) != (op_type == "MatMul") or cast is None or cast.output[0] in w.outputs:
            return False
        readers = w.readers.get(cast.output[0], [])
        scaling = readers[0] if len(readers) == 1 and readers[0].op_type == "Mul" else None
        product = next((i for i in scaling.input if i != cast.output[0]), None) if scaling is not None else None
        maker = w.producers.get(product) if product else None
        if maker is None or maker.op_type != "Mul" or quantize.output[1] not in maker.input:
            return False
        weight_scale = next((i for i in maker.input if i != quantize.output[1]), quantize.output[1])
        scales = w.array(weight_scale)
        if scales is None or scales.size not in (1, weights.shape[weight_axis]):
            return False
        base = node.name or node.output[0]
        x = quantize.input[0]
        q, scale, zero = (f"{base}/{x}_{part}" for part in ("quantized", "scale", "zero_point"))
        w.nodes.append(helper.make_node("DynamicQuantizeLinear", [x], [q, scale, zero], name=f"{base}/DynamicQuantizeLinear"))
        source = w.dequantize(q, scale, zero, base)
        weight = w.dequantize(b, weight_scale, b_zero, base, axis=weight_axis % weights.ndim if scales.size > 1 else None)
        w.nodes.append(helper.make_node(op_type, [source, weight], [scaling.output[0]], name=base, **_attrs(node)))
        w.dropped |= {id(cast), id(scaling)}
        return True

    return rewrite


def _dynamic_product(w: _Writer, node: onnx.NodeProto, x: str, weight: str, weight_scale: str, weight_zero: str, bias: str) -> bool:
    """DequantizeLinear(DynamicQuantizeLinear(x)) times DequantizeLinear(weight) (+ bias): the
    form `_dynamic` writes, which a vendor takes whole as one int8 product quantizing its input."""
    weights, scales = w.array(weight), w.array(weight_scale)
    if weights is None or scales is None or weights.ndim != 2 or scales.size not in (1, weights.shape[1]):
        return False
    base = node.name or node.output[0]
    q, scale, zero = (f"{base}/{x}_{part}" for part in ("quantized", "scale", "zero_point"))
    w.nodes.append(helper.make_node("DynamicQuantizeLinear", [x], [q, scale, zero], name=f"{base}/DynamicQuantizeLinear"))
    source = w.dequantize(q, scale, zero, base)
    dequantized = w.dequantize(weight, weight_scale, weight_zero, base, axis=1 if scales.size > 1 else None)
    product = f"{base}/product" if bias else node.output[0]
    w.nodes.append(helper.make_node("MatMul", [source, dequantized], [product], name=base))
    if bias:
        w.nodes.append(helper.make_node("Add", [product, bias], [node.output[0]], name=f"{base}/bias"))
    return True


def _dynamic_quantize_matmul(w: _Writer, node: onnx.NodeProto) -> bool:
    """com.microsoft DynamicQuantizeMatMul (onnxruntime's fusion of `quantize_dynamic`'s dense layer,
    in a model it saved optimized): the input quantized at run time, times int8 weights."""
    x, weight, scale, zero, bias = (list(node.input) + [""] * 5)[:5]
    return _dynamic_product(w, node, x, weight, scale, zero, bias)


def _matmul_integer_to_float(w: _Writer, node: onnx.NodeProto) -> bool:
    """com.microsoft MatMulIntegerToFloat of DynamicQuantizeLinear's result (onnxruntime's fusion
    where several products share one quantized input): the same product, of the float input."""
    a, weight, a_scale, scale, a_zero, zero, bias = (list(node.input) + [""] * 7)[:7]
    quantize = w.producers.get(a)
    if quantize is None or quantize.op_type != "DynamicQuantizeLinear" or list(quantize.output[:3]) != [a, a_scale, a_zero]:
        return False
    return _dynamic_product(w, node, quantize.input[0], weight, scale, zero, bias)


def _first(*rewrites: Callable[[_Writer, onnx.NodeProto], bool]) -> Callable[[_Writer, onnx.NodeProto], bool]:
    def rewrite(w: _Writer, node: onnx.NodeProto) -> bool:
        return any(r(w, node) for r in rewrites)

    return rewrite


_REWRITES: dict[tuple[str, str], Callable[[_Writer, onnx.NodeProto], bool]] = {
    ("", "MatMulInteger"): _first(_dynamic("MatMul", 1), _integer("MatMul", -1)),
    ("", "ConvInteger"): _first(_dynamic("Conv", 0), _integer("Conv", 0)),
    ("", "QLinearConv"): _conv,
    ("", "QLinearMatMul"): _matmul,
    (_MICROSOFT, "QLinearAdd"): _binary("Add"),
    (_MICROSOFT, "QLinearMul"): _binary("Mul"),
    (_MICROSOFT, "QLinearGlobalAveragePool"): _global_average_pool,
    (_MICROSOFT, "QGemm"): _gemm,
    (_MICROSOFT, "QLinearSoftmax"): _softmax,
    (_MICROSOFT, "QLinearWhere"): _where,
    (_MICROSOFT, "DynamicQuantizeMatMul"): _dynamic_quantize_matmul,
    (_MICROSOFT, "MatMulIntegerToFloat"): _matmul_integer_to_float,
}


def qdq_form(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with its quantized operators written as dequantize -> op -> quantize; the model
    itself where it has none (or an opset before per-axis DequantizeLinear)."""
    graph = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < MIN_OPSET or not any(((n.domain if n.domain != "ai.onnx" else ""), n.op_type) in _REWRITES for n in graph.node):
        return model
    w = _Writer(model)
    for node in graph.node:
        if id(node) in w.dropped:
            continue
        if node.op_type == "QuantizeLinear" and node.domain in ("", "ai.onnx") and len(node.input) == 3:
            w.quantization[node.output[0]] = (node.input[1], node.input[2])
        rewrite = _REWRITES.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
        source = node.input[0] if node.input else ""
        if rewrite is not None:
            kept = len(w.nodes)
            if rewrite(w, node):
                continue
            del w.nodes[kept:]
        elif node.op_type in _ON_QUANTIZED_DATA and not node.domain and source in w.quantization:
            # moved in float between a dequantize and a quantize of the same scale: the
            # partitioner moves it back onto the int8 data for a vendor that takes it so
            scale, zero = w.quantization[source]
            w.quantized(node.op_type, [w.dequantize(source, scale, zero, node.name or node.output[0]), *node.input[1:]], node, scale, zero,
                        **_attrs(node))
            continue
        w.nodes.append(node)
    result = onnx.ModelProto()
    result.CopyFrom(model)
    del result.graph.node[:]
    result.graph.node.extend(w.nodes)
    result.graph.initializer.extend(w.added)
    return result
