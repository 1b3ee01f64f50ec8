"""Rewrites of the written ONNX into the forms onnxruntime's and TensorRT's importers fuse: a bias
added after a convolution as its third input, hard activations as their own ops, a dequantized
matrix product as Gemm, a quantized model's layout and dynamic quantization as the model had them."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from byoc.codegen_json.to_onnx.writer import Writer
from byoc.ir.quantization import dequantize_array


def _readers(nodes: list[onnx.NodeProto]) -> dict[str, list[onnx.NodeProto]]:
    """The nodes that read each tensor, by name."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    return readers


def _producers(nodes: list[onnx.NodeProto]) -> dict[str, onnx.NodeProto]:
    """The node that writes each tensor, by name."""
    return {out: node for node in nodes for out in node.output}


def bias_into_conv(writer: Writer, constants: Mapping[str, np.ndarray], outputs: set[str], channels: Mapping[str, int]) -> None:
    """A Conv whose only reader adds a constant per output channel (Relax writes a convolution's
    bias as an add) takes it as its bias input. onnxruntime fuses the add itself only into a Conv
    whose weights are an initializer; a quantized model's weights are a DequantizeLinear, and its
    QDQ fusion into int8 kernels wants the bias in the Conv: ResNet-50's quantized convolutions ran
    in float otherwise (73 ms; 10 with the bias in place)."""
    readers = _readers(writer.nodes)
    dropped = set()
    for conv in writer.nodes:
        if conv.op_type != "Conv" or len(conv.input) != 2 or conv.output[0] in outputs or len(readers.get(conv.output[0], [])) != 1:
            continue
        add = readers[conv.output[0]][0]
        if add.op_type != "Add" or len(add.input) != 2:
            continue
        bias = next((name for name in add.input if name != conv.output[0] and name in constants), None)
        shape = np.shape(constants[bias]) if bias is not None else ()
        # one value per output channel, laid out as the convolution's result ([1, C, 1, 1])
        if bias is None or len(shape) < 3 or shape[1] != channels.get(conv.output[0]) or np.prod(shape) != shape[1]:
            continue
        conv.input.append(writer.constant(np.asarray(constants[bias]).reshape(-1), f"{conv.name}_bias"))
        conv.output[0] = add.output[0]
        dropped.add(id(add))
    writer.nodes[:] = [node for node in writer.nodes if id(node) not in dropped]


def _scalars(writer: Writer, constants: Mapping[str, np.ndarray]) -> dict[str, float]:
    """The value of each one-element constant tensor (the region's and those written), by name."""
    arrays = [*((name, np.asarray(value)) for name, value in constants.items()),
              *((i.name, numpy_helper.to_array(i)) for i in writer.initializers)]
    return {name: float(value.reshape(-1)[0]) for name, value in arrays if value.size == 1}


def hard_activations(writer: Writer, constants: Mapping[str, np.ndarray], outputs: set[str]) -> None:
    """x * Clip(x + 3, 0, 6) / 6, which TVM's importer writes for HardSwish, as HardSwish(x), and
    Clip(x + 3, 0, 6) / 6 (HardSigmoid's form) as HardSigmoid(x, 1/6, 0.5): onnxruntime fuses
    either into the convolution before it, and ran the four ops apart (MobileNetV3-Large through
    the onnxruntime vendor: 1.3x onnxruntime on the same file)."""
    readers, scalar = _readers(writer.nodes), _scalars(writer, constants).get
    dropped: set[int] = set()

    def sole_reader(node: onnx.NodeProto, op_type: str) -> onnx.NodeProto | None:
        found = readers.get(node.output[0], [])
        return found[0] if len(found) == 1 and found[0].op_type == op_type and node.output[0] not in outputs else None

    for add in list(writer.nodes):
        if add.op_type != "Add" or id(add) in dropped or len(add.input) != 2:
            continue
        x = next((a for a, b in (add.input, add.input[::-1]) if scalar(b) == 3.0), None)
        clip = sole_reader(add, "Clip") if x is not None else None
        if clip is None or len(clip.input) != 3 or [scalar(b) for b in clip.input[1:]] != [0.0, 6.0]:
            continue
        div = sole_reader(clip, "Div")
        if div is None or div.input[0] != clip.output[0] or scalar(div.input[1]) != 6.0:
            continue
        mul = sole_reader(div, "Mul")
        if mul is not None and set(mul.input) == {x, div.output[0]}:
            mul.op_type, mul.input[:] = "HardSwish", [x]
            dropped.update({id(add), id(clip), id(div)})
        else:
            div.op_type, div.input[:] = "HardSigmoid", [x]
            div.attribute.extend([helper.make_attribute("alpha", 1.0 / 6.0), helper.make_attribute("beta", 0.5)])
            dropped.update({id(add), id(clip)})
    _scaled_hard_sigmoids(writer, scalar, sole_reader, dropped)
    writer.nodes[:] = [node for node in writer.nodes if id(node) not in dropped]


