"""The TensorRT vendor: what runs on every machine (op checks and version gates, the ONNX each region
hands to TensorRT's parser, run through onnxruntime and compared with the unpartitioned model, and
the error without TensorRT), and what needs TensorRT and a GPU (skipped elsewhere, with the reason).

Tolerances: fp32 regions are held to the fp32 bound (rtol and atol 1e-4 of the output's scale);
fp16 regions to relative L2 <= 1% and top-1 agreement >= 95% (`byoc.backend.tolerance.FP16`).
"""

import dataclasses
import json

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

import byoc
from byoc.accuracy import measure_accuracy
from byoc.backend.tolerance import FP16, FP32
from byoc.codegen_json import JsonRuntime
from byoc.errors import BuildError, EngineError, PartitionError
from byoc.runtime_metadata.engine_cache import engine_cache_key
from byoc.vendors.onnxruntime import SessionEngine
from byoc.vendors.onnxruntime.engine import OnnxRuntimeSettings
from byoc.vendors.tensorrt import engine as trt_engine
from byoc.vendors.tensorrt import partition_for_tensorrt

from conftest import onnxruntime_outputs, small_model, small_module

CLASSIFIERS = ["resnet50", "mobilenet_v2", "vgg19"]
MISSING = trt_engine.unavailable()


def _parser_input_through_onnxruntime():
    """The registered tensorrt backend, except that each region's engine is an onnxruntime
    session over exactly the ONNX bytes TensorRT's parser would be given."""
    backend = byoc.backend.registry.get_backend("tensorrt")

    def build_engine(graph, constants, options):
        return SessionEngine(trt_engine.region_onnx(graph, constants), OnnxRuntimeSettings(graph_optimization_level="disable"))

    return dataclasses.replace(backend, codegen=JsonRuntime(build_engine=build_engine, version="onnx-check"), unavailable=None)


@pytest.mark.parametrize("name", [*CLASSIFIERS, "ssd_detector"])
def test_every_mac_goes_to_one_region_and_the_detector_keeps_only_nms(name):
    report = byoc.report(partition_for_tensorrt(small_module(name)))
    assert report.offload_ratio_macs == 1.0 and len(report.regions) == 1, report
    expected = {"relax.vision.all_class_non_max_suppression"} if name == "ssd_detector" else set()
    assert {op for host in report.host_ops for op in host.ops} == expected


def test_version_gates_and_their_reasons():
    mod = small_module("bert_encoder")
    assert not byoc.report(partition_for_tensorrt(mod, tensorrt_version="10.13")).host_ops
    older = byoc.report(partition_for_tensorrt(mod, tensorrt_version="8.5"))
    reasons = {reason for host in older.host_ops if host.ops == ["relax.nn.layer_norm"] for reason in host.reasons}
    assert any("LayerNormalization needs TensorRT 8.6" in r for r in reasons), older.host_ops
    with pytest.raises(PartitionError, match="too old"):
        partition_for_tensorrt(mod, tensorrt_version="8.4")
    with pytest.raises(PartitionError, match="not a version"):
        partition_for_tensorrt(mod, tensorrt_version="ten")


def test_small_regions_and_regions_without_macs_stay_on_the_host():
    mod = small_module("ssd_detector")
    assert len(byoc.report(partition_for_tensorrt(mod, min_block_size=10_000)).regions) == 0
    kept = byoc.report(partition_for_tensorrt(mod, remove_no_mac_subgraphs=False))
    assert kept.offload_ratio_macs == 1.0


@pytest.mark.parametrize("name", [*CLASSIFIERS, "ssd_detector", "bert_encoder"])
def test_onnx_given_to_the_parser_matches_the_model_in_fp32(name):
    model = small_model(name)
    compiled = byoc.build(partition_for_tensorrt(small_module(name)), backends={"tensorrt": _parser_input_through_onnxruntime()}, strict=True)
    assert compiled.report().backends == ["tensorrt"]
    for seed in range(2):
        inputs = byoc.models.sample_inputs(model, seed=seed)
        for got, want in zip(compiled.run(**inputs), onnxruntime_outputs(model, inputs)):
            assert FP32.elementwise_violation(got, want) is None, (name, FP32.elementwise_violation(got, want))


