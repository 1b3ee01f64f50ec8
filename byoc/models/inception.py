"""Inception-v3 with the block structure and channel counts of the published network."""

from __future__ import annotations

import onnx

from byoc.models.graph_builder import OnnxGraphBuilder


def _concat(g: OnnxGraphBuilder, branches: list[str]) -> str:
    return g.op("Concat", branches, axis=1)


def _inception_a(g: OnnxGraphBuilder, x: str, cin: int, pool_features: int) -> tuple[str, int]:
    with g.scope("branch1x1"):
        b1 = g.conv_bn(x, cin, 64, 1)
    with g.scope("branch5x5"):
        b5 = g.conv_bn(g.conv_bn(x, cin, 48, 1), 48, 64, 5)
    with g.scope("branch3x3dbl"):
        b3 = g.conv_bn(x, cin, 64, 1)
        b3 = g.conv_bn(g.conv_bn(b3, 64, 96, 3), 96, 96, 3)
    with g.scope("branch_pool"):
        bp = g.conv_bn(g.avg_pool(x, 3, 1, 1), cin, pool_features, 1)
    return _concat(g, [b1, b5, b3, bp]), 64 + 64 + 96 + pool_features


def _inception_b(g: OnnxGraphBuilder, x: str, cin: int) -> tuple[str, int]:
    with g.scope("branch3x3"):
        b3 = g.conv_bn(x, cin, 384, 3, 2, 0)
    with g.scope("branch3x3dbl"):
        bd = g.conv_bn(g.conv_bn(x, cin, 64, 1), 64, 96, 3)
        bd = g.conv_bn(bd, 96, 96, 3, 2, 0)
    with g.scope("branch_pool"):
        bp = g.max_pool(x, 3, 2)
    return _concat(g, [b3, bd, bp]), 384 + 96 + cin


def _inception_c(g: OnnxGraphBuilder, x: str, cin: int, c7: int) -> tuple[str, int]:
    with g.scope("branch1x1"):
        b1 = g.conv_bn(x, cin, 192, 1)
    with g.scope("branch7x7"):
        b7 = g.conv_bn(x, cin, c7, 1)
        b7 = g.conv_bn(b7, c7, c7, (1, 7))
        b7 = g.conv_bn(b7, c7, 192, (7, 1))
    with g.scope("branch7x7dbl"):
        bd = g.conv_bn(x, cin, c7, 1)
        bd = g.conv_bn(bd, c7, c7, (7, 1))
        bd = g.conv_bn(bd, c7, c7, (1, 7))
        bd = g.conv_bn(bd, c7, c7, (7, 1))
        bd = g.conv_bn(bd, c7, 192, (1, 7))
    with g.scope("branch_pool"):
        bp = g.conv_bn(g.avg_pool(x, 3, 1, 1), cin, 192, 1)
    return _concat(g, [b1, b7, bd, bp]), 768


def _inception_d(g: OnnxGraphBuilder, x: str, cin: int) -> tuple[str, int]:
    with g.scope("branch3x3"):
        b3 = g.conv_bn(g.conv_bn(x, cin, 192, 1), 192, 320, 3, 2, 0)
    with g.scope("branch7x7x3"):
        b7 = g.conv_bn(x, cin, 192, 1)
        b7 = g.conv_bn(b7, 192, 192, (1, 7))
        b7 = g.conv_bn(b7, 192, 192, (7, 1))
        b7 = g.conv_bn(b7, 192, 192, 3, 2, 0)
    with g.scope("branch_pool"):
        bp = g.max_pool(x, 3, 2)
    return _concat(g, [b3, b7, bp]), 320 + 192 + cin


def _inception_e(g: OnnxGraphBuilder, x: str, cin: int) -> tuple[str, int]:
    with g.scope("branch1x1"):
        b1 = g.conv_bn(x, cin, 320, 1)
    with g.scope("branch3x3"):
        b3 = g.conv_bn(x, cin, 384, 1)
        b3 = _concat(g, [g.conv_bn(b3, 384, 384, (1, 3)), g.conv_bn(b3, 384, 384, (3, 1))])
    with g.scope("branch3x3dbl"):
        bd = g.conv_bn(g.conv_bn(x, cin, 448, 1), 448, 384, 3)
        bd = _concat(g, [g.conv_bn(bd, 384, 384, (1, 3)), g.conv_bn(bd, 384, 384, (3, 1))])
    with g.scope("branch_pool"):
        bp = g.conv_bn(g.avg_pool(x, 3, 1, 1), cin, 192, 1)
    return _concat(g, [b1, b3, bd, bp]), 2048


def inception_v3(image_size: int = 299, num_classes: int = 1000, batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    g = OnnxGraphBuilder("inception_v3", seed)
    x = g.input("input", [batch, 3, image_size, image_size])
    with g.scope("stem"):
        x = g.conv_bn(x, 3, 32, 3, 2, 0)
        x = g.conv_bn(x, 32, 32, 3, 1, 0)
        x = g.conv_bn(x, 32, 64, 3, 1, 1)
        x = g.max_pool(x, 3, 2)
        x = g.conv_bn(x, 64, 80, 1)
        x = g.conv_bn(x, 80, 192, 3, 1, 0)
        x = g.max_pool(x, 3, 2)
    channels = 192
    stages = [
        ("mixed_5b", _inception_a, {"pool_features": 32}),
        ("mixed_5c", _inception_a, {"pool_features": 64}),
        ("mixed_5d", _inception_a, {"pool_features": 64}),
        ("mixed_6a", _inception_b, {}),
        ("mixed_6b", _inception_c, {"c7": 128}),
        ("mixed_6c", _inception_c, {"c7": 160}),
        ("mixed_6d", _inception_c, {"c7": 160}),
        ("mixed_6e", _inception_c, {"c7": 192}),
        ("mixed_7a", _inception_d, {}),
        ("mixed_7b", _inception_e, {}),
        ("mixed_7c", _inception_e, {}),
    ]
    for name, block, kwargs in stages:
        with g.scope(name):
            x, channels = block(g, x, channels, **kwargs)
    g.output(g.classifier_head(x, channels, num_classes))
    return g.build()