def _scaled_hard_sigmoids(writer: Writer, scalar, sole_reader, dropped: set[int]) -> None:
    """Clip(x * alpha + beta, 0, 1), TVM's importer's HardSigmoid, as HardSigmoid(x, alpha, beta)."""
    for mul in list(writer.nodes):
        if mul.op_type != "Mul" or id(mul) in dropped or len(mul.input) != 2:
            continue
        scaled = next(((a, scalar(b)) for a, b in (mul.input, mul.input[::-1]) if scalar(b) is not None), None)
        add = sole_reader(mul, "Add") if scaled is not None else None
        beta = next((scalar(b) for b in add.input if b != mul.output[0]), None) if add is not None else None
        clip = sole_reader(add, "Clip") if beta is not None else None
        if clip is None or len(clip.input) != 3 or [scalar(b) for b in clip.input[1:]] != [0.0, 1.0]:
            continue
        clip.op_type, clip.input[:] = "HardSigmoid", [scaled[0]]
        clip.attribute.extend([helper.make_attribute("alpha", scaled[1]), helper.make_attribute("beta", beta)])
        dropped.update({id(mul), id(add)})


def dequantized_matmul_as_gemm(writer: Writer, constants: Mapping[str, np.ndarray], outputs: set[str], matrices: set[str]) -> None:
    """MatMul(A, DequantizeLinear(int8 [K, N] constant, per column)) of a 2-D A, as the Gemm a
    quantized model writes: Gemm(A, DequantizeLinear([N, K] transposed, per row), transB=1), with
    the constant bias its only reader adds as C (int32 where A is dequantized). onnxruntime fuses
    that into its int8 QGemm, and dequantizes the weights per row; per column, on the last axis,
    its DequantizeLinear took 4.7 ms a run for MobileNetV2's [1280, 1000] classifier (1.6 ms the
    whole model from the file)."""
    readers = _readers(writer.nodes)
    producer = _producers(writer.nodes)
    replaced: dict[int, list[onnx.NodeProto]] = {}  # a MatMul -> the nodes that take its place
    dropped: set[int] = set()
    for matmul in writer.nodes:
        if matmul.op_type != "MatMul" or matmul.output[0] not in matrices:
            continue
        dequantize = producer.get(matmul.input[1])
        if dequantize is None or dequantize.op_type != "DequantizeLinear" or dequantize.input[0] not in constants:
            continue
        data = np.asarray(constants[dequantize.input[0]])
        scale = np.asarray(constants.get(dequantize.input[1], np.empty(0)))
        axis = next((a.i for a in dequantize.attribute if a.name == "axis"), 1)
        if data.ndim != 2 or (scale.size > 1 and axis % 2 != 1) or len(dequantize.input) < 2:
            continue
        transposed = writer.constant(np.ascontiguousarray(data.T), f"{dequantize.name}_transposed")
        weights = writer.fresh(f"{dequantize.name}_rows")
        nodes = [helper.make_node("DequantizeLinear", [transposed, *dequantize.input[1:]], [weights],
                                  name=writer.fresh(dequantize.name), **({"axis": 0} if scale.size > 1 else {}))]
        inputs, result = [matmul.input[0], weights], matmul.output[0]
        add = readers.get(result, [None])[0] if len(readers.get(result, [])) == 1 and result not in outputs else None
        bias = next((n for n in add.input if n != result and n in constants), None) if add is not None and add.op_type == "Add" else None
        source = producer.get(matmul.input[0])
        if bias is not None and np.size(constants[bias]) == data.shape[1] and np.ndim(constants[bias]) <= 2 \
                and source is not None and source.op_type == "DequantizeLinear" and np.size(constants.get(source.input[1], ())) == 1:
            # int32 at the input's scale times the weights', as onnxruntime's tool writes it (its
            # QGemm fusion takes no float bias): the model's own int32 values, read back exactly
            step = (np.float32(constants[source.input[1]]) * scale.astype(np.float32)).reshape(-1)
            values = np.round(np.asarray(constants[bias], np.float64).reshape(-1) / step).astype(np.int32)
            quantized = [writer.constant(values, f"{matmul.name}_bias"), writer.constant(np.broadcast_to(step, values.shape).copy(), "scale"),
                         writer.constant(np.zeros(values.shape, np.int32), "zero")]
            inputs.append(writer.fresh(f"{matmul.name}_bias"))
            nodes.append(helper.make_node("DequantizeLinear", quantized, [inputs[-1]], name=writer.fresh(matmul.name), axis=0))
            result = add.output[0]
            dropped.add(id(add))
        # in the MatMul's place: its inputs come before it, and the add's readers after the add
        replaced[id(matmul)] = [*nodes, helper.make_node("Gemm", inputs, [result], name=writer.fresh(matmul.name), transB=1)]
        if len(readers.get(dequantize.output[0], [])) == 1 and dequantize.output[0] not in outputs:
            dropped.add(id(dequantize))
    writer.nodes[:] = [new for node in writer.nodes if id(node) not in dropped for new in replaced.get(id(node), [node])]


