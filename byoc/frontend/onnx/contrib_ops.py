"""onnxruntime's fused transformer ops written in standard ONNX before import.

onnxruntime's transformer optimizer (`onnxruntime.transformers.optimizer`, and the tools built on
it) rewrites an exported BERT or GPT-2 into its own com.microsoft ops: EmbedLayerNormalization,
Attention, SkipLayerNormalization, BiasGelu, FastGelu and their relatives. Such files are common,
and run only where those kernels exist. Each op is written here as the standard ops it is
defined by (onnxruntime's contrib op documentation and CPU kernels, masks included), so the
model imports as its unfused export would, and vendors fuse it their own way. Their quantized
forms, as `quantize_dynamic` writes an optimized model (QAttention, QEmbedLayerNormalization),
are the float ops of their dequantized operands, which byoc then runs as any such model.

A model onnxruntime saved after optimizing it (`SessionOptions.optimized_model_filepath`) holds
FusedConv, FusedGemm and FusedMatMul: a Conv or Gemm with the activation (and, for FusedConv, the
added tensor) it fused into it, and a MatMul with its operands' transposes and a scale. Each is
written as those ops. Weights quantized in blocks (MatMulNBits, MatMulBnb4, GatherBlockQuantized)
are dequantized once (see byoc.frontend.onnx.nbits).

Attention with a past key/value state, rotary embeddings or a 4D mask, and the other com.microsoft
ops, are left as they are: import then refuses them by node.

ONNX's own Attention (opset 23, which torch's exporter writes at that opset) is written here too,
in the form its opset-18 exports take, where it is 4D without a past state; its function body,
correct but cut into several dnnl regions, defines the other forms.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

from byoc.errors import ModelLoadError
from byoc.frontend.onnx.nbits import BNB4_CODES, block_dequantized, bnb4_weight, dequantized_weight

_MICROSOFT = "com.microsoft"
_STANDARD = ("", "ai.onnx")
_DEFAULT_OPSET = 17
_MASK_FILTER = -10000.0  # what onnxruntime adds to the scores of masked positions (its default mask_filter_value)


class _Writer:
    """Emits standard nodes at the model's opset (whose forms of Unsqueeze, ReduceMean and
    LayerNormalization differ)."""

    def __init__(self, model: onnx.ModelProto) -> None:
        # a model of com.microsoft ops alone gets the standard domain at 17 (see _with_nodes)
        self.opset = next((o.version for o in model.opset_import if o.domain in _STANDARD), _DEFAULT_OPSET)
        self.initializers = {i.name: i for i in model.graph.initializer}
        self.nodes: list[onnx.NodeProto] = []
        self.added: list[onnx.TensorProto] = []
        self.base = ""
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{self.base}/{hint}_{self.count}"

    def const(self, value, dtype=np.float32) -> str:
        name = self.name("const")
        self.added.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, **attrs) -> str:
        return self.ops(op_type, inputs, outputs, **attrs)[0]

    def ops(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, **attrs) -> list[str]:
        names = outputs if isinstance(outputs, list) else [self.name(op_type) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=self.name(op_type), **attrs))
        return names

    def unsqueeze(self, x: str, axes: list[int]) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.const(axes, np.int64)])
        return self.op("Unsqueeze", [x], axes=axes)

    def mean_last(self, x: str) -> str:
        if self.opset >= 18:
            return self.op("ReduceMean", [x, self.const([-1], np.int64)], keepdims=1)
        return self.op("ReduceMean", [x], axes=[-1], keepdims=1)

    def layer_norm(self, x: str, gamma: str, beta: str, epsilon: float, outputs: list[str]) -> None:
        """LayerNormalization over the last axis into `outputs` (Y, Mean, InvStdDev; "" for one
        not wanted)."""
        if self.opset >= 17:
            while not outputs[-1]:
                outputs = outputs[:-1]
            self.op("LayerNormalization", [x, gamma, beta] if beta else [x, gamma], outputs, axis=-1, epsilon=epsilon)
            return
        # before opset 17, in the form exporters write (as vendors' patterns read it)
        mean = self.mean_last(x)
        centred = self.op("Sub", [x, mean])
        deviation = self.op("Sqrt", [self.op("Add", [self.mean_last(self.op("Pow", [centred, self.const(2.0)])), self.const(epsilon)])])
        normalized = self.op("Mul", [self.op("Div", [centred, deviation]), gamma])
        self.op("Add" if beta else "Identity", [normalized, beta] if beta else [normalized], [outputs[0]])
        for output, value in zip(outputs[1:], (mean, deviation)):
            if output:
                self.op("Identity" if value is mean else "Reciprocal", [value], [output])

    def rms_norm(self, x: str, gamma: str, epsilon: float, output: str, inverse_output: str = "") -> None:
        """x / sqrt(mean(x^2) + epsilon) * gamma, as exporters write RMSNorm."""
        spread = self.op("Add", [self.mean_last(self.op("Pow", [x, self.const(2.0)])), self.const(epsilon)])
        inverse = self.op("Div", [self.const(1.0), self.op("Sqrt", [spread])])
        self.op("Mul", [self.op("Mul", [x, inverse]), gamma], [output])
        if inverse_output:
            self.op("Identity", [inverse], [inverse_output])

    def gelu(self, x: str, output: str, tanh: bool = False) -> None:
        if tanh:  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            cube = self.op("Mul", [self.op("Mul", [x, x]), x])
            inner = self.op("Mul", [self.op("Add", [x, self.op("Mul", [cube, self.const(0.044715)])]), self.const(math.sqrt(2 / math.pi))])
            self.op("Mul", [self.op("Mul", [x, self.const(0.5)]), self.op("Add", [self.op("Tanh", [inner]), self.const(1.0)])], [output])
            return
        erf = self.op("Erf", [self.op("Div", [x, self.const(math.sqrt(2.0))])])
        self.op("Mul", [self.op("Mul", [x, self.const(0.5)]), self.op("Add", [erf, self.const(1.0)])], [output])

    def causal_bias(self, queries: str, keys: str, value: float) -> str:
        """`value` where key j comes after query i (j > i), 0 elsewhere: (queries, keys), from
        their positions."""
        later = self.op("Greater", [self.unsqueeze(keys, [0]), self.unsqueeze(queries, [1])])
        return self.op("Where", [later, self.const(value), self.const(0.0)])

    def sequence_range(self, x: str, axis: int) -> str:
        """0 .. x.shape[axis] - 1, as int64."""
        length = self.op("Gather", [self.op("Shape", [x]), self.const(axis, np.int64)], axis=0)
        return self.op("Range", [self.const(0, np.int64), length, self.const(1, np.int64)])


def _attrs(node: onnx.NodeProto) -> dict:
    """A node's attributes as Python values, text as str (onnx gives bytes)."""
    values = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {name: value.decode() if isinstance(value, bytes) else value for name, value in values.items()}


