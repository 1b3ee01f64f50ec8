"""Vision models as users bring them: torchvision's classifiers, segmenters and detectors and timm's
families, built from their configs with seeded random weights (nothing is downloaded), exported
as their users export them and cached by content (the exported suite's cache directory).

- Classifiers and segmenters: `torch.onnx.export(..., dynamo=True)` at batch 1.
- Ultralytics' YOLOv8n, YOLO11n and YOLOv8n-seg: its own exporter (`YOLO(config).export(format=
  "onnx")`), offline, from the configs the package ships.
- Detectors, whose box count depends on the image: `torch.onnx.export(..., dynamo=False,
  opset_version=17)` (the dynamo exporter and torch.export refuse them), with a low score
  threshold (random weights reach no class at the default 0.05).

`byoc matrix --models vision:NAME ...` (or `vision` for the whole suite) and the vendor kit
(`model_case("vision:NAME")`) take them by name; `benchmarks/vision.py` and
`benchmarks/detectors.py` time them.

Needs the torch extra and torchvision 0.28.0, the release paired with torch 2.13, installed
without its dependencies (`make vision` does both), timm for timm's families and Ultralytics for
its models:
    pip install -e '.[torch]' && pip install --no-deps torchvision==0.28.0 pillow timm==1.0.31
    pip install --no-deps ultralytics==8.4.190 ultralytics-thop opencv-python-headless psutil
(`transformers` imports torchvision wherever it is installed and fails on this one, so the
exported transformers suite fails while it is there: `make vision` uninstalls it after).

The torchvision wheel on the package index is a CUDA build: its C++ ops (`torchvision::nms`,
`roi_align` and their relatives) do not load against torch's CPU build, and `import torchvision`
fails. `torchvision_with_cpu_ops()` declares those ops' schemas first (as torchvision's C++
declares them), with CPU kernels in plain torch for the two the detectors run, nms and roi_align
(torchvision's own Python roi_align), so that tracing records them and the ONNX exporter writes
them as torchvision's own ONNX symbolics do.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import io
import json
import os
import pathlib
import sys
import tempfile
import warnings
from typing import Any

import numpy as np
import onnx

from byoc.errors import UnknownModelError, did_you_mean
from byoc.models import exported

PREFIX = "vision:"
SUITE_NAME = "vision"  # `byoc matrix --models vision`: every model the installed families allow
TORCHVISION_VERSION = "0.28.0"
HINT = (f"the vision suite takes torchvision {TORCHVISION_VERSION} without its dependencies: pip install --no-deps "
        f"torchvision=={TORCHVISION_VERSION} pillow, and timm==1.0.31 for timm's families (`make vision` installs them)")

TORCHVISION = {
    # name: (builder keyword arguments, input size)
    "resnet50": ({}, 224),
    "mobilenet_v3_large": ({}, 224),
    "efficientnet_b0": ({}, 224),
    "regnet_y_400mf": ({}, 224),
    "convnext_tiny": ({}, 224),
    "swin_v2_t": ({}, 256),
    "vit_b_16": ({}, 224),
    "maxvit_t": ({}, 224),
    "deeplabv3_mobilenet_v3_large": ({"weights_backbone": None, "aux_loss": False}, 256),
    "lraspp_mobilenet_v3_large": ({"weights_backbone": None}, 256),
}
# timm's families the models users bring were measured on (timm.create_model, no weights)
TIMM = {
    "levit_128s": 224,
    "resnest14d": 224,
    "convnextv2_atto": 224,
    "fastvit_t8": 256,
    "efficientformerv2_s0": 224,
    "edgenext_xx_small": 256,
    "repvit_m1": 224,
    "mobilevitv2_050": 256,
    "ghostnet_100": 224,
    "coatnet_nano_rw_224": 224,
}
DETECTORS = {
    # name: (torchvision.models.detection builder, keyword arguments); 320x320 images
    "ssdlite320": ("ssdlite320_mobilenet_v3_large", {"weights": None, "weights_backbone": None, "score_thresh": 0.001}),
    "fasterrcnn_mobilenet_v3_large_320_fpn": ("fasterrcnn_mobilenet_v3_large_320_fpn",
                                              {"weights": None, "weights_backbone": None, "box_score_thresh": 0.001}),
    "retinanet_resnet50_fpn_320": ("retinanet_resnet50_fpn", {"weights": None, "weights_backbone": None, "score_thresh": 0.001,
                                                              "min_size": 320, "max_size": 320}),
}
DETECTOR_SIZE = 320
# Ultralytics' models from the configs the package ships, exported by its own exporter
# (`YOLO(config).export(format="onnx")`, its defaults but the opset and no onnxslim, which it
# would install): name: (config, input size)
ULTRALYTICS = {
    "yolov8n": ("yolov8n.yaml", 640),
    "yolo11n": ("yolo11n.yaml", 640),
    "yolov8n_seg": ("yolov8n-seg.yaml", 640),
}
ULTRALYTICS_INSTALL = "pip install --no-deps ultralytics==8.4.190 ultralytics-thop opencv-python-headless psutil"


def task(name: str) -> str:
    if name in DETECTORS or name in ULTRALYTICS:
        return "detector"
    return "segmenter" if "deeplab" in name or "lraspp" in name else "classifier"


def available(name: str | None = None) -> str | None:
    """None when the families `name` needs (any: torchvision's) are installed, else what is
    missing and how to install it."""
    reason = exported.available()
    if reason is None and importlib.util.find_spec("torchvision") is None:
        reason = "torchvision is not installed"
    if reason is None and name in TIMM and importlib.util.find_spec("timm") is None:
        reason = "timm is not installed"
    if reason is None and name in ULTRALYTICS and importlib.util.find_spec("ultralytics") is None:
        return f"ultralytics is not installed; {ULTRALYTICS_INSTALL} (`make vision` installs it)"
    return None if reason is None else f"{reason}; {HINT}"


def names() -> list[str]:
    """Every model of the suite the installed families allow (timm's where timm is installed,
    Ultralytics' where it is)."""
    return [*TORCHVISION, *(TIMM if available("levit_128s") is None else ()), *DETECTORS,
            *(ULTRALYTICS if available("yolov8n") is None else ())]


def _size(name: str) -> int:
    if name in DETECTORS:
        return DETECTOR_SIZE
    return TIMM[name] if name in TIMM else ULTRALYTICS[name][1] if name in ULTRALYTICS else TORCHVISION[name][1]


def parse_spec(spec: str) -> str:
    """The model a `vision:NAME` spec names; an unknown name, or a missing family, is an error."""
    name = spec[len(PREFIX):]
    known = [*TORCHVISION, *TIMM, *DETECTORS, *ULTRALYTICS]
    if name not in known:
        raise UnknownModelError(f"unknown vision model {name!r}{did_you_mean(name, known)}; known: {', '.join(known)}")
    reason = available(name)
    if reason is not None:
        raise exported.MissingExtraError(f"{spec}: {reason}")
    return name


def export(name: str, cache_dir: str | os.PathLike | None = None) -> tuple[pathlib.Path, np.ndarray]:
    """The model's ONNX file (exported first if it is not in the cache) and its seeded image."""
    import torch

    parse_spec(PREFIX + name)
    size = _size(name)
    image = torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    family, version, arguments = _family(name)
    exporter = "legacy" if name in DETECTORS else "ultralytics" if name in ULTRALYTICS else "dynamo"
    fields = [name, arguments, size, family, version, torch.__version__, exporter]
    key = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:20]
    target = exported.cache_directory(cache_dir) / f"vision-{name}-{key}.onnx"
    return exported.cached(target, lambda: _exported(name, image)), image.numpy()


def _family(name: str) -> tuple[str, str, Any]:
    torchvision = torchvision_with_cpu_ops()  # before timm and ultralytics, which import it
    if name in TIMM:
        import timm

        return "timm", timm.__version__, {}
    if name in ULTRALYTICS:
        import ultralytics

        return "ultralytics", ultralytics.__version__, ULTRALYTICS[name][0]
    return "torchvision", torchvision.__version__, DETECTORS[name] if name in DETECTORS else TORCHVISION[name][0]


def _build(name: str) -> Any:
    import torch

    torch.manual_seed(0)
    torchvision = torchvision_with_cpu_ops()
    if name in TIMM:
        import timm

        return timm.create_model(name, pretrained=False).eval()
    if name in DETECTORS:
        builder, arguments = DETECTORS[name]
        return getattr(torchvision.models.detection, builder)(**arguments).eval()
    builder = getattr(torchvision.models.segmentation, name, None) or getattr(torchvision.models, name)
    return builder(weights=None, **TORCHVISION[name][0]).eval()


def _exported(name: str, image: Any) -> onnx.ModelProto:
    """The model exported as its users export it, read back whole (the exporter may write its
    weights beside the file)."""
    import torch

    if name in ULTRALYTICS:
        return _ultralytics_exported(name)
    model = _build(name)
    options = {"dynamo": False, "opset_version": 17} if name in DETECTORS else {"dynamo": True, "verbose": False}
    with tempfile.TemporaryDirectory() as directory, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = os.path.join(directory, "model.onnx")
        torch.onnx.export(model, (image,), path, input_names=["image"], **options)
        return onnx.load(path)


def _ultralytics_exported(name: str) -> onnx.ModelProto:
    """The model exported by Ultralytics' own exporter, offline, in a directory of its own (it
    writes beside its config: here, the working directory)."""
    import torch

    os.environ.setdefault("YOLO_OFFLINE", "1")  # no update checks, no downloads
    from ultralytics import YOLO

    config, size = ULTRALYTICS[name]
    torch.manual_seed(0)
    model = YOLO(config)
    with tempfile.TemporaryDirectory() as directory, contextlib.chdir(directory), warnings.catch_warnings(), \
            contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        path = model.export(format="onnx", imgsz=size, simplify=False, opset=17, device="cpu", verbose=False)
        return onnx.load(os.path.join(directory, path))


_SCHEMAS = [
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio, "
    "bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, SymInt batch_size, "
    "SymInt channels, SymInt height, SymInt width, int sampling_ratio, bool aligned) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio) "
    "-> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) -> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) -> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "qroi_align(Tensor input, Tensor rois, float input_scale, int input_zero_point, float rois_scale, int rois_zero_point, "
    "float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, SymInt stride_w, "
    "SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, "
    "SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, SymInt offset_groups, "
    "bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
]
_KEEP: list = []  # the library object must outlive the import, and is made once per process


def _nms(dets, scores, iou_threshold):
    """Greedy non-maximum suppression, as torchvision's CPU kernel does it."""
    import torch

    x1, y1, x2, y2 = dets.unbind(1)
    area = (x2 - x1) * (y2 - y1)
    suppressed = torch.zeros(len(dets), dtype=torch.bool)
    keep = []
    for i in torch.argsort(scores, descending=True, stable=True).tolist():
        if suppressed[i]:
            continue
        keep.append(i)
        inter = (torch.minimum(x2[i], x2) - torch.maximum(x1[i], x1)).clamp(min=0) * \
                (torch.minimum(y2[i], y2) - torch.maximum(y1[i], y1)).clamp(min=0)
        suppressed |= inter / (area[i] + area - inter) > iou_threshold
    return torch.tensor(keep, dtype=torch.long)


def _roi_align(*args):
    from torchvision.ops.roi_align import _roi_align as python_roi_align

    return python_roi_align.__wrapped__(*args)  # torchvision's Python kernel, not its torch.compile wrapper


def _has_ops() -> bool:
    return True


@functools.cache
def torchvision_with_cpu_ops():
    """torchvision, imported with its C++ ops declared (see the module's docstring)."""
    import torch

    library = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS:
        library.define(schema)
    library.impl("nms", _nms, "CPU")
    library.impl("roi_align", _roi_align, "CPU")
    _KEEP.append(library)
    import torchvision

    torchvision.extension._has_ops = _has_ops  # its scripted helpers check that the C++ ops exist
    for name in ("torchvision.ops.roi_align", "torchvision.ops.boxes", "torchvision.ops.roi_pool"):
        if hasattr(sys.modules.get(name), "_has_ops"):
            sys.modules[name]._has_ops = _has_ops
    return torchvision