@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2"])
def test_onnx_given_to_the_parser_in_fp16_is_within_the_fp16_bound(name):
    model = small_model(name)
    partitioned = partition_for_tensorrt(small_module(name), fp16=True)
    compiled = byoc.build(partitioned, backends={"tensorrt": _parser_input_through_onnxruntime()}, strict=True)
    region = compiled.parts.artifacts[0]
    assert {spec.dtype for spec in region.inputs} == {"float32"}  # float16 lives inside the region only
    samples = [byoc.models.sample_inputs(model, seed=s) for s in range(4)]
    accuracy = measure_accuracy(compiled, model, samples)
    assert 0 < accuracy.relative_l2 <= FP16.relative_l2 and accuracy.top1_agreement >= FP16.top1, accuracy


def test_regions_record_what_the_engine_is_built_for():
    partitioned = partition_for_tensorrt(small_module("mlp"), fp16=True, tensorrt_version="10.13")
    region = next(f for g, f in partitioned.functions.items() if g.name_hint.startswith("tensorrt"))
    settings = trt_engine.TensorRTSettings.from_json("tensorrt", str(region.attrs["byoc.settings"]))
    assert settings == trt_engine.TensorRTSettings(fp16=True, tensorrt_version="10.13") and settings.version == (10, 13)
    # without a version, the one the backend resolved (installed, else 11.4) is recorded
    default = next(f for g, f in partition_for_tensorrt(small_module("mlp")).functions.items() if g.name_hint.startswith("tensorrt"))
    assert json.loads(str(default.attrs["byoc.settings"]))["values"]["tensorrt_version"] == byoc.get_backend("tensorrt").settings.tensorrt_version
    with pytest.raises(PartitionError, match="setting workspace_bytes=0 must be at least 1"):
        partition_for_tensorrt(small_module("mlp"), workspace_bytes=0)
    with pytest.raises(PartitionError, match="setting fp16='yes' must be bool"):
        partition_for_tensorrt(small_module("mlp"), fp16="yes")


def _region(model, **options):
    """The TensorRT region of an MLP as the artifact holds it, and the constants (engines are
    built on first use, so no TensorRT is needed)."""
    compiled = byoc.build(partition_for_tensorrt(byoc.from_onnx(model), **options),
                          backends={"tensorrt": _parser_input_through_onnxruntime()})
    (artifact,) = compiled.artifacts
    return artifact, compiled.store


def test_engine_cache_key_covers_weights_shapes_options_versions_and_the_gpu():
    a100 = {"tensorrt": "10.13.0", "gpu": "NVIDIA A100-SXM4-40GB", "compute_capability": "8.0", "cuda": "12.6",
            "platform": "Linux-x86_64"}

    def key(model=None, environment=a100, **options):
        artifact, store = _region(model if model is not None else small_model("mlp"), **options)
        settings = trt_engine.TensorRTSettings.from_record("tensorrt", artifact.settings)
        return engine_cache_key(artifact, store, settings, environment)

    base = key()
    assert key() == base  # the same region on the same machine always hits
    heavier = onnx.ModelProto()
    heavier.CopyFrom(small_model("mlp"))
    weights = heavier.graph.initializer[0]
    weights.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(weights) * 1.5, weights.name))
    others = {
        "other weights": key(heavier),
        "another batch size": key(byoc.models.get("mlp", small=True, batch=2)),
        "fp16": key(fp16=True),
        "another workspace": key(workspace_bytes=1 << 28),
        "TensorRT 10.13's op table": key(tensorrt_version="10.13"),
        "another TensorRT release": key(environment={**a100, "tensorrt": "10.13.2"}),
        "another GPU": key(environment={**a100, "gpu": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0"}),
        "another CUDA": key(environment={**a100, "cuda": "12.8"}),
    }
    assert base not in others.values(), [what for what, other in others.items() if other == base]
    assert len(set(others.values())) == len(others), sorted((v[:8], k) for k, v in others.items())


@pytest.mark.skipif(MISSING is None, reason="TensorRT and a CUDA device are here: the build runs")
def test_building_without_tensorrt_says_what_to_install():
    with pytest.raises(BuildError, match="tensorrt_0 \\(tensorrt\\) cannot be built on this machine") as error:
        byoc.build(partition_for_tensorrt(small_module("mlp")))
    assert "pip install" in str(error.value) or "CUDA device" in str(error.value)


@pytest.mark.skipif(MISSING is not None, reason=f"needs TensorRT and a CUDA device: {MISSING}")
@pytest.mark.parametrize("fp16", [False, True])
def test_engine_on_the_gpu_matches_onnxruntime(fp16, tmp_path):
    model = small_model("resnet50")
    compiled = byoc.build(partition_for_tensorrt(small_module("resnet50"), fp16=fp16), cache_dir=tmp_path, engines="eager")
    samples = [byoc.models.sample_inputs(model, seed=s) for s in range(4)]
    accuracy = measure_accuracy(compiled, model, samples)
    if fp16:
        assert accuracy.relative_l2 <= FP16.relative_l2, accuracy
    else:
        for sample in samples:
            for got, want in zip(compiled.run(**sample), onnxruntime_outputs(model, sample)):
                assert np.allclose(got, want, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(want).max())))


