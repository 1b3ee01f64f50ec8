"""An SSD-like single-shot detector: a depthwise-separable backbone, box and class heads on four
feature maps, anchor decoding, and NonMaxSuppression as post-processing that accelerators
cannot take."""

from __future__ import annotations

import itertools

import numpy as np
import onnx

from byoc.models.graph_builder import OnnxGraphBuilder

_ASPECT_RATIOS = (1.0, 2.0, 0.5, 3.0, 1.0 / 3.0, 1.0)
_VARIANCES = (0.1, 0.2)


def _separable(g: OnnxGraphBuilder, x: str, cin: int, cout: int, stride: int) -> str:
    with g.scope("depthwise"):
        x = g.conv_bn(x, cin, cin, 3, stride, groups=cin)
    with g.scope("pointwise"):
        return g.conv_bn(x, cin, cout, 1)


def _anchors(sizes: list[int]) -> np.ndarray:
    """Anchor boxes (cx, cy, w, h), normalised, in the order the heads flatten them."""
    scales = np.linspace(0.2, 0.9, len(sizes) + 1)
    boxes = []
    for index, size in enumerate(sizes):
        for row, col in itertools.product(range(size), range(size)):
            cx, cy = (col + 0.5) / size, (row + 0.5) / size
            for ratio_index, ratio in enumerate(_ASPECT_RATIOS):
                scale = scales[index] if ratio_index < len(_ASPECT_RATIOS) - 1 else np.sqrt(scales[index] * scales[index + 1])
                boxes.append((cx, cy, scale * np.sqrt(ratio), scale / np.sqrt(ratio)))
    return np.array(boxes, dtype=np.float32)


def _out_size(size: int, stride: int) -> int:
    return (size + 2 - 3) // stride + 1


def ssd_detector(
    image_size: int = 300,
    num_classes: int = 21,
    max_boxes_per_class: int = 20,
    score_threshold: float = 0.08,
    batch: int = 1,
    seed: int = 0,
) -> onnx.ModelProto:
    g = OnnxGraphBuilder("ssd_detector", seed)
    x = g.input("input", [batch, 3, image_size, image_size])
    anchors_per_cell = len(_ASPECT_RATIOS)
    with g.scope("backbone"):
        x = g.conv_bn(x, 3, 32, 3, 2)
        size = _out_size(image_size, 2)
        channels = 32
        for index, (cout, stride) in enumerate([(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1)]):
            with g.scope(f"block{index}"):
                x = _separable(g, x, channels, cout, stride)
            channels, size = cout, _out_size(size, stride)
    features = [(x, channels, size)]
    with g.scope("extras"):
        for index, (mid, cout) in enumerate([(512, 1024), (256, 512), (128, 256)]):
            with g.scope(f"extra{index}"):
                y = g.conv_bn(x, channels, mid, 1)
                x = g.conv_bn(y, mid, cout, 3, 2)
            channels, size = cout, _out_size(size, 2)
            features.append((x, channels, size))

    locations, confidences = [], []
    for index, (feature, cin, _) in enumerate(features):
        with g.scope(f"head{index}"):
            for kind, per_anchor, collected in (("loc", 4, locations), ("conf", num_classes, confidences)):
                with g.scope(kind):
                    y = g.conv(feature, cin, anchors_per_cell * per_anchor, 3)
                    y = g.op("Transpose", [y], perm=[0, 2, 3, 1])
                    collected.append(g.op("Reshape", [y, g.shape_constant("shape", [batch, -1, per_anchor])]))

    anchors = _anchors([size for _, _, size in features])
    with g.scope("postprocess"):
        loc = g.op("Concat", locations, axis=1)
        conf = g.op("Concat", confidences, axis=1)
        dx, dy, dw, dh = g.op("Split", [loc], num_outputs=4, axis=2)
        acx, acy, aw, ah = (g.constant(name, anchors[None, :, i : i + 1]) for i, name in enumerate(("acx", "acy", "aw", "ah")))
        center_var = g.constant("center_variance", np.array(_VARIANCES[0], dtype=np.float32))
        size_var = g.constant("size_variance", np.array(_VARIANCES[1], dtype=np.float32))
        half = g.constant("half", np.array(0.5, dtype=np.float32))
        cx = g.op("Add", [g.op("Mul", [g.op("Mul", [dx, center_var]), aw]), acx])
        cy = g.op("Add", [g.op("Mul", [g.op("Mul", [dy, center_var]), ah]), acy])
        half_w = g.op("Mul", [g.op("Mul", [g.op("Exp", [g.op("Mul", [dw, size_var])]), aw]), half])
        half_h = g.op("Mul", [g.op("Mul", [g.op("Exp", [g.op("Mul", [dh, size_var])]), ah]), half])
        corners = [g.op("Sub", [cy, half_h]), g.op("Sub", [cx, half_w]), g.op("Add", [cy, half_h]), g.op("Add", [cx, half_w])]
        boxes = g.op("Concat", corners, axis=2)
        scores = g.op("Transpose", [g.op("Softmax", [conf], axis=-1)], perm=[0, 2, 1])
        selected = g.op(
            "NonMaxSuppression",
            [
                boxes,
                scores,
                g.constant("max_boxes", np.array([max_boxes_per_class], dtype=np.int64)),
                g.constant("iou_threshold", np.array([0.45], dtype=np.float32)),
                g.constant("score_threshold", np.array([score_threshold], dtype=np.float32)),
            ],
        )
    g.output(boxes)
    g.output(scores)
    g.output(selected, dtype="int64", shape=[None, 3])
    return g.build()
