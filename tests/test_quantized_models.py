"""Quantized models as users bring them: a zoo model quantized by onnxruntime's own tool (QDQ,
per-channel int8 weights), imported with its quantization kept, and run by oneDNN in int8
primitives in one region, against onnxruntime running the same file.

Tolerance: onnxruntime and oneDNN requantize with the same scales but in a different order of
float operations, so an element on a rounding boundary may land one step apart, and a step early
in the network moves the logits of this random-weight model by a few steps. Relative L2 is at
most 2% on average over the samples (about 1% measured) and 3% on any one of them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import byoc
from byoc import models as zoo
from byoc.models.quantized import quantize_static

pytest.importorskip("onnxruntime.quantization")


def _quantized(name: str, activations: str) -> onnx.ModelProto:
    model = zoo.get(name, small=True)
    return quantize_static(model, [zoo.sample_inputs(model, seed=s) for s in range(4)], activations)


@pytest.fixture(scope="module")
def resnet_u8() -> onnx.ModelProto:
    return _quantized("resnet18", "uint8")


def _relative_l2(compiled, model: onnx.ModelProto, seeds=(100, 101, 102)) -> list[float]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    errors = []
    for seed in seeds:
        inputs = zoo.sample_inputs(model, seed=seed)
        want = session.run(None, inputs)[0]
        got = compiled.run(inputs)[0]
        errors.append(float(np.linalg.norm(got - want) / np.linalg.norm(want)))
    return errors


def _within_bound(errors: list[float]) -> bool:
    return float(np.mean(errors)) <= 0.02 and max(errors) <= 0.03


_VERBOSE_RUN = """
import sys, byoc
from byoc import models as zoo
import onnx
compiled = byoc.load(sys.argv[1])
model = onnx.load(sys.argv[2])
compiled.run(zoo.sample_inputs(model, seed=0))
"""


def test_a_model_quantized_by_onnxruntime_runs_in_int8_primitives_in_one_region(resnet_u8, tmp_path):
    partitioned = byoc.partition_for(byoc.from_onnx(resnet_u8), "dnnl")
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and report.offload_ratio_nodes == 1.0, report.to_table()
    patterns = Counter({p: n for r in report.regions for p, n in r.patterns.items()})
    convolutions = sum(1 for n in resnet_u8.graph.node if n.op_type == "Conv")
    assert patterns["dnnl.qconv2d_bias"] == convolutions and patterns["dnnl.qadd"] > 0, patterns
    compiled = byoc.build(partitioned)
    errors = _relative_l2(compiled, resnet_u8)
    assert _within_bound(errors), errors

    # In a fresh process, from the exported artifact: oneDNN's own log shows what runs.
    compiled.export(tmp_path / "model.byoc")
    onnx.save(resnet_u8, tmp_path / "model.onnx")
    run = subprocess.run([sys.executable, "-c", _VERBOSE_RUN, str(tmp_path / "model.byoc"), str(tmp_path / "model.onnx")],
                         capture_output=True, text=True, env={**__import__("os").environ, "ONEDNN_VERBOSE": "1"}, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    executed = [line.split(",") for line in run.stdout.splitlines() if line.startswith("onednn_verbose") and ",exec," in line]
    convolutions_run = [fields for fields in executed if fields[3] == "convolution"]
    assert len(convolutions_run) == convolutions
    assert all("src_u8" in fields[6] and "wei_s8" in fields[6] for fields in convolutions_run), convolutions_run[:2]
    assert not [fields for fields in executed if fields[4].startswith("ref")], "oneDNN ran reference (C loop) kernels"


def test_int8_activations_run_too():
    model = _quantized("resnet18", "int8")
    partitioned = byoc.partition_for(byoc.from_onnx(model), "dnnl")
    assert len(byoc.report(partitioned).regions) == 1
    errors = _relative_l2(byoc.build(partitioned), model)
    assert _within_bound(errors), errors


def test_weights_stay_int8_from_import_to_the_artifact(resnet_u8, tmp_path):
    mod = byoc.from_onnx(resnet_u8)
    weights = [b.value for block in mod["main"].body.blocks for b in block.bindings
               if getattr(getattr(b.value, "op", None), "name", None) == "relax.dequantize" and b.value.args[0].ty.dtype == "int8"]
    layers = sum(1 for n in resnet_u8.graph.node if n.op_type in ("Conv", "Gemm", "MatMul"))
    assert len(weights) == layers
    stored = sum(numpy_helper.to_array(i).nbytes for i in resnet_u8.graph.initializer if i.data_type == onnx.TensorProto.INT8)
    record = json.loads(str(byoc.partition_for(mod, "dnnl").attrs["byoc.partition"]))
    # The region holds the int8 weights and float32 biases and scales: not four times the weights.
    assert record["regions"][0]["constant_bytes"] < 1.2 * stored


def test_a_vendor_without_quantized_ops_gets_float_weights_as_before(resnet_u8):
    report = byoc.report(byoc.partition_for(byoc.from_onnx(resnet_u8), "onnxruntime"))
    convolutions = sum(1 for n in resnet_u8.graph.node if n.op_type == "Conv")
    offloaded = Counter(op for r in report.regions for op in r.ops)
    assert offloaded["relax.nn.conv2d"] == convolutions, report.to_table()
    assert "relax.dequantize" not in offloaded
    assert any("relax.quantize" in reason for reasons in report.host_reasons().values() for reason in reasons)


def test_weights_with_a_zero_point_stay_float_and_say_why(resnet_u8):
    model = onnx.ModelProto()
    model.CopyFrom(resnet_u8)
    weight_zero = next(i for i in model.graph.initializer if i.name.endswith("weight_zero_point") and i.data_type == onnx.TensorProto.INT8)
    values = numpy_helper.to_array(weight_zero).copy()
    values[...] = 1
    weight_zero.CopyFrom(numpy_helper.from_array(values, weight_zero.name))
    report = byoc.report(byoc.partition_for(byoc.from_onnx(model), "dnnl"))
    reasons = [r for rs in report.host_reasons().values() for r in rs]
    assert any("zero point other than 0" in r for r in reasons), reasons
    errors = _relative_l2(byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl")), model)
    assert _within_bound(errors), errors