# The ONNX ops byoc.ir.quantization.INT8_MOVES are written as.
_INT8_MOVES = ("Reshape", "Transpose", "Slice", "Unsqueeze", "Squeeze", "Flatten", "Expand")


def _constant_values(writer: Writer, constants: Mapping[str, np.ndarray]) -> Callable[[str], np.ndarray | None]:
    """The value of a constant by name, the region's or an initializer the translation wrote (read
    into numpy when asked for: a weight the translation transposes is one); None for any other name."""
    initializers = {i.name: i for i in writer.initializers}

    def value(name: str) -> np.ndarray | None:
        if name in constants:
            return constants[name]
        return numpy_helper.to_array(initializers[name]) if name in initializers else None

    return value


def layout_between_quantize_and_dequantize(writer: Writer, constants: Mapping[str, np.ndarray], graph_outputs: set[str]) -> None:
    """QuantizeLinear -> moves (Reshape, Transpose, Slice, ...: one or a chain) -> DequantizeLinear
    (of one scale and zero point), as partitioning leaves a quantized model's moves on its int8
    data, written back as the model had them: DequantizeLinear -> the moves -> QuantizeLinear, the
    same values exactly.
    onnxruntime makes int8 activations uint8 (its fast format on x86) only for a QuantizeLinear
    that a DequantizeLinear reads directly; with a move between, its QGemm and QLinearConv
    fusions did not happen (MobileNetV2's classifier ran in float; a Llama's grouped-query
    attention, a slice, new axis, broadcast and reshape, took its run from 6.2 to 11.0 ms)."""
    readers = _readers(writer.nodes)
    producer = _producers(writer.nodes)
    value = _constant_values(writer, constants)

    def same(a: list[str], b: list[str]) -> bool:  # one scale and zero point: by name, or by value
        if a == b:
            return True
        pairs = [(value(x), value(y)) for x, y in zip(a, b)]
        return len(a) == len(b) and all(x is not None and y is not None and np.array_equal(x, y) for x, y in pairs)

    replaced: dict[int, list[onnx.NodeProto]] = {}
    for first in writer.nodes:
        quantize = producer.get(first.input[0]) if first.op_type in _INT8_MOVES else None
        if quantize is None or quantize.op_type != "QuantizeLinear" or id(first) in replaced:
            continue
        chain = [first]
        while chain[-1].output[0] not in graph_outputs and len(after := readers.get(chain[-1].output[0], [])) == 1 \
                and after[0].op_type in _INT8_MOVES:
            chain.append(after[0])
        after = readers.get(chain[-1].output[0], [])
        if not after or any(d.op_type != "DequantizeLinear" or not same(list(d.input[1:]), list(quantize.input[1:])) for d in after):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in quantize.attribute}
        current = writer.fresh(f"{first.name}_dequantized")
        nodes = [helper.make_node("DequantizeLinear", [first.input[0], *quantize.input[1:]], [current], name=writer.fresh(first.name), **attrs)]
        for move in chain:
            moved = writer.fresh(f"{move.name}_float")
            nodes.append(helper.make_node(move.op_type, [current, *move.input[1:]], [moved], name=move.name,
                                          **{a.name: helper.get_attribute_value(a) for a in move.attribute}))
            current = moved
        nodes.append(helper.make_node("QuantizeLinear", [current, *quantize.input[1:]], list(chain[-1].output), name=writer.fresh(chain[-1].name),
                                      **attrs))
        # in the last move's place, where every move's other inputs (shapes, starts) are written
        replaced.update({id(move): [] for move in chain[:-1]})
        replaced[id(chain[-1])] = nodes
    writer.nodes[:] = [new for node in writer.nodes for new in replaced.get(id(node), [node])]