def _input(node: onnx.NodeProto, index: int) -> str:
    return node.input[index] if len(node.input) > index else ""


def _output(node: onnx.NodeProto, index: int) -> str:
    return node.output[index] if len(node.output) > index else ""


def _refuse(node: onnx.NodeProto, why: str) -> ModelLoadError:
    return ModelLoadError(f"node {node.name or node.output[0]!r} ({_MICROSOFT} {node.op_type}): {why}")


def _skip_sum(w: _Writer, node: onnx.NodeProto, bias: str) -> str:
    """input + skip (+ bias), written into the op's input_skip_bias_sum output where it has one."""
    total = w.op("Add", [node.input[0], node.input[1]])
    if bias:
        total = w.op("Add", [total, bias])
    if _output(node, 3):
        w.op("Identity", [total], [_output(node, 3)])
    return total


def _skip_layer_norm(w: _Writer, node: onnx.NodeProto) -> None:
    total = _skip_sum(w, node, _input(node, 4))
    w.layer_norm(total, node.input[2], _input(node, 3), _attrs(node).get("epsilon", 1e-12), [node.output[0], _output(node, 1), _output(node, 2)])


def _skip_simplified_layer_norm(w: _Writer, node: onnx.NodeProto) -> None:
    total = _skip_sum(w, node, _input(node, 3))
    w.rms_norm(total, node.input[2], _attrs(node).get("epsilon", 1e-12), node.output[0], _output(node, 2))


def _simplified_layer_norm(w: _Writer, node: onnx.NodeProto) -> None:
    if _attrs(node).get("axis", -1) != -1:
        raise _refuse(node, "normalizing over other axes than the last is not supported")
    w.rms_norm(node.input[0], node.input[1], _attrs(node).get("epsilon", 1e-5), node.output[0], _output(node, 1))


