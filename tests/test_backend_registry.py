import os
import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest

import byoc
from byoc.backend import registry
from byoc.codegen_json import JsonRuntime
from byoc.errors import BackendRegistrationError, UnknownBackendError
from byoc.vendors.reference import tvm_engine

from conftest import REPO


def _backend(name, **kwargs):
    return byoc.Backend(name=name, codegen="json", json_runtime=JsonRuntime(tvm_engine.build_engine, "t"), **kwargs)


def test_builtin_reference_backend_is_registered():
    assert "reference" in byoc.list_backends()
    assert byoc.get_backend("reference").codegen == "json"


def test_register_get_and_unregister():
    backend = _backend("reg_test")
    byoc.register_backend(backend)
    try:
        assert byoc.get_backend("reg_test") is backend
        byoc.register_backend(backend)  # the same object again is fine
        with pytest.raises(BackendRegistrationError, match="'reg_test' is registered twice"):
            byoc.register_backend(_backend("reg_test"), origin="a second plugin")
    finally:
        byoc.unregister_backend("reg_test")
    with pytest.raises(UnknownBackendError, match="unknown backend 'reg_test'; registered backends: .*reference"):
        byoc.get_backend("reg_test")


def test_backend_specs_are_validated():
    with pytest.raises(BackendRegistrationError, match="lower-case"):
        _backend("Bad-Name")
    with pytest.raises(BackendRegistrationError, match="codegen 'verilog'"):
        byoc.Backend(name="x", codegen="verilog")
    with pytest.raises(BackendRegistrationError, match="sets no c_library"):
        byoc.register_backend(byoc.Backend(name="no_lib", codegen="c"))
    backend = _backend("dup_pattern")
    backend.pattern("p", byoc.annotate.elementwise_chain("relax.nn.relu"))
    with pytest.raises(BackendRegistrationError, match="pattern 'p' twice"):
        backend.pattern("p", byoc.annotate.elementwise_chain("relax.nn.relu"))


def test_plugin_with_a_taken_name_is_refused():
    entry = EntryPoint("clash", "plugin_fixtures:clashing", registry.ENTRY_POINT_GROUP)
    with pytest.raises(BackendRegistrationError, match="'reference' is registered twice: by byoc \\(built-in\\) and by plugin 'clash'"):
        registry._load_plugin(entry)


def test_plugin_factory_and_broken_plugin():
    registry._load_plugin(EntryPoint("factory", "plugin_fixtures:factory", registry.ENTRY_POINT_GROUP))
    try:
        assert byoc.get_backend("made_by_factory").name == "made_by_factory"
    finally:
        byoc.unregister_backend("made_by_factory")
    with pytest.warns(UserWarning, match="could not load vendor plugin 'broken'.*this plugin is broken"):
        registry._load_plugin(EntryPoint("broken", "plugin_fixtures:broken", registry.ENTRY_POINT_GROUP))


def test_example_vendor_package_installs_and_runs(tmp_path):
    """The out-of-tree example is installed like any plugin and found through its entry point."""
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target", str(site),
         os.path.join(REPO, "examples", "byoc-acme-npu")],
        check=True,
    )
    script = """
import numpy as np, onnxruntime as ort, byoc
assert "acme_npu" in byoc.list_backends(), byoc.list_backends()
origin = byoc.backend.registry.backend_origin("acme_npu")
model = byoc.models.get("resnet18", small=True)
inputs = byoc.models.sample_inputs(model)
partitioned = byoc.partition_for(byoc.from_onnx(model), "acme_npu")
report = byoc.report(partitioned)
got = byoc.build(partitioned).run(**inputs)[0]
want = ort.InferenceSession(model.SerializeToString()).run(None, inputs)[0]
print(origin, len(report.regions), report.offload_ratio_macs, float(np.abs(got - want).max()))
"""
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    origin, regions, macs_ratio, error = result.stdout.split()[-4:]
    assert "byoc-acme-npu" in result.stdout and "plugin 'acme_npu'" in result.stdout
    assert int(regions) >= 1 and float(macs_ratio) > 0.9 and float(error) < 1e-3


def test_each_builtin_vendor_has_its_partition_function():
    from conftest import small_module

    mod = small_module("mlp")
    calibration = [byoc.models.sample_inputs(byoc.models.get("mlp", small=True), seed=0)]
    for name, partition in [
        ("reference", byoc.partition_for_reference),
        ("dnnl", byoc.partition_for_dnnl),
        ("onnxruntime", byoc.partition_for_onnxruntime),
        ("vitis_ai", lambda m: byoc.partition_for_vitis_ai(m, calibration=calibration)),
        ("ethos_u", lambda m: byoc.partition_for_ethos_u(m, calibration=calibration)),
    ]:
        report = byoc.report(partition(mod))
        assert report.backends == [name] and report.offload_ratio_macs == 1.0, name
