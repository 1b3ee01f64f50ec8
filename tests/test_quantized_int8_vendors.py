"""The int8 devices (Ethos-U through Vela, the simulated DPU) on a model quantized by onnxruntime's
own tool: whole regions, the model's own scales, no calibration.

Tolerances, relative L2 against onnxruntime running the same quantized file, averaged over three
seeded inputs:
- Ethos-U holds the model's quantization exactly (int8 with zero points, per-channel weights), so
  it is bound as dnnl is (`test_quantized_models`): at most 3%, about 2% measured, as far from
  onnxruntime as onnxruntime's own int8 is from the float model.
- The DPU needs symmetric power-of-two scales and per-tensor weights: each step up to 4x coarser
  than the model's (a ReLU's uint8 range loses a bit to the sign, the power of two up to another),
  which about doubles the error (4.5% on ResNet-18, 2.9% on MobileNetV2 measured): at most 7%.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import byoc
from byoc import models as zoo
from byoc.custom_formats.container import unwrap
from byoc.errors import BuildError, RequantizationWarning
from byoc.models.quantized import quantize_static
from byoc.vendors.ethos_u import ETHOS_U_PAYLOAD as payload_format
from byoc.vendors.ethos_u import payload

pytest.importorskip("onnxruntime.quantization")
pytest.importorskip("ethosu.vela")

FLOAT_RESNET = zoo.get("resnet18", small=True)
BOUND = {"ethos_u": 0.03, "vitis_ai": 0.07}


@pytest.fixture(scope="module")
def resnet_u8() -> onnx.ModelProto:
    return quantize_static(FLOAT_RESNET, [zoo.sample_inputs(FLOAT_RESNET, seed=s) for s in range(4)], "uint8")


def _relative_l2(compiled, model: onnx.ModelProto) -> float:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    errors = []
    for seed in (100, 101, 102):
        inputs = zoo.sample_inputs(model, seed=seed)
        want, got = session.run(None, inputs)[0], compiled.run(inputs)[0]
        errors.append(float(np.linalg.norm(got - want) / np.linalg.norm(want)))
    return float(np.mean(errors))


@pytest.mark.parametrize("vendor", ["ethos_u", "vitis_ai"])
def test_a_quantized_model_is_one_region_with_its_own_scales_and_no_calibration(resnet_u8, vendor):
    # No calibration= : the model's quantization gives every range.
    partitioned = byoc.partition_for(byoc.from_onnx(resnet_u8), vendor)
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and report.offload_ratio_nodes == 1.0, report.to_table()
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        compiled = byoc.build(partitioned)
    requantized = [w for w in warned if issubclass(w.category, RequantizationWarning)]
    if vendor == "ethos_u":
        assert not requantized, requantized[0].message
    else:
        (warning,) = requantized
        assert "power-of-two" in str(warning.message) and "not measured" in str(warning.message)
    error = _relative_l2(compiled, resnet_u8)
    assert error <= BOUND[vendor], error


def test_ethos_u_computes_with_the_models_int8_weights_and_scales(resnet_u8):
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(resnet_u8), "ethos_u"))
    _, blob = unwrap(compiled.artifacts[0].payload, payload_format.name, (payload_format.version,), "test")
    program, _ = payload.decode(blob)
    convolutions = [op for op in program.ops if op.kind in ("conv", "depthwise")]
    model_weights = {}
    initializers = {i.name: numpy_helper.to_array(i) for i in resnet_u8.graph.initializer}
    for node in resnet_u8.graph.node:
        if node.op_type == "DequantizeLinear" and initializers.get(node.input[0], np.empty(0)).ndim == 4:
            model_weights[node.input[0]] = (initializers[node.input[0]], initializers[node.input[1]])
    assert len(convolutions) == len(model_weights)
    kept = 0
    for op in convolutions:
        as_oihw = np.transpose(op.weights, (0, 3, 1, 2))
        for data, scales in model_weights.values():
            if data.shape == as_oihw.shape and np.array_equal(data, as_oihw):
                np.testing.assert_allclose(op.weight_scales, scales, rtol=1e-6)
                kept += 1
                break
    assert kept == len(convolutions)
    # Every activation's scale is one the model chose; its zero point moved 128 down with uint8 -> int8.
    chosen = {(float(initializers[n.input[1]]), int(initializers[n.input[2]]) - 128)
              for n in resnet_u8.graph.node if n.op_type == "QuantizeLinear"}
    held = {(t.scale, t.zero_point) for t in program.tensors}
    assert all(any(abs(s - scale) <= 1e-6 * scale and z == zero for scale, zero in chosen) for s, z in held), held - chosen


def test_the_dpu_measures_what_requantizing_adds_and_refuses_when_strict(resnet_u8):
    samples = [zoo.sample_inputs(FLOAT_RESNET, seed=s) for s in range(3)]
    partitioned = byoc.partition_for(byoc.from_onnx(resnet_u8), "vitis_ai", calibration=samples)
    with pytest.warns(RequantizationWarning, match=r"adds \d+\.\d+% relative L2 .* on 3 calibration sample") as warned:
        compiled = byoc.build(partitioned)
    stated = float(str(warned[0].message).split("adds ")[1].split("%")[0]) / 100
    # measured on the region's outputs, which are the model's: close to what the model shows
    assert abs(stated - _relative_l2(compiled, resnet_u8)) < 0.02
    with pytest.raises(BuildError, match="power-of-two"):
        byoc.build(partitioned, strict=True)


def test_an_activation_quantized_per_channel_stays_on_the_host_with_the_reason():
    from tvm import relax

    from byoc.annotate.int8_cnn import per_tensor_quantization

    x = relax.Var("x", relax.TensorType((1, 4, 8, 8), "float32"))
    scales = relax.const(np.full(4, 0.1, np.float32))
    zeros = relax.const(np.zeros(4, np.int8))
    call = relax.op.quantize(x, scales, zeros, axis=1, out_dtype="int8")
    assert "per channel" in per_tensor_quantization(call)
    assert per_tensor_quantization(relax.op.quantize(x, relax.const(np.float32(0.1)), relax.const(np.int8(0)), out_dtype="int8")) is None


def test_a_region_that_would_start_from_int8_data_falls_back_with_the_reason(resnet_u8):
    # The input's QuantizeLinear kept on the host: the region would receive int8 data, which the
    # device's regions do not take; the build says so and the host runs it, as the QDQ graph's
    # float arithmetic (1% from onnxruntime's int8 kernels here, within the 3% bound).
    first = next(n.name for n in resnet_u8.graph.node if n.op_type == "QuantizeLinear")
    partitioned = byoc.partition_for(byoc.from_onnx(resnet_u8), "ethos_u", host_ops=[first])
    with pytest.warns(UserWarning, match="receives int8 data from the host"):
        compiled = byoc.build(partitioned)
    assert _relative_l2(compiled, resnet_u8) <= BOUND["ethos_u"]
    with pytest.raises(BuildError, match="receives int8 data from the host"):
        byoc.build(partitioned, strict=True)


def test_a_region_the_dpu_cannot_take_is_not_measured_and_falls_back(resnet_u8):
    # Partitioning with calibration samples measures what the DPU's requantization adds to each
    # region; a region it cannot take as the model quantizes it (here it would receive int8
    # data) is not measured, and the build falls back for it with the reason, as without samples.
    # (A quantized transformer's regions cut at its int8 reshapes failed partitioning so.)
    first = next(n.name for n in resnet_u8.graph.node if n.op_type == "QuantizeLinear")
    samples = [zoo.sample_inputs(FLOAT_RESNET, seed=s) for s in range(2)]
    partitioned = byoc.partition_for(byoc.from_onnx(resnet_u8), "vitis_ai", host_ops=[first], calibration=samples)
    with pytest.warns(UserWarning, match="receives int8 data from the host"):
        compiled = byoc.build(partitioned)
    assert _relative_l2(compiled, resnet_u8) <= BOUND["ethos_u"]