# ---------------------------------------------------------------- dynamic dimensions: one engine, an optimization profile
DIMS = {"batch": (1, 2, 4), "sequence": (1, 16, 32)}


def _dynamic_bert():
    from byoc.models.bert import bert_encoder

    return bert_encoder(layers=1, hidden=32, heads=2, intermediate=64, seq_len=32, vocab=50, dynamic=True)


def test_the_optimization_profile_spans_each_dimensions_range():
    graph = {"symbol": "tensorrt_0", "dims": {"batch": {"low": 1, "opt": 2, "high": 4}, "sequence": {"low": 1, "opt": 16, "high": 32}},
             "inputs": [{"shape": ["batch", "sequence"]}, {"shape": [1, "sequence", 32]}, {"shape": [8]},
                        {"shape": ["batch * sequence", 32]}]}
    assert trt_engine.profile_shapes(graph) == {
        "input0": ((1, 1), (2, 16), (4, 32)), "input1": ((1, 1, 32), (1, 16, 32), (1, 32, 32)),
        "input3": ((1, 32), (32, 32), (128, 32))}
    assert trt_engine.profile_shapes({**graph, "dims": {}}) == {}
    with pytest.raises(EngineError, match="sizes that grow with the dimensions"):
        trt_engine.profile_shapes({**graph, "inputs": [{"shape": ["sequence % 8", 32]}]})


@pytest.mark.parametrize("fp16", [False, True])
def test_a_dynamic_model_is_one_region_whose_onnx_runs_every_shape(fp16):
    """The symbolic ONNX TensorRT's parser is given, run through onnxruntime: one engine for
    every shape in range."""
    model = _dynamic_bert()
    partitioned = partition_for_tensorrt(byoc.from_onnx(model, dims=DIMS), fp16=fp16)
    compiled = byoc.build(partitioned, backends={"tensorrt": _parser_input_through_onnxruntime()})
    region = compiled.inspect()["shape_specialised"]["tensorrt_0"]
    assert region["symbolic"] and region["built_ahead"] == ["any_shape"]
    for shape in [(2, 16), (1, 1), (4, 32), (3, 7)]:
        sample = {"input_ids": np.random.default_rng(sum(shape)).integers(0, 50, shape).astype(np.int64)}
        got, want = compiled.run(**sample)[0], onnxruntime_outputs(model, sample)[0]
        if fp16:
            assert float(np.linalg.norm(got - want) / np.linalg.norm(want)) <= FP16.relative_l2
        else:
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    assert region["built_here"] == [] and compiled.inspect()["shape_specialised"]["tensorrt_0"]["built_here"] == []


@pytest.mark.skipif(MISSING is not None, reason=f"needs TensorRT and a CUDA device: {MISSING}")
def test_a_dynamic_model_gets_one_engine_on_the_gpu(tmp_path):
    model = _dynamic_bert()
    compiled = byoc.build(partition_for_tensorrt(byoc.from_onnx(model, dims=DIMS)), cache_dir=tmp_path, engines="embed")
    path = tmp_path / "bert.byoc"
    compiled.export(path)
    loaded = byoc.load(path, cache_dir=tmp_path)
    for runner in (compiled, loaded):
        assert runner.inspect()["shape_specialised"]["tensorrt_0"]["symbolic"]
        for shape in [(2, 16), (1, 1), (4, 32), (3, 7), (2, 16)]:
            sample = {"input_ids": np.random.default_rng(sum(shape)).integers(0, 50, shape).astype(np.int64)}
            got, want = runner.run(**sample)[0], onnxruntime_outputs(model, sample)[0]
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3 * max(1.0, float(np.abs(want).max())))
