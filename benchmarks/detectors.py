"""torchvision's detectors, whose shapes depend on the image, through byoc against onnxruntime.

SSDlite320 MobileNetV3, Faster R-CNN MobileNetV3 320 FPN and RetinaNet ResNet-50 FPN at 320,
with random weights (nothing is
downloaded) and a low score threshold (random weights reach no class at the default 0.05), are
exported as users export them: `torch.onnx.export(..., dynamo=False, opset_version=17)` (the
dynamo exporter and torch.export refuse them: the box count depends on the data). Each file is
imported with `byoc.from_onnx`: the head compiled for each vendor, the tail from the first
data-dependent node run in onnxruntime after it (see docs/models.md). Every output is compared
with onnxruntime's on the same file, then each system is timed against the others in one
process (blocks, medians and p90).

    python -m benchmarks.detectors [--runs 20] [--threads 2]

Needs the torch extra and torchvision 0.28.0, the release paired with torch 2.13:
    pip install -e '.[torch]' && pip install --no-deps torchvision==0.28.0 pillow
(and `pip uninstall torchvision pillow` after: `transformers` imports torchvision wherever it is
installed, and fails on this one, so the exported suite's tests fail while it is there).

The torchvision wheel on the package index is a CUDA build: its C++ ops (`torchvision::nms`,
`roi_align` and their relatives) do not load against torch's CPU build, and `import torchvision`
fails. `torchvision_with_cpu_ops()` declares those ops' schemas first (as torchvision's C++ declares them),
with CPU kernels in plain torch for the two the detectors run, nms and roi_align (torchvision's
own Python roi_align), so that tracing records them and the ONNX exporter writes them as
torchvision's own ONNX symbolics do.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import warnings

import numpy as np

from byoc.timing import instruction_set, machine_description, pin_threads, spread, time_blocks

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


def export(name: str, directory: str) -> tuple[str, np.ndarray]:
    import torch

    detection = torchvision_with_cpu_ops().models.detection
    torch.manual_seed(0)
    if name == "ssdlite320":
        model = detection.ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, score_thresh=0.001)
    elif name == "retinanet_resnet50_fpn_320":
        model = detection.retinanet_resnet50_fpn(weights=None, weights_backbone=None, score_thresh=0.001, min_size=320, max_size=320)
    else:
        model = detection.fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, box_score_thresh=0.001)
    image = torch.rand(1, 3, 320, 320, generator=torch.Generator().manual_seed(1))
    path = os.path.join(directory, f"{name}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (image,), path, dynamo=False, opset_version=17, input_names=["image"])
    return path, image.numpy()


def measure(name: str, directory: str, runs: int) -> list[str]:
    import onnxruntime as ort

    import byoc

    path, image = export(name, directory)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    want = session.run(None, {"image": image})
    runners = {"onnxruntime": lambda: session.run(None, {"image": image})}
    cells = {}
    for vendor in ("dnnl", "onnxruntime"):
        partitioned = byoc.partition_for(byoc.from_onnx(path), vendor)
        report = byoc.report(partitioned)
        compiled = byoc.build(partitioned)
        got = compiled.run(image=image)
        same = all(g.shape == w.shape and np.allclose(g, w, rtol=1e-4, atol=1e-4) for g, w in zip(got, want))
        cells[vendor] = f"{report.offload_ratio_macs:.0%} of {report.total_macs / 1e6:,.0f} M MACs, {len(report.regions)} region(s); " \
                        f"outputs {'equal onnxruntime' if same else 'DIFFER'}"
        runners[f"byoc + {vendor}"] = lambda compiled=compiled: compiled.run(image=image)
        tail = report.tail or "no tail"
    samples = time_blocks(runners, runs)
    base = spread(samples["onnxruntime"]).median_ms
    rows = [f"### {name}", f"tail: {tail}", "", "| system | median ms | p90 ms | over onnxruntime | partition |",
            "| --- | ---: | ---: | ---: | --- |"]
    for system, times in samples.items():
        s = spread(times)
        partition = cells[system.removeprefix("byoc + ")] if system.startswith("byoc + ") else "the whole file"
        rows.append(f"| {system} | {s.median_ms:.1f} | {s.p90_ms:.1f} | {s.median_ms / base:.2f}x | {partition} |")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="ssdlite320,fasterrcnn_mobilenet_320,retinanet_resnet50_fpn_320")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    pin_threads(args.threads, "benchmarks.detectors", argv)
    print(f"{machine_description()}; {instruction_set()}\n")
    with tempfile.TemporaryDirectory() as directory:
        for name in args.models.split(","):
            print("\n".join(measure(name, directory, args.runs)) + "\n", flush=True)


if __name__ == "__main__":
    main()
