"""Accelerator-specific processing: quantize/dequantize insertion, calibration, layout, float16."""

import numpy as np
import pytest

import byoc
from byoc.annotate import fused_pattern
from byoc.backend.arrays import aligned
from byoc.codegen_json import JsonRuntime, region_to_json, tvm_engine
from byoc.codegen_json.references import kernels
from byoc.errors import QuantizationError
from byoc.processing import CALIBRATION_ATTR, QuantizationConfig, RegionCalibration, quantize_graph, to_float16, to_nhwc
from byoc.processing.ranges import METHODS, TensorRange, entropy_threshold
from byoc.runtime_metadata.build import region_functions
from byoc.runtime_metadata.calibration import calibrate

from conftest import small_model, small_module

OPS = ("relax.nn.conv2d", "relax.add", "relax.nn.relu", "relax.nn.max_pool2d", "relax.mean", "relax.reshape", "relax.matmul")


def _backend():
    backend = byoc.Backend(name="proc", codegen=JsonRuntime(tvm_engine.build_engine, "t"))
    backend.pattern("conv2d_bias_relu", *fused_pattern("relax.nn.conv2d", bias=True, activation="relax.nn.relu"))
    backend.pattern("conv2d_bias", *fused_pattern("relax.nn.conv2d", bias=True))
    backend.supports(*OPS)
    return backend


@pytest.fixture(scope="module")
def region():
    """The ResNet-18 region as a JSON graph, its constants and calibration over 4 inputs."""
    backend = _backend()
    byoc.register_backend(backend, override=True)
    try:
        model = small_model("resnet18")
        partitioned = byoc.partition_for(small_module("resnet18"), backend)
        calibrated = calibrate(partitioned, backend, [byoc.models.sample_inputs(model, seed=s) for s in range(4)])
    finally:
        byoc.unregister_backend("proc")
    ((symbol, name, func),) = region_functions(calibrated)
    graph, constants = region_to_json(func, symbol, name)
    return graph, constants, RegionCalibration.from_json(str(func.attrs[CALIBRATION_ATTR]))


def _run(graph, constants, x):
    outputs = [np.empty(graph["nodes"][o["node"]]["outputs"][o.get("index", 0)]["shape"], "float32") for o in graph["outputs"]]
    tvm_engine.build_engine(graph, constants, {}).run([aligned(x)], outputs)
    return outputs[0]


