"""The int8 accelerator vendors: the simulated Vitis-AI DPU and Arm Ethos-U through Vela.

Stated int8 error bound against the float32 model (onnxruntime) on seeded random inputs of the
calibration distribution: relative L2 error under 10%, and top-1 agreement of at least 75%.
"""

import hashlib
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

import byoc
from byoc import models as zoo
from byoc.accuracy import measure_accuracy
from byoc.errors import CustomFormatError, QuantizationError
from byoc.models.graph_builder import OnnxGraphBuilder
from byoc.runtime_metadata.build import region_functions
from byoc.vendors.ethos_u import ETHOS_U_PAYLOAD, partition_for_ethos_u
from byoc.vendors.vitis_ai import DPU_PROGRAM, partition_for_vitis_ai

from conftest import onnxruntime_outputs, small_model, small_module

INT8_RELATIVE_L2 = 0.10
INT8_TOP1 = 0.75
PARTITIONERS = {"vitis_ai": partition_for_vitis_ai, "ethos_u": partition_for_ethos_u}
# VGG-19 and the rest of the zoo go through both int8 vendors in `make matrix`; here two
# architectures (residual, depthwise-separable) keep the suite within its time.
MODELS = ["resnet18", "mobilenet_v2"]


def _calibration(name, count=8):
    return [zoo.sample_inputs(small_model(name), seed=s) for s in range(count)]


def _samples(name, count=4):
    return [zoo.sample_inputs(small_model(name), seed=1000 + s) for s in range(count)]


_RUNNER = """
import sys, numpy as np, byoc
directory, names = sys.argv[1], sys.argv[2:]
for name in names:
    model = byoc.load(f"{directory}/{name}.byoc")
    with np.load(f"{directory}/{name}.in.npz") as data:
        outputs = [model.run(**{k: data[f"{i}.{k}"] for k in ("input",)})[0] for i in range(4)]
    np.save(f"{directory}/{name}.out.npy", np.stack(outputs))
"""


@pytest.mark.parametrize("vendor", sorted(PARTITIONERS))
def test_models_run_from_artifacts_in_a_fresh_process_within_the_int8_bound(vendor, tmp_path):
    for name in MODELS:
        partitioned = PARTITIONERS[vendor](small_module(name), calibration=_calibration(name))
        report = byoc.report(partitioned)
        assert report.offload_ratio_macs == 1.0 and len(report.regions) == 1, report.to_table()
        compiled = byoc.build(partitioned, strict=True)
        compiled.export(tmp_path / f"{name}.byoc")
        samples = _samples(name)
        np.savez(tmp_path / f"{name}.in.npz", **{f"{i}.input": s["input"] for i, s in enumerate(samples)})
        accuracy = measure_accuracy(compiled, small_model(name), samples)
        assert accuracy.relative_l2 < INT8_RELATIVE_L2 and accuracy.top1_agreement >= INT8_TOP1, (name, accuracy)
    subprocess.run([sys.executable, "-c", _RUNNER, str(tmp_path), *MODELS], check=True, env=os.environ.copy())
    for name in MODELS:
        got = np.load(tmp_path / f"{name}.out.npy")
        want = np.stack([onnxruntime_outputs(small_model(name), s)[0] for s in _samples(name)])
        assert np.linalg.norm(got - want) / np.linalg.norm(want) < INT8_RELATIVE_L2, name
        assert np.mean(got.argmax(-1) == want.argmax(-1)) >= INT8_TOP1, name


@pytest.fixture(scope="module")
def mobilenet_regions():
    """(graph, constants, attrs) of the processed MLP region for each vendor."""
    from byoc.codegen_json import region_to_json
    from byoc.processing.passes import RegionContext, apply_passes
    from byoc.runtime_metadata.generate_regions import region_attrs

    regions = {}
    for vendor, partition in PARTITIONERS.items():
        partitioned = partition(small_module("mobilenet_v2"), calibration=_calibration("mobilenet_v2", 2))
        ((symbol, name, func),) = region_functions(partitioned)
        backend = byoc.get_backend(name)
        graph, constants = region_to_json(func, symbol, name)
        attrs = region_attrs(func)
        settings = type(backend.settings).from_json(name, attrs["byoc.settings"])
        graph, constants = apply_passes(backend.processing, graph, constants, RegionContext(symbol, name, attrs, settings))
        regions[vendor] = (graph, constants, settings)
    return regions