def _gelu(tanh: bool, with_bias: bool) -> Callable[[_Writer, onnx.NodeProto], None]:
    def write(w: _Writer, node: onnx.NodeProto) -> None:
        x = w.op("Add", [node.input[0], node.input[1]]) if with_bias and _input(node, 1) else node.input[0]
        w.gelu(x, node.output[0], tanh)

    return write


def _quick_gelu(w: _Writer, node: onnx.NodeProto) -> None:
    alpha = _attrs(node).get("alpha", 1.702)
    w.op("Mul", [node.input[0], w.op("Sigmoid", [w.op("Mul", [node.input[0], w.const(alpha)])])], [node.output[0]])


def _embed_layer_norm(w: _Writer, node: onnx.NodeProto) -> None:
    """word + position (+ segment) embeddings, layer-normalized; the mask index is the count of
    ones in each row of the mask (0 without one), as onnxruntime's kernel gives it."""
    ids, segments, words, positions, segment_table = (_input(node, i) for i in range(5))
    gamma, beta, mask, position_ids = (_input(node, i) for i in range(5, 9))
    total = w.op("Add", [w.op("Gather", [words, ids], axis=0),
                         w.op("Gather", [positions, position_ids or w.sequence_range(ids, 1)], axis=0)])
    if segments and segment_table:
        total = w.op("Add", [total, w.op("Gather", [segment_table, segments], axis=0)])
    w.layer_norm(total, gamma, beta, _attrs(node).get("epsilon", 1e-12), [node.output[0]])
    if _output(node, 1):
        if mask:
            ones = w.op("Cast", [w.op("Equal", [mask, w.op("CastLike", [w.const(1, np.int32), mask]) if w.opset >= 15
                                                else w.const(1, np.int32)])], to=onnx.TensorProto.INT32)
            if w.opset >= 13:
                w.op("ReduceSum", [ones, w.const([1], np.int64)], [_output(node, 1)], keepdims=0)
            else:
                w.op("ReduceSum", [ones], [_output(node, 1)], axes=[1], keepdims=0)
        else:
            batch = w.op("Gather", [w.op("Shape", [ids]), w.const([0], np.int64)], axis=0)
            w.op("ConstantOfShape", [batch], [_output(node, 1)], value=numpy_helper.from_array(np.zeros(1, np.int32)))
    if _output(node, 2):
        w.op("Identity", [total], [_output(node, 2)])