class _DynamicQuantization:
    """ONNX DynamicQuantizeLinear as TVM expands it, found back in the ONNX the translation wrote
    (ReduceMax, ReduceMin, Max, Min, Sub, Div, Div, Sub, Clip, Round, Cast into a QuantizeLinear)."""

    def __init__(self, writer: Writer, constants: Mapping[str, np.ndarray]) -> None:
        self.producer = _producers(writer.nodes)
        self.value = _constant_values(writer, constants)

    def _node(self, name: str, op_type: str) -> onnx.NodeProto | None:
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    def _is(self, name: str, value: float) -> bool:
        array = self.value(name)
        return array is not None and np.size(array) == 1 and float(np.asarray(array).reshape(-1)[0]) == value

    def _bound(self, name: str, op_type: str, reduce: str, x: str) -> list[onnx.NodeProto] | None:
        """Max(0, ReduceMax(x)) or Min(0, ReduceMin(x)), over every element."""
        outer = self._node(name, op_type)
        if outer is None or len(outer.input) != 2:
            return None
        zero, inner = (outer.input[0], outer.input[1]) if self._is(outer.input[0], 0.0) else (outer.input[1], outer.input[0])
        reduction = self._node(inner, reduce)
        if not self._is(zero, 0.0) or reduction is None or list(reduction.input) != [x]:
            return None
        return [outer, reduction]

    def chain(self, quantize: onnx.NodeProto) -> list[onnx.NodeProto] | None:
        """The nodes that compute `quantize`'s scale and zero point from its input as
        DynamicQuantizeLinear does, or None."""
        if len(quantize.input) != 3:
            return None
        x, scale, zero = quantize.input
        divide, cast = self._node(scale, "Div"), self._node(zero, "Cast")
        spread = self._node(divide.input[0], "Sub") if divide is not None and self._is(divide.input[1], 255.0) else None
        high = self._bound(spread.input[0], "Max", "ReduceMax", x) if spread is not None else None
        low = self._bound(spread.input[1], "Min", "ReduceMin", x) if spread is not None else None
        rounded = self._node(cast.input[0], "Round") if cast is not None else None
        clip = self._node(rounded.input[0], "Clip") if rounded is not None else None
        if high is None or low is None or clip is None or len(clip.input) != 3 or not (self._is(clip.input[1], 0.0) and self._is(clip.input[2], 255.0)):
            return None
        negated = self._node(clip.input[0], "Sub")
        level = self._node(negated.input[1], "Div") if negated is not None and self._is(negated.input[0], 0.0) else None
        if level is None or list(level.input) != [spread.input[1], scale]:
            return None
        return [divide, spread, *high, *low, cast, rounded, clip, negated, level]


def _dequantized_weights(dequantize: onnx.NodeProto, value: Callable[[str], np.ndarray | None]) -> np.ndarray:
    """The float values of DequantizeLinear(constant int8 weights, constant scale, zero point)."""
    axis = next((helper.get_attribute_value(a) for a in dequantize.attribute if a.name == "axis"), 1)  # ONNX's default
    return dequantize_array(*(value(name) for name in dequantize.input), axis)


