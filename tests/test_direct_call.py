"""A model that is one region called with its inputs runs without the virtual machine (an engine
region, or C in the host library): the same outputs as through the VM, in the model's order,
kept across export and load, and checked there."""

import json
import zipfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import byoc
from byoc.errors import ArtifactError, EngineError
from byoc.runtime_metadata.artifact_types import DirectCall

from conftest import small_module

RNG = np.random.default_rng(7)


def _two_outputs(rows: int | str = 2) -> onnx.ModelProto:
    """Two inputs, two outputs listed in another order than the ops that make them."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 3])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"], name="m"), helper.make_node("Add", ["m", "y"], ["s"], name="s"),
             helper.make_node("Mul", ["m", "y"], ["p"], name="p")]
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 3], RNG.standard_normal(9).astype(np.float32))
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [rows, 3]) for name in ("p", "s")]
    return helper.make_model(helper.make_graph(nodes, "two", [x, y], outputs, [w]), opset_imports=[helper.make_opsetid("", 17)])


def _through_vm(compiled, *inputs):
    direct, compiled.parts.direct_call = compiled.parts.direct_call, None
    try:
        return compiled.run(*inputs)
    finally:
        compiled.parts.direct_call = direct


def test_a_whole_model_region_runs_directly_with_the_outputs_in_the_models_order(tmp_path):
    model = _two_outputs()
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), "onnxruntime"))
    assert compiled.parts.direct_call is not None and compiled.parts.direct_call.symbol == "onnxruntime_0"
    x, y = RNG.standard_normal((2, 3)).astype(np.float32), RNG.standard_normal((2, 3)).astype(np.float32)
    got = compiled.run(x, y)
    assert not compiled._vms.made()  # no virtual machine was made
    want = _through_vm(compiled, x, y)
    assert [g.shape for g in got] == [(2, 3), (2, 3)]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)
    m = x @ onnx.numpy_helper.to_array(model.graph.initializer[0])
    np.testing.assert_allclose(got[0], m * y, rtol=1e-5)  # "p" is the model's first output
    np.testing.assert_allclose(got[1], m + y, rtol=1e-5)
    # Outputs are the caller's: a second run does not change the first's.
    first = got[0].copy()
    compiled.run(y, x)
    np.testing.assert_array_equal(got[0], first)

    path = tmp_path / "two.byoc"
    compiled.export(path)
    loaded = byoc.load(path)
    assert loaded.parts.direct_call == compiled.parts.direct_call
    for a, b in zip(loaded.run(x, y), got):
        np.testing.assert_array_equal(a, b)


def test_a_model_that_is_one_c_region_calls_it_in_the_host_library(tmp_path):
    compiled = byoc.build(byoc.partition_for(small_module("mlp"), "dnnl"))
    assert compiled.parts.direct_call == DirectCall("dnnl_0", (0,), (0,))
    x = RNG.standard_normal((1, 64)).astype(np.float32)
    got = compiled.run(x)
    assert not compiled._vms.made()
    np.testing.assert_array_equal(got[0], _through_vm(compiled, x)[0])
    path = tmp_path / "mlp.byoc"
    compiled.export(path)
    np.testing.assert_array_equal(byoc.load(path).run(x)[0], got[0])


@pytest.mark.parametrize("vendor", ["onnxruntime", "dnnl"])
def test_a_dynamic_model_that_is_one_region_runs_directly_at_every_shape(vendor, tmp_path):
    """One region with symbolic shapes (onnxruntime) or generated per shape (dnnl's C): the
    region, or its variant for the shape, is called without the VM, at a shape built ahead and
    at one built on first use, also from the exported artifact."""
    model = _two_outputs("batch")
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model, dims={"batch": (1, 2, 8)}), vendor))
    assert compiled.parts.direct_call is not None
    weight = onnx.numpy_helper.to_array(model.graph.initializer[0])
    path = tmp_path / "two.byoc"
    compiled.export(path)
    loaded = byoc.load(path)
    assert loaded.parts.direct_call == compiled.parts.direct_call
    for runner in (compiled, loaded):
        for rows in (2, 5, 2):
            x, y = RNG.standard_normal((rows, 3)).astype(np.float32), RNG.standard_normal((rows, 3)).astype(np.float32)
            got = runner.run(x, y)
            np.testing.assert_allclose(got[0], (x @ weight) * y, rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(got[1], (x @ weight) + y, rtol=1e-5, atol=1e-6)
        assert not runner._vms.made()  # no virtual machine ran the model


def test_a_model_with_host_work_runs_through_the_vm():
    detector = byoc.build(byoc.partition_for(small_module("ssd_detector"), "onnxruntime"))
    assert detector.parts.direct_call is None  # NonMaxSuppression stays on the host


def test_a_direct_call_that_does_not_fit_the_model_is_refused_at_load(tmp_path):
    compiled = byoc.build(byoc.partition_for(small_module("mlp"), "onnxruntime"))
    path = tmp_path / "mlp.byoc"
    compiled.export(path)
    with zipfile.ZipFile(path) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    manifest = json.loads(files["manifest.json"])
    for wrong, message in [({"symbol": "onnxruntime_7", "inputs": [0], "outputs": [0]}, "not a region of the model"),
                           ({"symbol": "onnxruntime_0", "inputs": [3], "outputs": [0]}, "does not match the model's inputs")]:
        manifest["direct_call"] = wrong
        bad = tmp_path / "bad.byoc"
        with zipfile.ZipFile(bad, "w") as archive:
            for name, data in files.items():
                archive.writestr(name, json.dumps(manifest) if name == "manifest.json" else data)
        with pytest.raises(ArtifactError, match=message):
            byoc.load(bad)


def test_an_engine_failure_on_the_direct_path_names_the_region():
    class Failing:
        def run(self, inputs, outputs):
            raise ZeroDivisionError("no")

    from byoc.codegen_json import JsonRuntime

    vendor = byoc.Backend(name="failing_direct", codegen=JsonRuntime(build_engine=lambda g, c, o: Failing(), version="1"))
    vendor.supports("relax.matmul", "relax.add", "relax.nn.relu", "relax.nn.softmax")
    byoc.register_backend(vendor, override=True)
    try:
        compiled = byoc.build(byoc.partition_for(small_module("mlp"), "failing_direct", min_ops_per_region=1), engines="lazy")
        assert compiled.parts.direct_call == DirectCall("failing_direct_0", (0,), (0,))
        with pytest.raises(EngineError, match=r"region failing_direct_0 \(failing_direct\): the engine failed: ZeroDivisionError: no"):
            compiled.run(np.zeros((1, 64), np.float32))
    finally:
        byoc.unregister_backend("failing_direct")
