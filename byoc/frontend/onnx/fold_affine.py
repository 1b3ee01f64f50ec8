"""Per-channel affine ops folded into the convolution before them, on the ONNX graph, before import.

A BatchNormalization with constant statistics after a Conv, and the per-channel scale and shift
that Caffe2 exports write as Mul and Add of constants after it (Inception v2's `bn/sc_w`,
`bn/sc_b`), become the Conv's weights and bias. Left in place, each costs a host op between two
accelerator regions: light Inception v2 went to the DPU as 45 regions, every boundary a
requantisation, and lost top-1 agreement.

TVM has FoldBatchnormToConv2D, but the FoldConstant run it needs afterwards compiles and runs a
kernel for every folded expression: 6.8 s for a small ResNet-18 on this machine, against a few
milliseconds for the same arithmetic in numpy here. Folding before import also keeps the Conv
node's name on the result.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping

import numpy as np
import onnx
from onnx import numpy_helper


def _per_channel(array: np.ndarray, rank: int, channels: int) -> np.ndarray | None:
    """`array` as one value per output channel of a rank-`rank` Conv result (N, C, ...), or None
    when broadcasting it would mix batch or spatial positions."""
    if array.ndim > rank:
        return None
    shape = (1,) * (rank - array.ndim) + array.shape
    if shape[0] != 1 or shape[1] not in (1, channels) or any(d != 1 for d in shape[2:]):
        return None
    return np.broadcast_to(array.reshape(shape[1]), (channels,))


class _Conv:
    """A Conv with constant weights whose result may absorb the affine op that reads it."""

    def __init__(self, node: onnx.NodeProto, weight: np.ndarray, bias: np.ndarray | None) -> None:
        self.node, self.weight = node, weight
        self.bias = bias if bias is not None else np.zeros(weight.shape[0], weight.dtype)
        self.changed = False

    def scale(self, factor: np.ndarray) -> None:
        self.weight = self.weight * factor.reshape((-1,) + (1,) * (self.weight.ndim - 1))
        self.bias = self.bias * factor
        self.changed = True

    def shift(self, offset: np.ndarray) -> None:
        self.bias = self.bias + offset
        self.changed = True


def batch_norm_affine(node: onnx.NodeProto, constants: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A BatchNormalization of constant statistics as (mean, factor, beta): it computes
    (x - mean) * factor + beta."""
    epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
    gamma, beta, mean, var = (constants[name] for name in node.input[1:])
    return mean, gamma / np.sqrt(var + epsilon), beta


def _absorb(conv: _Conv, node: onnx.NodeProto, constants: Mapping[str, np.ndarray]) -> bool:
    """Fold `node`, which reads `conv`'s result, into the Conv; False when it does not fold."""
    result, channels, rank = conv.node.output[0], conv.weight.shape[0], conv.weight.ndim
    if node.op_type == "BatchNormalization":
        if len(node.input) != 5 or len(node.output) != 1 or node.input[0] != result:
            return False
        if not all(name in constants for name in node.input[1:]):
            return False
        mean, factor, beta = batch_norm_affine(node, constants)
        conv.shift(-mean)
        conv.scale(factor)
        conv.shift(beta)
        return True
    if node.op_type not in ("Mul", "Add", "Sub") or len(node.input) != 2:
        return False
    other = node.input[1] if node.input[0] == result else node.input[0]
    if other == result or other not in constants or (node.op_type == "Sub" and node.input[0] != result):
        return False
    value = _per_channel(constants[other], rank, channels)
    if value is None or np.result_type(value, conv.weight) != conv.weight.dtype:
        return False
    {"Mul": conv.scale, "Add": conv.shift, "Sub": lambda v: conv.shift(-v)}[node.op_type](value)
    return True


class Initializers(Mapping):
    """The initializers by name, each read into numpy when first asked for: the fold reads those
    of convolutions and what follows them, not a transformer's embeddings."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self._protos = {init.name: init for init in graph.initializer}
        self._arrays: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._arrays:
            self._arrays[name] = numpy_helper.to_array(self._protos[name])
        return self._arrays[name]

    def __contains__(self, name: object) -> bool:
        return name in self._protos

    def __iter__(self) -> Iterator[str]:
        return iter(self._protos)

    def __len__(self) -> int:
        return len(self._protos)


def fold_batch_norms(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` where each BatchNormalization, and each Mul, Add or Sub by a per-channel
    constant, that reads a Conv with constant weights as that Conv's only consumer is folded
    into the Conv's weights and bias (repeatedly: Conv, BN, Mul, Add becomes one Conv); `model`
    itself where it has no Conv."""
    if not any(node.op_type == "Conv" for node in model.graph.node):
        return model
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    graph = folded.graph
    # Nodes by position: protobuf hands out a new wrapper object for a message whose last wrapper
    # was collected, so id() of a node is not a stable key.
    nodes = list(graph.node)
    constants = Initializers(graph)
    producers = {out: index for index, node in enumerate(nodes) for out in node.output}
    consumers = Counter(name for node in nodes for name in node.input)
    graph_outputs = {out.name for out in graph.output}

    convs: dict[int, _Conv] = {}
    removed: set[int] = set()
    for index, node in enumerate(nodes):
        if not node.input or len(node.output) != 1:
            continue
        reads = [producers[name] for name in node.input[:2] if name in producers]
        source = next((i for i in reads if nodes[i].op_type == "Conv"), None)
        if source is None or source in removed:
            continue
        conv_node = nodes[source]
        result = conv_node.output[0]
        if consumers[result] != 1 or result in graph_outputs or not all(n in constants for n in conv_node.input[1:]):
            continue
        conv = convs.get(source)
        if conv is None:
            bias = constants[conv_node.input[2]] if len(conv_node.input) > 2 else None
            conv = convs[source] = _Conv(conv_node, constants[conv_node.input[1]], bias)
        if _absorb(conv, node, constants):
            conv_node.output[0] = node.output[0]
            producers[node.output[0]] = source
            removed.add(index)

    for conv in convs.values():
        if not conv.changed:
            continue
        stem = conv.node.name or conv.node.output[0]
        weight_name, bias_name = f"{stem}/folded_weight", f"{stem}/folded_bias"
        dtype = constants[conv.node.input[1]].dtype
        graph.initializer.extend([numpy_helper.from_array(conv.weight.astype(dtype), weight_name),
                                  numpy_helper.from_array(conv.bias.astype(dtype), bias_name)])
        del conv.node.input[1:]
        conv.node.input.extend([weight_name, bias_name])

    replace_nodes(graph, nodes, removed)
    return folded


def replace_nodes(graph: onnx.GraphProto, nodes: list[onnx.NodeProto], removed: set[int],
                  after: Mapping[int, onnx.NodeProto] | None = None) -> None:
    """`graph`'s nodes made `nodes` (copies: they may be the graph's own) but those at the
    positions `removed`, each of `after` right after the node at its position, and the
    initializers no node or output reads dropped."""
    after = after or {}
    kept = []
    for index, node in enumerate(nodes):
        if index in removed:
            continue
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        kept.append(copy)
        if index in after:
            kept.append(after[index])
    del graph.node[:]
    graph.node.extend(kept)
    used = {name for node in graph.node for name in node.input} | {out.name for out in graph.output}
    for init in [init for init in graph.initializer if init.name not in used]:
        graph.initializer.remove(init)