def _relative(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def image():
    return byoc.models.sample_inputs(small_model("resnet18"), seed=9)["input"]


def test_calibration_records_every_kernel(region):
    graph, _, calibration = region
    assert calibration.samples == 4
    assert len(calibration.kernels) == len(kernels(graph)) and len(calibration.inputs) == 1
    low, high = calibration.kernels[0][0]  # conv + bias + relu: non-negative
    assert low >= 0.0 < high


def test_quantize_dequantize_at_the_boundary_and_around_each_kernel(region, image):
    graph, constants, calibration = region
    quantized, qconstants = quantize_graph(graph, constants, QuantizationConfig(), calibration)
    ops = [n["op"] for n in quantized["nodes"]]
    assert ops[:2] == ["relax.quantize", "relax.dequantize"]  # the region input
    out = quantized["nodes"][quantized["outputs"][0]["node"]]
    assert out["op"] == "relax.dequantize" and out["outputs"][0]["dtype"] == "float32"
    compute = [k for k in kernels(quantized) if k.nodes[0]["op"] not in ("relax.quantize", "relax.dequantize")]
    assert len(compute) == len(kernels(graph))
    assert ops.count("relax.quantize") == 1 + len(kernels(graph))
    weights = [a for a in qconstants.values() if a.dtype == np.int8 and a.ndim == 4]
    assert len(weights) == 20 and all(np.abs(w).max() <= 127 for w in weights)
    scales = [qconstants[n["args"][1]["const"]] for n in quantized["nodes"] if n["op"] == "relax.dequantize" and n["attrs"]["axis"] == 0]
    assert len(scales) == 20 and all(s.shape == (w.shape[0],) for s, w in zip(scales, weights))  # per output channel
    error = _relative(_run(quantized, qconstants, image), _run(graph, constants, image))
    assert 0.0 < error < 0.05  # int8: not exact, and within 5% relative L2


def test_power_of_two_per_tensor_scales(region, image):
    graph, constants, calibration = region
    quantized, qconstants = quantize_graph(graph, constants, QuantizationConfig(power_of_two=True, per_channel=False), calibration)
    scales = [qconstants[n["args"][1]["const"]] for n in quantized["nodes"] if n["op"] in ("relax.quantize", "relax.dequantize")]
    logs = np.log2(np.concatenate([np.ravel(s) for s in scales]))
    assert np.allclose(logs, np.round(logs)) and all(np.size(s) == 1 for s in scales)
    assert _relative(_run(quantized, qconstants, image), _run(graph, constants, image)) < 0.10


def test_dynamic_quantization_takes_scales_from_the_data(region, image):
    graph, constants, _ = region
    quantized, qconstants = quantize_graph(graph, constants, QuantizationConfig(calibration="dynamic"))
    ops = [n["op"] for n in quantized["nodes"]]
    assert ops.count("relax.max") == ops.count("relax.quantize") == 1 + len(kernels(graph))  # one scale per quantized tensor
    assert _relative(_run(quantized, qconstants, image), _run(graph, constants, image)) < 0.05


def test_static_quantization_needs_calibration(region):
    graph, constants, _ = region
    with pytest.raises(QuantizationError, match="region proc_0 \\(proc\\): static quantization needs calibration data"):
        quantize_graph(graph, constants, QuantizationConfig())
    with pytest.raises(QuantizationError, match="int8 is"):
        QuantizationConfig(dtype="int4")


def test_calibration_without_samples_is_a_clear_error():
    backend = _backend()
    byoc.register_backend(backend, override=True)
    try:
        partitioned = byoc.partition_for(small_module("mlp"), backend)
        with pytest.raises(QuantizationError, match="'proc' quantizes at compile time and needs calibration data"):
            calibrate(partitioned, backend, [])
    finally:
        byoc.unregister_backend("proc")


def test_layout_transform_inserts_transposes_at_the_boundary(region, image):
    graph, constants, _ = region
    nhwc, nhwc_constants = to_nhwc(graph, constants)
    convs = [n for n in nhwc["nodes"] if n["op"] == "relax.nn.conv2d"]
    assert all(n["attrs"]["data_layout"] == "NHWC" and n["attrs"]["kernel_layout"] == "OHWI" for n in convs)
    permutes = [n for n in nhwc["nodes"] if n["op"] == "relax.permute_dims"]
    # into NHWC at the input, back to NCHW before the flatten (which is not layout-aware)
    assert [p["attrs"]["axes"] for p in permutes] == [[0, 2, 3, 1], [0, 3, 1, 2]]
    np.testing.assert_allclose(_run(nhwc, nhwc_constants, image), _run(graph, constants, image), rtol=1e-4, atol=1e-4)


def test_float16_cast_inside_the_region(region, image):
    graph, constants, _ = region
    half, half_constants = to_float16(graph, constants)
    assert half["inputs"][0]["dtype"] == "float32"  # the host keeps float32
    assert {a.dtype for a in half_constants.values()} == {np.dtype("float16")}
    assert all(o["dtype"] == "float16" for n in half["nodes"][1:-1] for o in n["outputs"])
    assert _relative(_run(half, half_constants, image), _run(graph, constants, image)) < 1e-2


def test_range_methods_clip_outliers_and_keep_the_bulk():
    rng = np.random.default_rng(0)
    relu = np.maximum(rng.standard_normal(1 << 16), 0).astype(np.float32)
    with_outlier = np.concatenate([relu, [40.0]]).astype(np.float32)
    bounds = {}
    for method in METHODS:
        tensor = TensorRange(method, seed=0)
        tensor.add(with_outlier.reshape(1, -1))
        bounds[method] = tensor.bounds()
    assert bounds["minmax"] == [0.0, 40.0]
    # The lone outlier is clipped; the bulk of a ReLU'd unit Gaussian (up to about 4) is kept.
    assert 3.0 < bounds["percentile"][1] < 5.0
    assert 3.0 < bounds["entropy"][1] < 5.0
    assert 3.0 < entropy_threshold(np.abs(rng.standard_normal(1 << 16)).astype(np.float32)) < 5.0


def test_calibration_method_is_chosen_per_call_or_by_the_backend():
    backend = _backend()
    byoc.register_backend(backend, override=True)
    try:
        partitioned = byoc.partition_for(small_module("mlp"), backend)
        model = small_model("mlp")
        samples = [byoc.models.sample_inputs(model, seed=s) for s in range(2)]
        ranges = {}
        for method in METHODS:
            calibrated = calibrate(partitioned, backend, samples, method=method)
            ((_, _, func),) = region_functions(calibrated)
            ranges[method] = RegionCalibration.from_json(str(func.attrs[CALIBRATION_ATTR]))
        with pytest.raises(QuantizationError, match="unknown calibration method 'kl'; the methods are minmax, percentile, entropy"):
            calibrate(partitioned, backend, samples, method="kl")
    finally:
        byoc.unregister_backend("proc")
    widest = [high - low for kernel in ranges["minmax"].kernels for low, high in kernel]
    for method in ("percentile", "entropy"):
        clipped = [high - low for kernel in ranges[method].kernels for low, high in kernel]
        assert all(c <= w + 1e-6 for c, w in zip(clipped, widest))
    with pytest.raises(QuantizationError, match="calibration_method must be one of"):
        QuantizationConfig(calibration_method="kl")
