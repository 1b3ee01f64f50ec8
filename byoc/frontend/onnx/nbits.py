"""Weights quantized in blocks or in fewer than 8 bits, as float weights.

Files quantized for small memory (`MatMulNBitsQuantizer`, the `model_q4.onnx` of exported model
repositories) store each dense layer's weights as 2-, 4- or 8-bit codes in blocks along K, each
block with its scale and zero point: as onnxruntime's com.microsoft MatMulNBits (or MatMulBnb4,
bitsandbytes' FP4 and NF4 codes scaled per block), or, in QDQ form, as an int4/uint4 initializer read by a DequantizeLinear with a `block_size` (opset 21).
onnxruntime's CPU kernel dequantizes them and multiplies in float (or, at accuracy level 4, in
int8 with the activations quantized per block). byoc's vendors have no such kernel, and TVM
neither reads int4 tensors nor dequantizes by block, so the weights are dequantized here, once,
as the kernel does, and the product is a MatMul on float weights: the numbers of onnxruntime's
float path, at float weights' size in memory.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from byoc.frontend.onnx.graph_inputs import subgraph_reads

# Integer types TVM cannot hold: a DequantizeLinear of such a constant is folded before import.
_SUB_BYTE = frozenset({onnx.TensorProto.INT4, onnx.TensorProto.UINT4, onnx.TensorProto.INT2, onnx.TensorProto.UINT2})


def unpacked(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first `count` codes of each row of `packed` (uint8), `bits` each, low bits first."""
    per_byte = 8 // bits
    shifts = (np.arange(per_byte, dtype=np.uint8) * bits).astype(np.uint8)
    codes = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(packed.shape[0], -1)[:, :count]


def dequantized_weight(packed: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, groups: np.ndarray | None,
                       k: int, n: int, bits: int, block_size: int) -> np.ndarray:
    """The [K, N] weights of a MatMulNBits, in the scales' dtype: code minus zero point (by
    default 2^(bits-1)), times scale, per block of `block_size` along K (or per the group
    `groups` gives each row of K). Zero points are packed codes (uint8) or numbers of the
    scales' dtype."""
    blocks = math.ceil(k / block_size)
    codes = unpacked(packed.reshape(n, -1), bits, k).astype(np.float32)
    scale = scales.reshape(n, blocks).astype(np.float32)
    if zero_points is None:
        zero = np.full((n, blocks), 2 ** (bits - 1), np.float32)
    elif zero_points.dtype == np.uint8:
        zero = unpacked(zero_points.reshape(n, -1), bits, blocks).astype(np.float32)
    else:
        zero = zero_points.reshape(n, blocks).astype(np.float32)
    group = np.arange(k) // block_size if groups is None else groups.astype(np.int64).reshape(k)
    weight = (codes - zero[:, group]) * scale[:, group]
    return np.ascontiguousarray(weight.T).astype(scales.dtype)


# The 4-bit codes of bitsandbytes (com.microsoft MatMulBnb4's quant_type 0 and 1), as onnxruntime's
# kernel reads them: each a fraction of its block's absolute maximum.
BNB4_CODES = {
    0: np.array([0.0, 5.208333333e-03, 0.66666667, 1.0, 0.33333333, 0.5, 0.16666667, 0.25,  # FP4
                 -0.0, -5.208333333e-03, -0.66666667, -1.0, -0.33333333, -0.5, -0.16666667, -0.25], np.float32),
    1: np.array([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,  # NF4
                 -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                 0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                 0.7229568362236023, 1.0], np.float32),
}


def bnb4_weight(packed: np.ndarray, absmax: np.ndarray, k: int, n: int, block_size: int, quant_type: int) -> np.ndarray:
    """The [K, N] weights of a MatMulBnb4, in absmax's dtype: the weights as [N, K], flattened,
    two codes a byte (high bits first), each block of `block_size` codes scaled by its
    absolute maximum."""
    codes = np.stack([packed.reshape(-1) >> 4, packed.reshape(-1) & 15], axis=-1).reshape(-1)[:n * k]
    values = BNB4_CODES[quant_type][codes] * np.repeat(absmax.reshape(-1).astype(np.float32), block_size)[:n * k]
    return np.ascontiguousarray(values.reshape(n, k).T).astype(absmax.dtype)


def block_dequantized(data: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, axis: int, block_size: int,
                      default_zero: int) -> np.ndarray:
    """(data - zero point) * scale, in the scales' dtype, each block of `block_size` elements along
    `axis` with its own scale and zero point (`default_zero` where none are given)."""
    count = data.shape[axis]
    spread = lambda values: np.repeat(values.astype(np.float32), block_size, axis=axis).take(range(count), axis=axis)  # noqa: E731
    zero = spread(zero_points) if zero_points is not None else np.float32(default_zero)
    return ((data.astype(np.float32) - zero) * spread(scales)).astype(scales.dtype)


def _block_size(node: onnx.NodeProto) -> int:
    return next((int(helper.get_attribute_value(a)) for a in node.attribute if a.name == "block_size"), 0)


def dequantized_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` with each DequantizeLinear of constants that TVM cannot read (sub-byte codes, or
    scales per block) replaced by its float result, computed by onnx's reference evaluator, and
    the sub-byte constants no node reads any more dropped (TVM would read them); `model` itself
    where it has none."""
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    folded = [node for node in graph.node if node.op_type == "DequantizeLinear" and node.domain in ("", "ai.onnx")
              and all(name in initializers for name in node.input if name)
              and (initializers[node.input[0]].data_type in _SUB_BYTE or _block_size(node) > 0)]
    if not folded and not any(init.data_type in _SUB_BYTE for init in graph.initializer):
        return model
    done = {id(node) for node in folded}
    kept_nodes = [node for node in graph.node if id(node) not in done]
    read = {name for node in kept_nodes for name in (*node.input, *subgraph_reads(node))} | {value.name for value in graph.output}
    unread = {name for node in folded for name in node.input if name and name not in read}
    unread |= {init.name for init in graph.initializer if init.data_type in _SUB_BYTE and init.name not in read}
    if not folded and not unread:
        return model
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    values = []
    for node in folded:
        operands = [initializers[name] for name in node.input if name]
        single = helper.make_model(helper.make_graph([node], "dequantize", [], [helper.make_tensor_value_info(node.output[0], 0, None)],
                                                     operands), opset_imports=[helper.make_opsetid("", opset)])
        values.append(numpy_helper.from_array(np.asarray(ReferenceEvaluator(single).run(None, {})[0]), node.output[0]))
    result = onnx.ModelProto()
    result.CopyFrom(model)
    del result.graph.node[:]
    result.graph.node.extend(kept_nodes)
    kept = [init for init in graph.initializer if init.name not in unread] + values
    del result.graph.initializer[:]
    result.graph.initializer.extend(kept)
    return result
