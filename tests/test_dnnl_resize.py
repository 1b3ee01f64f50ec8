"""Resizes on dnnl (relax.image.resize2d: YOLO's and MobileViT v2's upsampling, segmentation
heads' bilinear resize), as oneDNN's resampling, in the modes where it computes what the model
does: checked against TVM's own resize kernels after a convolution (whose result oneDNN keeps in
a blocked layout), and every other mode left on the host with its reason."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax
from tvm.relax import op as R

import byoc

from conftest import FP32_ATOL, FP32_RTOL

RNG = np.random.default_rng(5)


def _resized(size, method: str, mode: str, rounding: str = "", shape=(1, 8, 6, 6)):
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    weight = relax.const((RNG.standard_normal((shape[1], shape[1], 3, 3)) * 0.2).astype(np.float32))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            conv = builder.emit(R.nn.conv2d(x, weight, padding=(1, 1)), "conv")
            value = builder.emit(R.image.resize2d(conv, size, method=method, coordinate_transformation_mode=mode,
                                                  rounding_method=rounding), "resize")
            out = builder.emit_output(builder.emit(R.nn.relu(value), "relu"))
        builder.emit_func_output(out)
    return builder.get()


@pytest.mark.parametrize("size, method, mode, rounding", [
    ((12, 12), "nearest_neighbor", "asymmetric", "floor"),  # torch's nn.Upsample(scale_factor=2), YOLO's
    ((18, 12), "nearest_neighbor", "asymmetric", "floor"),
    ((12, 18), "nearest_neighbor", "half_pixel", "round_prefer_floor"),  # ONNX Resize's defaults
    ((12, 12), "nearest_neighbor", "half_pixel", "round"),
    ((12, 12), "linear", "half_pixel", ""),  # torch's bilinear, align_corners=False
    ((9, 10), "linear", "half_pixel", ""),
    ((4, 5), "linear", "half_pixel", ""),  # smaller
    ((9, 7), "linear", "pytorch_half_pixel", ""),
])
def test_a_resize_runs_in_the_dnnl_region_as_tvm_computes_it(size, method, mode, rounding):
    mod = _resized(size, method, mode, rounding)
    partitioned = byoc.partition_for(mod, "dnnl")
    report = byoc.report(partitioned)
    assert [r.backend for r in report.regions] == ["dnnl"] and not report.host_ops, str(report)
    x = RNG.standard_normal((1, 8, 6, 6)).astype(np.float32)
    got = byoc.build(partitioned, strict=True).run(x)[0]
    want = byoc.build(byoc.partition_for(mod, "reference")).run(x)[0]
    np.testing.assert_allclose(got, want, rtol=FP32_RTOL, atol=FP32_ATOL * np.abs(want).max())


@pytest.mark.parametrize("size, method, mode, rounding, reason", [
    ((18, 18), "nearest_neighbor", "asymmetric", "round_prefer_floor", "a nearest resize with asymmetric coordinates"),
    ((12, 12), "nearest_neighbor", "half_pixel", "ceil", "a nearest resize with half_pixel coordinates and ceil rounding"),
    ((9, 9), "nearest_neighbor", "half_pixel", "round", "a nearest resize by a whole factor only"),
    ((12, 12), "linear", "align_corners", "", "a linear resize with align_corners coordinates"),
    ((12, 12), "cubic", "half_pixel", "", "a cubic resize (oneDNN has nearest and linear)"),
])
def test_a_resize_onednn_computes_otherwise_stays_on_the_host_with_the_reason(size, method, mode, rounding, reason):
    report = byoc.report(byoc.partition_for(_resized(size, method, mode, rounding), "dnnl"))
    resize = [op for op in report.host_ops if "relax.image.resize2d" in op.ops]
    assert resize and any(reason in r for r in resize[0].reasons), str(report)
