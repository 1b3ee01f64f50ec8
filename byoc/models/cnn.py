"""Image classifiers: ResNet-18/50, MobileNetV2 and VGG-19 with their published layer shapes."""

from __future__ import annotations

import onnx

from byoc.models.graph_builder import OnnxGraphBuilder

# Scale of the last batch norm in each residual block: keeps the residual sum from doubling
# the activation variance at every block of a randomly initialised network.
_RESIDUAL_GAMMA = 0.3


def _basic_block(g: OnnxGraphBuilder, x: str, cin: int, cout: int, stride: int) -> tuple[str, int]:
    y = g.conv_bn(x, cin, cout, 3, stride)
    y = g.conv_bn(y, cout, cout, 3, 1, act=None, gamma_scale=_RESIDUAL_GAMMA)
    shortcut = x
    if stride != 1 or cin != cout:
        with g.scope("downsample"):
            shortcut = g.conv_bn(x, cin, cout, 1, stride, act=None)
    return g.relu(g.op("Add", [y, shortcut])), cout


def _bottleneck(g: OnnxGraphBuilder, x: str, cin: int, width: int, stride: int) -> tuple[str, int]:
    cout = width * 4
    y = g.conv_bn(x, cin, width, 1)
    y = g.conv_bn(y, width, width, 3, stride)
    y = g.conv_bn(y, width, cout, 1, act=None, gamma_scale=_RESIDUAL_GAMMA)
    shortcut = x
    if stride != 1 or cin != cout:
        with g.scope("downsample"):
            shortcut = g.conv_bn(x, cin, cout, 1, stride, act=None)
    return g.relu(g.op("Add", [y, shortcut])), cout


def _resnet(name: str, blocks: list[int], bottleneck: bool, image_size: int, num_classes: int, batch: int, seed: int) -> onnx.ModelProto:
    g = OnnxGraphBuilder(name, seed)
    x = g.input("input", [batch, 3, image_size, image_size])
    with g.scope("stem"):
        x = g.conv_bn(x, 3, 64, 7, 2, 3)
        x = g.max_pool(x, 3, 2, 1)
    channels = 64
    block = _bottleneck if bottleneck else _basic_block
    for stage, count in enumerate(blocks):
        width = 64 * 2**stage
        for index in range(count):
            stride = 2 if stage > 0 and index == 0 else 1
            with g.scope(f"layer{stage + 1}"), g.scope(f"block{index}"):
                x, channels = block(g, x, channels, width, stride)
    g.output(g.classifier_head(x, channels, num_classes))
    return g.build()


def resnet18(image_size: int = 224, num_classes: int = 1000, batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    return _resnet("resnet18", [2, 2, 2, 2], False, image_size, num_classes, batch, seed)


def resnet50(image_size: int = 224, num_classes: int = 1000, batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    return _resnet("resnet50", [3, 4, 6, 3], True, image_size, num_classes, batch, seed)


# (expansion t, output channels c, repeats n, first stride s), from the MobileNetV2 paper.
_MOBILENET_V2_SETTINGS = [
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
]


def mobilenet_v2(image_size: int = 224, num_classes: int = 1000, batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    g = OnnxGraphBuilder("mobilenet_v2", seed)
    x = g.input("input", [batch, 3, image_size, image_size])
    with g.scope("stem"):
        x = g.conv_bn(x, 3, 32, 3, 2, act="relu6")
    channels = 32
    block_id = 0
    for expansion, cout, repeats, first_stride in _MOBILENET_V2_SETTINGS:
        for index in range(repeats):
            stride = first_stride if index == 0 else 1
            hidden = channels * expansion
            with g.scope(f"block{block_id}"):
                y = x
                if expansion != 1:
                    with g.scope("expand"):
                        y = g.conv_bn(y, channels, hidden, 1, act="relu6")
                with g.scope("depthwise"):
                    y = g.conv_bn(y, hidden, hidden, 3, stride, groups=hidden, act="relu6")
                with g.scope("project"):
                    y = g.conv_bn(y, hidden, cout, 1, act=None, gamma_scale=_RESIDUAL_GAMMA)
                if stride == 1 and channels == cout:
                    y = g.op("Add", [x, y])
            x, channels = y, cout
            block_id += 1
    with g.scope("last"):
        x = g.conv_bn(x, channels, 1280, 1, act="relu6")
    g.output(g.classifier_head(x, 1280, num_classes))
    return g.build()


_VGG19_LAYOUT = [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M", 512, 512, 512, 512, "M"]


def vgg19(image_size: int = 224, num_classes: int = 1000, batch: int = 1, seed: int = 0) -> onnx.ModelProto:
    g = OnnxGraphBuilder("vgg19", seed)
    x = g.input("input", [batch, 3, image_size, image_size])
    channels, size, block = 3, image_size, 1
    for item in _VGG19_LAYOUT:
        with g.scope(f"features{block}"):
            if item == "M":
                x = g.max_pool(x, 2, 2)
                size //= 2
                block += 1
            else:
                x = g.relu(g.conv(x, channels, item, 3))
                channels = item
    with g.scope("classifier"):
        x = g.op("Flatten", [x], axis=1)
        x = g.relu(g.gemm(x, channels * size * size, 4096))
        x = g.relu(g.gemm(x, 4096, 4096))
        x = g.gemm(x, 4096, num_classes)
    g.output(x)
    return g.build()
