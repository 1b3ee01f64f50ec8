"""A small multi-layer perceptron: the quickest model to partition, build and run."""

from __future__ import annotations

import onnx

from byoc.models.graph_builder import OnnxGraphBuilder


def mlp(
    features: int = 256, hidden: tuple[int, ...] = (512, 512, 256), num_classes: int = 10, batch: int = 1, seed: int = 0
) -> onnx.ModelProto:
    g = OnnxGraphBuilder("mlp", seed)
    x = g.input("input", [batch, features])
    width = features
    for index, units in enumerate(hidden):
        with g.scope(f"fc{index}"):
            x = g.relu(g.gemm(x, width, units))
        width = units
    with g.scope("classifier"):
        x = g.op("Softmax", [g.gemm(x, width, num_classes)], axis=-1)
    g.output(x)
    return g.build()
