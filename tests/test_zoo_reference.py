"""Zoo models partition for the reference backend, run, and match onnxruntime (VGG-19 and
Inception v3, the slowest to compile, run through every vendor in `make matrix`)."""

import pytest

import byoc
from byoc import models as zoo

from conftest import assert_fp32_close, onnxruntime_outputs, small_model, small_module


@pytest.mark.parametrize("name", [n for n in zoo.names() if n not in ("vgg19", "inception_v3")])
def test_zoo_model_runs_through_the_reference_backend(name):
    model = small_model(name)
    partitioned = byoc.partition_for(small_module(name), "reference")
    report = byoc.report(partitioned)
    assert report.offload_ratio_macs == 1.0
    assert report.offload_ratio_nodes > 0.9
    inputs = zoo.sample_inputs(model, seed=2)
    assert_fp32_close(byoc.build(partitioned).run(**inputs), onnxruntime_outputs(model, inputs))


def test_detector_keeps_its_post_processing_on_the_host():
    report = byoc.report(byoc.partition_for(small_module("ssd_detector"), "reference"))
    host_ops = {op for h in report.host_ops for op in h.ops}
    assert host_ops == {"relax.vision.all_class_non_max_suppression"}
    assert report.host_ops[0].node == "postprocess/NonMaxSuppression"