@pytest.mark.parametrize("vendor, fmt", [("vitis_ai", DPU_PROGRAM), ("ethos_u", ETHOS_U_PAYLOAD)])
def test_binary_is_deterministic_and_round_trips(vendor, fmt, mobilenet_regions):
    graph, constants, settings = mobilenet_regions[vendor]
    first, second = fmt.serialize(graph, constants, settings), fmt.serialize(graph, constants, settings)
    assert first == second  # same input, same bytes
    engine = fmt.deserialize(first, settings)
    x = zoo.sample_inputs(small_model("mobilenet_v2"), seed=3)["input"]
    out_a, out_b = np.empty((1, 1000), "float32"), np.empty((1, 1000), "float32")
    engine.run([x], [out_a])
    fmt.deserialize(bytes(first), settings).run([x], [out_b])
    np.testing.assert_array_equal(out_a, out_b)


def test_vela_command_streams_are_the_same_in_another_process(mobilenet_regions, tmp_path):
    graph, constants, settings = mobilenet_regions["ethos_u"]
    payload = ETHOS_U_PAYLOAD.serialize(graph, constants, settings)
    from byoc.vendors.ethos_u import payload as format_module

    _, header = format_module.decode(payload)
    here = hashlib.sha256(b"".join(s.tobytes() for s in header["command_streams"])).hexdigest()
    np.savez(tmp_path / "constants.npz", **constants)
    (tmp_path / "graph.json").write_text(__import__("json").dumps(graph))
    script = f"""
import json, hashlib, numpy as np
from byoc.vendors.ethos_u import ETHOS_U_PAYLOAD, EthosUSettings, payload
graph = json.load(open({str(tmp_path / 'graph.json')!r}))
constants = dict(np.load({str(tmp_path / 'constants.npz')!r}))
_, header = payload.decode(ETHOS_U_PAYLOAD.serialize(graph, constants, EthosUSettings(accelerator={settings.accelerator!r})))
print(hashlib.sha256(b"".join(s.tobytes() for s in header["command_streams"])).hexdigest())
"""
    there = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.strip()
    assert there == here
    assert len(header["command_streams"]) >= 1 and header["command_streams"][0].size > 100


def test_simulators_match_their_quantized_reference(mobilenet_regions):
    """Each vendor's int8 execution against the QDQ graph run in float by TVM: a few units in
    the last place, not more (the QDQ reference rounds float sums, the devices integer ones)."""
    from byoc.backend.arrays import aligned
    from byoc.codegen_json.tvm_engine import build_engine

    x = aligned(zoo.sample_inputs(small_model("mobilenet_v2"), seed=4)["input"])
    for vendor, fmt in (("vitis_ai", DPU_PROGRAM), ("ethos_u", ETHOS_U_PAYLOAD)):
        graph, constants, settings = mobilenet_regions[vendor]
        reference, device = np.empty((1, 1000), "float32"), np.empty((1, 1000), "float32")
        build_engine(graph, constants, {}).run([x], [reference])
        fmt.deserialize(fmt.serialize(graph, constants, settings), settings).run([x], [device])
        assert np.linalg.norm(device - reference) / np.linalg.norm(reference) < 0.03, vendor