def _attention(w: _Writer, node: onnx.NodeProto, shapes: dict[str, list]) -> None:
    """softmax(Q K^T * scale + mask) V per head, the packed Q, K and V projected by one product;
    masked positions get mask_filter_value added, as onnxruntime's kernel does."""
    attrs = _attrs(node)
    if _input(node, 4) or _output(node, 1):
        raise _refuse(node, "attention with a past key/value state is not supported")
    if attrs.get("do_rotary"):
        raise _refuse(node, "rotary embeddings inside attention are not supported")
    if "num_heads" not in attrs:
        raise _refuse(node, "it has no num_heads attribute")
    heads = int(attrs["num_heads"])
    weights = w.initializers.get(node.input[1])
    sizes = list(attrs.get("qkv_hidden_sizes", []))
    if not sizes:
        if weights is None or len(weights.dims) != 2 or weights.dims[1] % 3:
            raise _refuse(node, "the Q, K and V sizes need qkv_hidden_sizes or constant weights")
        sizes = [weights.dims[1] // 3] * 3
    packed = w.op("MatMul", [node.input[0], node.input[1]])
    if _input(node, 2):
        packed = w.op("Add", [packed, node.input[2]])
    q, k, v = w.ops("Split", [packed, w.const(sizes, np.int64)], 3, axis=-1) if w.opset >= 13 else \
        w.ops("Split", [packed], 3, axis=-1, split=sizes)
    by_head = w.const([0, 0, heads, -1], np.int64)
    q = w.op("Transpose", [w.op("Reshape", [q, by_head])], perm=[0, 2, 1, 3])
    k = w.op("Transpose", [w.op("Reshape", [k, by_head])], perm=[0, 2, 3, 1])
    v = w.op("Transpose", [w.op("Reshape", [v, by_head])], perm=[0, 2, 1, 3])
    scale = attrs.get("scale") or 1.0 / math.sqrt(sizes[0] // heads)
    scores = w.op("Mul", [w.op("MatMul", [q, k]), w.const(scale)])
    bias = _mask_bias(w, node, shapes, attrs.get("mask_filter_value", _MASK_FILTER))
    if bias:
        scores = w.op("Add", [scores, bias])
    if _input(node, 5):  # attention_bias (B or 1, N or 1, S, S)
        scores = w.op("Add", [scores, node.input[5]])
    probabilities = w.op("Softmax", [scores], axis=-1)  # the last axis at every opset (before 13, dims from it on)
    merged = w.op("Transpose", [w.op("MatMul", [probabilities, v])], perm=[0, 2, 1, 3])
    w.op("Reshape", [merged, w.const([0, 0, -1], np.int64)], [node.output[0]])


def _mask_bias(w: _Writer, node: onnx.NodeProto, shapes: dict[str, list], filter_value: float) -> str:
    """What is added to the scores (batch, heads, sequence, keys) for the mask and causality."""
    mask, x = _input(node, 3), node.input[0]
    bias = ""
    if mask:
        rank = len(shapes[mask]) if mask in shapes else None
        if rank == 1:  # end positions (B), or ends then starts (2B): right and left padding
            batch, length = (shapes.get(x) or [None])[0], shapes[mask][0]
            if batch is None or length is None or length not in (batch, 2 * batch if isinstance(batch, int) else None):
                raise _refuse(node, f"cannot tell whether its 1D mask ({length} values for a batch of {batch}) holds start "
                                    "positions too")
            keys = w.unsqueeze(w.sequence_range(x, 1), [0])
            positions = w.op("Cast", [mask], to=onnx.TensorProto.INT64)
            if length == batch:
                keep = w.op("Less", [keys, w.unsqueeze(positions, [1])])
            else:
                pairs = w.op("Reshape", [positions, w.const([2, -1], np.int64)])
                ends, starts = (w.unsqueeze(w.op("Gather", [pairs, w.const(row, np.int64)], axis=0), [1]) for row in (0, 1))
                keep = w.op("And", [w.op("Less", [keys, ends]), w.op("Not", [w.op("Less", [keys, starts])])])
            keep = w.unsqueeze(keep, [1, 2])
        elif rank in (2, 3):  # raw (B, keys), or per query (B, S, keys): 1 attends, 0 does not
            keep = w.unsqueeze(w.op("Greater", [mask, w.op("CastLike", [w.const(0, np.int32), mask])]), [1, 2] if rank == 2 else [1])
        else:
            raise _refuse(node, f"a mask of rank {rank if rank is not None else 'unknown'} is not supported (1, 2 or 3)")
        bias = w.op("Where", [keep, w.const(0.0), w.const(filter_value)])
    if _attrs(node).get("unidirectional"):
        positions = w.sequence_range(x, 1)
        causal = w.causal_bias(positions, positions, filter_value)
        bias = w.op("Add", [bias, causal]) if bias else causal
    return bias


def _dequantize(w: _Writer, value: str, scale: str, zero: str, axis: int | None = None) -> str:
    attrs = {"axis": axis} if axis is not None else {}
    return w.op("DequantizeLinear", [value, scale, zero] if zero else [value, scale], **attrs) if value else ""


def _q_embed_layer_norm(w: _Writer, node: onnx.NodeProto) -> None:
    """EmbedLayerNormalization of its tables dequantized (quantize_dynamic of an optimized
    BERT): each table, gamma and beta with its own scale and zero point."""
    given = [_input(node, i) for i in range(18)]
    # table input -> (its scale, its zero point)
    quantized = {2: (8, 13), 3: (9, 14), 4: (10, 15), 5: (11, 16), 6: (12, 17)}
    tables = {i: _dequantize(w, given[i], given[scale], given[zero]) for i, (scale, zero) in quantized.items()}
    inputs = [given[0], given[1], *(tables[i] for i in range(2, 7)), given[7]]
    _embed_layer_norm(w, helper.make_node("EmbedLayerNormalization", inputs, node.output, name=node.name, domain=_MICROSOFT,
                                          epsilon=_attrs(node).get("epsilon", 1e-12)))


def _dequantized_attention(w: _Writer, node: onnx.NodeProto) -> onnx.NodeProto:
    """QAttention as the Attention of its dequantized input and weights (per tensor, or per
    column of the packed Q, K and V weights); the Attention is written with the others."""
    given = [_input(node, i) for i in range(9)]
    weight_scale = w.initializers.get(given[4])
    per_column = weight_scale is not None and len(weight_scale.dims) == 1 and weight_scale.dims[0] > 1
    x = _dequantize(w, given[0], given[3], given[6])
    weights = _dequantize(w, given[1], given[4], given[7], axis=1 if per_column else None)
    inputs = [x, weights, given[2], given[5], given[8]]
    while not inputs[-1]:
        inputs.pop()
    attrs = _attrs(node)
    packed = w.initializers.get(given[1])  # the sizes of Q, K and V, read from the quantized weights
    if "qkv_hidden_sizes" not in attrs and packed is not None and len(packed.dims) == 2 and packed.dims[1] % 3 == 0:
        attrs["qkv_hidden_sizes"] = [packed.dims[1] // 3] * 3
    return helper.make_node("Attention", inputs, node.output, name=node.name, domain=_MICROSOFT, **attrs)


def _constant_arrays(w: _Writer, node: onnx.NodeProto, names: list[str], what: str) -> list[np.ndarray | None]:
    """The values of the initializers `names` ("" for an input left out: None), or the node
    refused where any is computed at run time; `what` names them in the refusal."""
    missing = [name for name in names if name and name not in w.initializers]
    if missing:
        raise _refuse(node, f"its {what} must be constants; {missing} are computed at run time")
    return [numpy_helper.to_array(w.initializers[name]) if name else None for name in names]


def _matmul_nbits(w: _Writer, node: onnx.NodeProto) -> None:
    """A MatMul on the weights dequantized once (see byoc.frontend.onnx.nbits), then the bias."""
    attrs = _attrs(node)
    bits, block_size = int(attrs.get("bits", 4)), int(attrs["block_size"])
    if bits not in (2, 4, 8):
        raise _refuse(node, f"{bits}-bit codes are not supported (2, 4 and 8 are)")
    packed, scales, zero_points, groups = _constant_arrays(w, node, [_input(node, index) for index in range(1, 5)],
                                                           "weights, scales and zero points")
    weight = dequantized_weight(packed, scales, zero_points, groups, int(attrs["K"]), int(attrs["N"]), bits, block_size)
    bias = _input(node, 5)
    product = w.op("MatMul", [node.input[0], w.const(weight, weight.dtype)], [node.output[0]] if not bias else 1)
    if bias:
        w.op("Add", [product, bias], [node.output[0]])


def _matmul_bnb4(w: _Writer, node: onnx.NodeProto) -> None:
    """A MatMul on bitsandbytes' 4-bit weights dequantized once (see byoc.frontend.onnx.nbits)."""
    attrs = _attrs(node)
    quant_type = int(attrs["quant_type"])
    if quant_type not in BNB4_CODES:
        raise _refuse(node, f"quant_type {quant_type} is neither FP4 (0) nor NF4 (1)")
    packed, absmax = _constant_arrays(w, node, list(node.input[1:3]), "weights and scales")
    weight = bnb4_weight(packed, absmax, int(attrs["K"]), int(attrs["N"]), int(attrs["block_size"]), quant_type)
    w.op("MatMul", [node.input[0], w.const(weight, weight.dtype)], [node.output[0]])


def _gather_block_quantized(w: _Writer, node: onnx.NodeProto) -> None:
    """A Gather from the table dequantized once (a quantized embedding, see byoc.frontend.onnx.nbits)."""
    attrs = _attrs(node)
    data, scales, zero_points = _constant_arrays(w, node, [_input(node, 0), _input(node, 2), _input(node, 3)],
                                                 "table, scales and zero points")
    data_type = w.initializers[node.input[0]].data_type
    if data_type not in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        raise _refuse(node, f"a table of {onnx.TensorProto.DataType.Name(data_type)} is not supported (int4 and uint4 are)")
    axis = int(attrs.get("quantize_axis", 1)) % data.ndim
    # without zero points, uint4 codes are centred on 8 (onnxruntime's kernel)
    table = block_dequantized(data, scales, zero_points, axis, int(attrs.get("block_size", 128)),
                              8 if data_type == onnx.TensorProto.UINT4 else 0)
    w.op("Gather", [w.const(table, table.dtype), node.input[1]], [node.output[0]], axis=int(attrs.get("gather_axis", 0)))


def _activation(w: _Writer, node: onnx.NodeProto, x: str, kind: str, alpha: float | None = None, beta: float | None = None) -> None:
    """The activation onnxruntime fused into a Conv or Gemm (its `activation` attribute) on `x`,
    into the node's output."""
    if kind in ("Relu", "Tanh", "Sigmoid"):
        w.op(kind, [x], [node.output[0]])
    elif kind == "LeakyRelu":
        w.op(kind, [x], [node.output[0]], alpha=0.01 if alpha is None else alpha)
    elif kind == "HardSigmoid":
        w.op(kind, [x], [node.output[0]], alpha=0.2 if alpha is None else alpha, beta=0.5 if beta is None else beta)
    elif kind == "Clip" and alpha is not None and beta is not None:
        w.op(kind, [x, w.const(alpha), w.const(beta)], [node.output[0]])
    else:
        raise _refuse(node, f"the fused activation {kind!r} is not supported (Relu, Tanh, Sigmoid, LeakyRelu, HardSigmoid, Clip are)")


def _fused_conv(w: _Writer, node: onnx.NodeProto) -> None:
    """Conv (+ Z) + activation, as onnxruntime's optimizer saves a Conv it fused (FusedConv)."""
    attrs = _attrs(node)
    kind, params = attrs.pop("activation", ""), list(attrs.pop("activation_params", []))
    x, weight, bias, addend = (_input(node, i) for i in range(4))
    last = not kind and not addend
    result = w.op("Conv", [x, weight, *([bias] if bias else [])], [node.output[0]] if last else 1, **attrs)
    if addend:
        result = w.op("Add", [result, addend], [node.output[0]] if not kind else 1)
    if kind:
        _activation(w, node, result, kind, *(params + [None, None])[:2])


def _fused_gemm(w: _Writer, node: onnx.NodeProto) -> None:
    """Gemm + activation (FusedGemm)."""
    attrs = _attrs(node)
    kind = attrs.pop("activation", "")
    alpha, beta = attrs.pop("activation_alpha", None), attrs.pop("activation_beta", None)
    attrs.pop("activation_gamma", None)
    result = w.op("Gemm", [name for name in node.input if name], [node.output[0]] if not kind else 1, **attrs)
    if kind:
        _activation(w, node, result, kind, alpha, beta)


def _transposing(node: onnx.NodeProto) -> bool:
    """A FusedMatMul that transposes an operand: written once the operand's rank is inferred."""
    return node.domain == _MICROSOFT and node.op_type == "FusedMatMul" and any(_attrs(node).get(f) for f in ("transA", "transB"))


def _fused_matmul(w: _Writer, node: onnx.NodeProto, ranks: Mapping[str, int] | None = None) -> None:
    """alpha * op(A) op(B) (FusedMatMul: a MatMul with the transposes and the scale onnxruntime
    fused into it), where op swaps the last two axes (of the rank `ranks` gives the operand);
    transposes of the batch axes are refused."""
    attrs = _attrs(node)
    if attrs.get("transBatchA") or attrs.get("transBatchB"):
        raise _refuse(node, "transposed batch axes (transBatchA, transBatchB) are not supported")
    operands = []
    for name, flag in zip(node.input[:2], ("transA", "transB")):
        if not attrs.get(flag):
            operands.append(name)
            continue
        rank = (ranks or {}).get(name)
        if rank is None or rank < 2:
            raise _refuse(node, f"{flag} needs the rank of {name!r}, which shape inference does not give")
        operands.append(w.op("Transpose", [name], perm=[*range(rank - 2), rank - 1, rank - 2]))
    alpha = float(attrs.get("alpha", 1.0))
    product = w.op("MatMul", operands, [node.output[0]] if alpha == 1.0 else 1)
    if alpha != 1.0:
        w.op("Mul", [product, w.const(alpha)], [node.output[0]])


_WRITERS: dict[str, Callable[[_Writer, onnx.NodeProto], None]] = {
    "FusedConv": _fused_conv,
    "FusedGemm": _fused_gemm,
    "FusedMatMul": _fused_matmul,
    "MatMulNBits": _matmul_nbits,
    "GatherBlockQuantized": _gather_block_quantized,
    "MatMulBnb4": _matmul_bnb4,
    "SkipLayerNormalization": _skip_layer_norm,
    "SkipSimplifiedLayerNormalization": _skip_simplified_layer_norm,
    "SimplifiedLayerNormalization": _simplified_layer_norm,
    "EmbedLayerNormalization": _embed_layer_norm,
    "QEmbedLayerNormalization": _q_embed_layer_norm,
    "BiasGelu": _gelu(tanh=False, with_bias=True),
    "FastGelu": _gelu(tanh=True, with_bias=True),
    "Gelu": _gelu(tanh=False, with_bias=False),
    "QuickGelu": _quick_gelu,
}


def _is_standard_attention(node: onnx.NodeProto) -> bool:
    return node.domain in _STANDARD and node.op_type == "Attention"


def _is_contrib(node: onnx.NodeProto) -> bool:
    # onnxruntime registers SimplifiedLayerNormalization in the standard domain; ONNX's own
    # Attention (opset 23) is written here too, see _onnx_attention
    return (node.domain == _MICROSOFT and (node.op_type in _WRITERS or node.op_type in ("Attention", "QAttention"))) or \
        (node.domain in _STANDARD and node.op_type in ("SimplifiedLayerNormalization", "Attention"))


def _onnx_attention(w: _Writer, node: onnx.NodeProto, known: dict[str, onnx.TypeProto.Tensor]) -> bool:
    """ONNX's Attention (opset 23, as torch's exporter writes scaled_dot_product_attention) in
    the form its opset-18 exports take: softmax(Q K^T * scale + mask) V, a row masked whole
    giving 0 (its function body's rule; here through the softmax's NaN, so a NaN score gives 0
    too). The function body itself (casts, and a reduction over the mask to find rows masked
    whole) kept attention's products in separate dnnl regions. Written for 4D Q, K and V without
    a past state, soft-capping or extra outputs, where the head counts are known; False for any
    other form, which its function body then defines."""
    attrs = _attrs(node)
    q, k, v = node.input[:3]
    dims = [[d.dim_value if d.HasField("dim_value") else None for d in known[name].shape.dim] if name in known else []
            for name in (q, k, v)]
    other = {name: value for name, value in attrs.items() if name not in ("is_causal", "scale", "softmax_precision")}
    if len(node.input) > 4 and any(node.input[4:]) or any(node.output[1:]) or any(_ATTENTION_DEFAULTS.get(name, object()) != value
                                                                                  for name, value in other.items()) \
            or any(len(d) != 4 for d in dims) or any(known[name].elem_type != onnx.TensorProto.FLOAT for name in (q, k, v)):
        return False
    heads, kv_heads, head_size = dims[0][1], dims[1][1], dims[0][3]
    if not all(isinstance(n, int) for n in (heads, kv_heads, head_size)) or heads % kv_heads or dims[2][1] != kv_heads:
        return False
    if heads != kv_heads:  # grouped-query attention: each key and value head read by heads / kv_heads query heads
        k, v = (_repeat_heads(w, x, heads // kv_heads) for x in (k, v))
    scale = attrs.get("scale") or 1.0 / math.sqrt(head_size)
    scores = w.op("Mul", [w.op("MatMul", [q, w.op("Transpose", [k], perm=[0, 1, 3, 2])]), w.const(scale)])
    mask = _input(node, 3)
    if mask:
        if mask not in known:
            return False
        boolean = known[mask].elem_type == onnx.TensorProto.BOOL
        if not boolean and known[mask].elem_type != onnx.TensorProto.FLOAT:
            return False
        scores = w.op("Add", [scores, w.op("Where", [mask, w.const(0.0), w.const(-np.inf)]) if boolean else mask])
    if attrs.get("is_causal"):  # upper-left aligned
        scores = w.op("Add", [scores, w.causal_bias(w.sequence_range(q, 2), w.sequence_range(k, 2), -np.inf)])
    probabilities = w.op("Softmax", [scores], axis=-1)
    safe = w.op("Where", [w.op("IsNaN", [probabilities]), w.const(0.0), probabilities])
    w.op("MatMul", [safe, v], [node.output[0]])
    return True


# Attributes of ONNX's Attention this writer leaves at their defaults (soft-capping, the scores
# as an output, sliding windows of later opsets); head counts are given only for 3D inputs.
_ATTENTION_DEFAULTS = {"softcap": 0.0, "qk_matmul_output_mode": 0, "left_window_size": -1, "right_window_size": -1}


def _repeat_heads(w: _Writer, x: str, times: int) -> str:
    """(B, H, S, D) -> (B, H * times, S, D), each head repeated `times` times in a row."""
    shape = w.op("Shape", [x])
    spread = w.op("Concat", [w.op("Slice", [shape, w.const([0], np.int64), w.const([2], np.int64)]), w.const([times], np.int64),
                             w.op("Slice", [shape, w.const([2], np.int64), w.const([4], np.int64)])], axis=0)
    merged = w.op("Concat", [w.op("Slice", [shape, w.const([0], np.int64), w.const([1], np.int64)]), w.const([-1], np.int64),
                             w.op("Slice", [shape, w.const([2], np.int64), w.const([4], np.int64)])], axis=0)
    return w.op("Reshape", [w.op("Expand", [w.unsqueeze(x, [2]), spread]), merged])


def standard_form(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with onnxruntime's fused transformer ops written in standard ONNX; the model
    itself where it has none."""
    if not any(_is_contrib(n) for n in model.graph.node):
        return model
    w = _Writer(model)
    standard = [n for n in model.graph.node if _is_standard_attention(n)]
    light = _weights_as_inputs(model) if standard or any(n.op_type in ("Attention", "QAttention") or _transposing(n)
                                                         for n in model.graph.node) else model
    known = _inferred(light, {name for n in standard for name in n.input[:4]}) if standard else {}
    attention = set()
    for node in model.graph.node:
        if not _is_contrib(node):
            w.nodes.append(node)
        elif _is_standard_attention(node):
            w.base = node.name or node.output[0]
            if not _onnx_attention(w, node, known):
                w.nodes.append(node)  # a form not written here: its function body defines it
        elif node.op_type in ("Attention", "QAttention") or _transposing(node):
            w.base = node.name or node.output[0]
            node = node if node.op_type != "QAttention" else _dequantized_attention(w, node)
            attention.add(len(w.nodes))
            w.nodes.append(node)
        else:
            w.base = node.name or node.output[0]
            _WRITERS[node.op_type](w, node)
    # A mask's form, and the transposes of a FusedMatMul, depend on shapes, which onnx's
    # inference gives once the ops before them are written in standard ops.
    nodes, w.nodes = w.nodes, []
    shapes: dict[str, list] = {}
    for index, node in enumerate(nodes):
        if index not in attention:
            w.nodes.append(node)
            continue
        if node.op_type == "FusedMatMul":
            wanted = set(node.input[:2]) - shapes.keys()
            if wanted:
                shapes.update(_shapes(_with_nodes(light, w, nodes[index:]), wanted))
            w.base = node.name or node.output[0]
            _fused_matmul(w, node, {name: len(shapes[name]) for name in node.input[:2] if name in shapes})
            continue
        if _input(node, 3) and not {node.input[0], node.input[3]} <= shapes.keys():
            shapes.update(_shapes(_with_nodes(light, w, nodes[index:]), {node.input[0], node.input[3]}))
        w.base = node.name or node.output[0]
        _attention(w, node, shapes)
    return _with_nodes(model, w)


def _with_nodes(model: onnx.ModelProto, w: _Writer, rest: list[onnx.NodeProto] = ()) -> onnx.ModelProto:
    result = onnx.ModelProto()
    result.CopyFrom(model)
    del result.graph.node[:]
    result.graph.node.extend([*w.nodes, *rest])
    result.graph.initializer.extend(w.added)
    if not any(o.domain in _STANDARD for o in result.opset_import):
        result.opset_import.append(helper.make_opsetid("", _DEFAULT_OPSET))
    return result


_SMALL_CONSTANT = 64  # elements: shapes, axes and scalars, whose values shape inference reads


def _weights_as_inputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` for shape inference alone: its large initializers (weights, whose values shape
    inference never reads) declared as inputs of their type instead of copied, since each
    attention with a mask may infer the model again (a BERT-base has 440 MB of weights)."""
    declared = {value.name for value in model.graph.input}  # before IR version 4 weights are inputs too
    small = [init for init in model.graph.initializer if math.prod(init.dims) <= _SMALL_CONSTANT]
    large = [helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)) for init in model.graph.initializer
             if math.prod(init.dims) > _SMALL_CONSTANT and init.name not in declared]
    graph = helper.make_graph(model.graph.node, model.graph.name, [*model.graph.input, *large], model.graph.output, small,
                              value_info=model.graph.value_info)
    return helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)


def _inferred(model: onnx.ModelProto, wanted: set[str]) -> dict[str, onnx.TypeProto.Tensor]:
    """The tensor types of the values `wanted` that onnx's shape inference over the standard
    ops gives a shape."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # shapes stay unknown, and a node that needs one is refused with the reason
        inferred = model
    values = (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output)
    return {v.name: v.type.tensor_type for v in values if v.name in wanted and v.type.tensor_type.HasField("shape")}


def _shapes(model: onnx.ModelProto, wanted: set[str]) -> dict[str, list]:
    """The shapes (a size, a dimension's name or None each) of the values `wanted`."""
    return {name: [d.dim_value if d.HasField("dim_value") else d.dim_param or None for d in tensor.shape.dim]
            for name, tensor in _inferred(model, wanted).items()}