def dynamic_quantization_as_the_model_had_it(writer: Writer, constants: Mapping[str, np.ndarray], outputs: set[str]) -> None:
    """DynamicQuantizeLinear as TVM expands it, and each DequantizeLinear of its result times
    DequantizeLinear(int8 constant weights), written as `quantize_dynamic` writes them:
    DynamicQuantizeLinear, then MatMulInteger -> Cast -> Mul by the product of the two scales.
    onnxruntime fuses that into its DynamicQuantizeMatMul kernel; the expanded form ran in float
    (a quantize_dynamic BERT: 115 ms against onnxruntime's 38 on the file). A convolution keeps its
    float form, its weights dequantized once."""
    found = _DynamicQuantization(writer, constants)
    readers = _readers(writer.nodes)
    replaced: dict[int, list[onnx.NodeProto]] = {}
    dropped: set[int] = set()
    first: dict[str, list[str]] = {}  # input -> the outputs of its first DynamicQuantizeLinear
    alias: dict[str, str] = {}  # an output of a later one of the same input -> the first's
    for quantize in writer.nodes:
        chain = found.chain(quantize) if quantize.op_type == "QuantizeLinear" else None
        if chain is None:
            continue
        x, scale, zero = quantize.input
        inside = {id(node) for node in chain} | {id(quantize)}
        dequantizes = [r for r in readers.get(quantize.output[0], []) if r.op_type == "DequantizeLinear" and list(r.input) == [quantize.output[0], scale, zero]]
        allowed = inside | {id(d) for d in dequantizes}
        if any(out in outputs or any(id(r) not in allowed for r in readers.get(out, [])) for node in chain for out in node.output) \
                or quantize.output[0] in outputs:
            continue
        dropped |= {id(node) for node in chain}
        # import writes one quantization per product (byoc.frontend.onnx.qoperator); the file
        # had one per input, read by all its products (a BERT layer's Q, K and V)
        if x in first:
            alias.update(zip([quantize.output[0], scale, zero], first[x]))
            dropped.add(id(quantize))
        else:
            first[x] = [quantize.output[0], scale, zero]
            replaced[id(quantize)] = [helper.make_node("DynamicQuantizeLinear", [x], first[x], name=quantize.name)]
        for dequantize in dequantizes:
            after = readers.get(dequantize.output[0], [])
            found_product = len(after) == 1 and after[0].op_type in ("MatMul", "Conv") and after[0].input[0] == dequantize.output[0]
            product_node = after[0] if found_product else None
            weights = found.producer.get(product_node.input[1]) if product_node is not None else None
            if weights is None or weights.op_type != "DequantizeLinear" or len(weights.input) != 3 \
                    or weights.input[0] not in constants or np.asarray(constants[weights.input[0]]).dtype != np.int8 \
                    or (product_node.op_type == "MatMul" and np.ndim(constants[weights.input[0]]) != 2) \
                    or any(found.value(name) is None for name in weights.input[1:]) or dequantize.output[0] in outputs:
                continue
            name = product_node.name
            if product_node.op_type == "Conv":
                # onnxruntime's ConvInteger is slower than its float convolution (ResNet-18: 62 ms
                # on the file against 13.5 with this hand-off): the weights are dequantized here,
                # once, and the input as the model does it; the product is the same to float rounding.
                product_node.input[1] = writer.constant(_dequantized_weights(weights, found.value), f"{name}_weights")
                if len(readers.get(weights.output[0], [])) == 1:
                    dropped.add(id(weights))
                continue
            product, integers, floats = (writer.fresh(f"{name}_{part}") for part in ("scales", "int32", "float"))
            replaced[id(product_node)] = [
                helper.make_node("Mul", [scale, weights.input[1]], [product], name=writer.fresh(name)),
                helper.make_node("MatMulInteger", [quantize.output[0], weights.input[0], zero, weights.input[2]], [integers], name=name),
                helper.make_node("Cast", [integers], [floats], name=writer.fresh(name), to=onnx.TensorProto.FLOAT),
                helper.make_node("Mul", [floats, product], list(product_node.output), name=writer.fresh(name)),
            ]
            dropped.add(id(dequantize))
            if len(readers.get(weights.output[0], [])) == 1:
                dropped.add(id(weights))
    writer.nodes[:] = [new for node in writer.nodes if id(node) not in dropped for new in replaced.get(id(node), [node])]
    for node in writer.nodes:
        node.input[:] = [alias.get(name, name) for name in node.input]