def test_corrupt_blobs_are_refused():
    partitioned = partition_for_ethos_u(small_module("mlp"), calibration=_calibration("mlp", 2))
    compiled = byoc.build(partitioned)
    artifact = compiled.artifacts[0]
    region = compiled.regions[artifact.symbol]
    good = artifact.payload
    for damaged, message in [(good[: len(good) // 2], "truncated"), (good[:-3] + b"\x00\x01\x02", "checksum mismatch")]:
        artifact.payload = damaged
        region.record = None
        with pytest.raises(CustomFormatError, match=f"region ethos_u_0 \\(ethos_u\\).*{message}"):
            region.ensure_engine()


@pytest.mark.parametrize(
    "vendor, options, expected",
    [
        ("vitis_ai", {"dpu": "DPUCAHX8H"}, "built for accelerator configuration 'DPUCZDX8G-B4096'.*configured for 'DPUCAHX8H-B4096'"),
        ("ethos_u", {"accelerator": "ethos-u65-512"}, "built for accelerator configuration 'ethos-u55-256'.*configured for 'ethos-u65-512'"),
    ],
)
def test_blob_for_another_configuration_is_refused_at_load(vendor, options, expected, tmp_path):
    path = tmp_path / "mlp.byoc"
    byoc.build(PARTITIONERS[vendor](small_module("mlp"), calibration=_calibration("mlp", 2))).export(path)
    byoc.load(path, engines="eager").run(**zoo.sample_inputs(small_model("mlp")))  # its own configuration loads
    with pytest.raises(CustomFormatError, match=expected):
        byoc.load(path, engines="eager", backend_options={vendor: options})


@pytest.mark.parametrize("vendor, options", [("vitis_ai", {"dpu": "DPUCZDX8G-B1024"}), ("ethos_u", {"accelerator": "ethos-u55-32"})])
def test_an_artifact_made_before_regions_recorded_their_settings_loads(vendor, options, tmp_path):
    """Its regions record no settings: its blobs run for the configuration they were built for,
    and one named at load that differs is still refused."""
    path, old = tmp_path / "mlp.byoc", tmp_path / "old.byoc"
    compiled = byoc.build(PARTITIONERS[vendor](small_module("mlp"), calibration=_calibration("mlp", 2), **options))
    compiled.export(path)
    with zipfile.ZipFile(path) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    manifest = json.loads(files["manifest.json"])
    assert [r.pop("settings")["values"] for r in manifest["regions"]][0].items() >= options.items()
    with zipfile.ZipFile(old, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, json.dumps(manifest) if name == "manifest.json" else data)
    inputs = zoo.sample_inputs(small_model("mlp"))
    np.testing.assert_array_equal(byoc.load(old, engines="eager").run(**inputs)[0], compiled.run(**inputs)[0])
    other = {"dpu": "DPUCAHX8H"} if vendor == "vitis_ai" else {"accelerator": "ethos-u65-512"}
    with pytest.raises(CustomFormatError, match="built for accelerator configuration"):
        byoc.load(old, engines="eager", backend_options={vendor: other})


def test_ops_outside_the_limits_stay_on_the_host_with_the_limit():
    report = byoc.report(partition_for_vitis_ai(small_module("mobilenet_v2"), dpu="DPUCAHX8H", calibration=_calibration("mobilenet_v2", 1)))
    reasons = report.host_reasons()
    assert any("DPUCAHX8H has no depthwise convolution engine" in r for r in reasons["block0/depthwise/Conv"])
    g = OnnxGraphBuilder("strided", seed=0)
    x = g.input("input", [1, 4, 16, 16])
    g.output(g.relu(g.conv(x, 4, 8, 3, stride=4)))
    mod = byoc.from_onnx(g.build())
    ethos = byoc.report(byoc.partition_for(mod, "ethos_u"))
    assert ethos.regions == []
    assert "ethos_u: stride 4 is over 3" in ethos.host_reasons()["Conv"]


def test_calibration_is_required():
    for partition in PARTITIONERS.values():
        with pytest.raises(QuantizationError, match="quantizes at compile time and needs calibration data"):
            partition(small_module("mlp"))


def test_single_region_keeps_the_heaviest():
    calibration = _calibration("ssd_detector", 1)
    several = byoc.report(partition_for_vitis_ai(small_module("ssd_detector"), calibration=calibration))
    single = byoc.report(partition_for_vitis_ai(small_module("ssd_detector"), calibration=calibration, single_region=True))
    assert len(several.regions) > 1 and len(single.regions) == 1
    assert single.regions[0].macs == max(r.macs for r in several.regions)
    assert any("with the most MACs are kept (max_regions=1)" in r for reasons in single.host_reasons().values() for r in reasons)


def test_estimated_cycles_are_in_the_report():
    module = small_module("resnet18")
    calibration = _calibration("resnet18", 2)
    big = byoc.build(partition_for_vitis_ai(module, dpu="DPUCZDX8G-B4096", calibration=calibration)).report()
    small = byoc.build(partition_for_vitis_ai(module, dpu="DPUCZDX8G-B1024", calibration=calibration)).report()
    (estimate,) = big.estimates.values()
    assert estimate["target"] == "DPUCZDX8G-B4096" and "est. cycles" in big.to_table()
    assert next(iter(small.estimates.values()))["cycles"] > 3 * estimate["cycles"]  # a quarter of the MAC array
    ethos = byoc.build(partition_for_ethos_u(module, calibration=calibration)).report()
    (vela,) = ethos.estimates.values()
    assert vela["estimator"] == "Vela npu_performance" and vela["cycles"] > 0 and vela["sram_bytes"] > 0
    assert vela["macs"] >= 0.99 * ethos.regions[0].macs


def test_command_line_compiles_for_an_int8_target(tmp_path, capsys):
    from byoc.cli import main

    path = tmp_path / "r.byoc"
    assert main(["compile", "mlp", "--small", "--vendor", "vitis_ai", "--target", "DPUCZDX8G-B1024", "-o", str(path),
                 "--calibration-samples", "2", "--accuracy-samples", "2"]) == 0
    out = capsys.readouterr().out
    assert "DPUCZDX8G-B1024" in out and "relative L2" in out


def test_global_pooling_that_reads_the_region_input_is_nhwc():
    """A region that starts with global average pooling (its producer stayed on the host, as an
    unfolded batch norm does in DenseNet) pools over height and width, not channels and width."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {"s": rng.standard_normal((1, 16, 1, 1)), "w0": rng.standard_normal((16, 16, 3, 3)) * 0.2,
               "w": rng.standard_normal((10, 16, 1, 1)) * 0.2, "b": rng.standard_normal(10)}
    # the Mul reads a ReLU, not a Conv, so it is not folded into the weights and stays on the host
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c0"], ["r"]),
             helper.make_node("Mul", ["r", "s"], ["m"]), helper.make_node("GlobalAveragePool", ["m"], ["g"]),
             helper.make_node("Conv", ["g", "w", "b"], ["y"])]
    graph = helper.make_graph(nodes, "gap", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 7, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10, 1, 1])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    samples = [zoo.sample_inputs(model, seed=s) for s in range(4)]
    compiled = byoc.build(partition_for_ethos_u(byoc.from_onnx(model), calibration=samples), strict=True)
    assert any(r.nodes[0] == "GlobalAveragePool_3" for r in compiled.report().regions)  # unnamed: op and position
    assert measure_accuracy(compiled, model, samples).relative_l2 < 0.10


def test_integer_outputs_of_an_int8_build_are_compared_as_selections():
    from byoc.backend.tolerance import FP32, INT8

    want = np.array([[0, 0, 3], [0, 1, 7], [0, 2, 5]], dtype=np.int64)
    reordered = np.array([[0, 0, 3], [0, 2, 5], [0, 1, 9]], dtype=np.int64)  # a near tie went the other way
    assert FP32.elementwise_violation(reordered, want) == "4 of 9 values differ"
    assert INT8.elementwise_violation(reordered, want) is None
    assert INT8.elementwise_violation(want[0], want) == "rank 1, expected 2"

    class Runs:
        def run(self, **_):
            return [np.ones(4, np.float32), reordered]

    accuracy = measure_accuracy(Runs(), lambda _: [np.ones(4, np.float32), want], [{}])
    assert accuracy.selection_agreement == pytest.approx(2 / 4)  # two rows shared of four distinct
    assert "selections agree 50%" in accuracy.to_table()


def test_top1_reads_class_scores_left_as_batch_classes_1_1():
    scores = np.zeros((1, 5, 1, 1), np.float32)
    scores[0, 3] = 1.0
    swapped = np.zeros_like(scores)
    swapped[0, 1] = 1.0

    class Runs:
        def run(self, **_):
            return [swapped]

    assert measure_accuracy(Runs(), lambda _: [scores], [{}]).top1_agreement == 0.0
    assert measure_accuracy(Runs(), lambda _: [swapped], [{}]).top1_agreement == 1.0


@pytest.mark.parametrize("vendor", sorted(PARTITIONERS))
def test_dense_layers_over_a_sequence_compute_every_row(vendor):
    """A transformer's dense layers read (batch, tokens, features): each token's row is multiplied
    by the weights (the Ethos-U executor had flattened all rows into one and failed on BERT)."""
    builder = OnnxGraphBuilder("sequence_dense", seed=3)
    x = builder.input("x", [1, 8, 16])
    builder.output(builder.matmul(builder.relu(builder.matmul(x, 16, 24)), 24, 12))
    model = builder.build()
    samples = [zoo.sample_inputs(model, seed=s) for s in range(4)]
    mod = PARTITIONERS[vendor](byoc.from_onnx(model), calibration=samples)
    compiled = byoc.build(mod, strict=True)
    assert compiled.report().offload_ratio_macs == 1.0
    accuracy = measure_accuracy(compiled, model, samples)
    assert accuracy.relative_l2 < 0.10, accuracy
