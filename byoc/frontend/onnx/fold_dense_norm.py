"""A BatchNormalization after a dense layer, through the flatten between them, folded into the
layer's weights and a bias, on the ONNX graph, before import.

LeViT's `LinearNorm` (and other "Linear then BatchNorm1d" blocks) exports as MatMul, a Reshape to
(rows, channels), BatchNormalization, and a Reshape back. Left in place, each norm was a multiply
and an add of its own: 295 binary primitives in LeViT-128S's one dnnl region, a quarter of its
run. With constant statistics the norm is a per-channel scale and shift of the product's columns:
the weights are scaled, and an Add of the shift after the MatMul makes the dense layer with bias
that every vendor takes whole.
"""

from __future__ import annotations

from collections import Counter

import onnx
from onnx import numpy_helper

from byoc.frontend.onnx.fold_affine import Initializers, batch_norm_affine, replace_nodes


def _foldable(bn: onnx.NodeProto, nodes: list[onnx.NodeProto], producers: dict[str, int], consumers: Counter,
              outputs: set[str], constants: Initializers) -> tuple[int, int] | None:
    """The positions of the MatMul and the Reshape that `bn` reads, where the fold holds: the
    norm's input is the product reshaped to (rows, channels) (so its channel axis is the
    product's last), each read by the next alone, and weights and statistics constant."""
    if bn.op_type != "BatchNormalization" or len(bn.input) != 5 or len(bn.output) != 1:
        return None
    reshape_at = producers.get(bn.input[0])
    if reshape_at is None or nodes[reshape_at].op_type != "Reshape":
        return None
    reshape = nodes[reshape_at]
    matmul_at = producers.get(reshape.input[0])
    if matmul_at is None or nodes[matmul_at].op_type != "MatMul" or len(reshape.input) != 2:
        return None
    matmul = nodes[matmul_at]
    if any(consumers[name] != 1 or name in outputs for name in (matmul.output[0], reshape.output[0])):
        return None
    if not all(name in constants for name in (matmul.input[1], reshape.input[1], *bn.input[1:])):
        return None
    weight, shape = constants[matmul.input[1]], constants[reshape.input[1]]
    if weight.ndim != 2 or weight.dtype.kind != "f" or shape.ndim != 1 or len(shape) != 2 or int(shape[-1]) != weight.shape[1]:
        return None
    return matmul_at, reshape_at


def fold_batch_norms_after_dense(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with each such norm folded (see above); `model` itself where none is."""
    if not any(node.op_type == "BatchNormalization" for node in model.graph.node):
        return model
    nodes = list(model.graph.node)
    constants = Initializers(model.graph)
    producers = {out: index for index, node in enumerate(nodes) for out in node.output}
    consumers = Counter(name for node in nodes for name in node.input)
    outputs = {out.name for out in model.graph.output}
    folds = {}  # BatchNormalization position -> (MatMul position, Reshape position)
    for index, node in enumerate(nodes):
        found = _foldable(node, nodes, producers, consumers, outputs, constants)
        if found is not None:
            folds[index] = found
    if not folds:
        return model
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    nodes = list(folded.graph.node)
    biases: dict[int, onnx.NodeProto] = {}  # MatMul position -> the Add of its bias
    for bn_at, (matmul_at, reshape_at) in folds.items():
        bn, matmul, reshape = nodes[bn_at], nodes[matmul_at], nodes[reshape_at]
        weight = constants[matmul.input[1]]
        mean, factor, beta = batch_norm_affine(bn, constants)
        stem = matmul.name or matmul.output[0]
        weight_name, bias_name, product = f"{stem}/folded_weight", f"{stem}/folded_bias", f"{stem}/unshifted"
        folded.graph.initializer.extend([
            numpy_helper.from_array((weight * factor).astype(weight.dtype), weight_name),
            numpy_helper.from_array((beta - mean * factor).astype(weight.dtype), bias_name)])
        result = matmul.output[0]
        matmul.input[1] = weight_name
        matmul.output[0] = product
        biases[matmul_at] = onnx.helper.make_node("Add", [product, bias_name], [result], name=f"{stem}/folded_norm")
        reshape.output[0] = bn.output[0]  # the norm's readers read the reshaped, shifted product
    replace_nodes(folded.graph, nodes, set(folds), biases)
    return folded
