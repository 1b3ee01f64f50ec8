import os
import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest

import byoc
from byoc.annotate import elementwise_chain, fused_pattern
from byoc.backend import registry
from byoc.codegen_c import CLibrary
from byoc.codegen_json import JsonRuntime, tvm_engine
from byoc.errors import BackendRegistrationError, UnknownBackendError

from conftest import REPO


def _backend(name, **kwargs):
    return byoc.Backend(name=name, codegen=JsonRuntime(tvm_engine.build_engine, "t"), **kwargs)


def test_builtin_reference_backend_is_registered():
    assert "reference" in byoc.list_backends()
    assert byoc.get_backend("reference").codegen.kind == "json"


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
    with pytest.raises(BackendRegistrationError, match="codegen must be a code format object .*not 'json'"):
        byoc.Backend(name="x", codegen="json")
    with pytest.raises(BackendRegistrationError, match="sets no codegen"):
        byoc.register_backend(byoc.Backend(name="no_lib"))
    with pytest.raises(BackendRegistrationError, match="emitters are for a CLibrary codegen"):
        _backend("emits").supports("relax.add", emit=lambda call: None)
    backend = _backend("dup_pattern")
    backend.pattern("p", elementwise_chain("relax.nn.relu"))
    with pytest.raises(BackendRegistrationError, match="pattern 'p' twice"):
        backend.pattern("p", elementwise_chain("relax.nn.relu"))


def test_a_c_vendor_claims_nothing_it_has_no_emitter_for():
    """Registration refuses a C vendor's claim that code generation could not write."""
    def emitter(call):
        raise AssertionError("not called at registration")

    def c_backend(name):
        library = CLibrary(name="loops", version="1", emitters={"relax.nn.conv2d": emitter, "relax.nn.relu": emitter})
        return byoc.Backend(name=name, codegen=library)

    fine = c_backend("c_fine")
    fine.supports("relax.nn.relu")
    fine.pattern("conv_relu", *fused_pattern("relax.nn.conv2d", activation="relax.nn.relu"))  # conv2d's emitter writes it
    fine.supports("relax.add", emit=emitter)
    byoc.register_backend(fine)
    byoc.unregister_backend("c_fine")

    unwritten = c_backend("c_ops")
    unwritten.supports("relax.nn.relu", "relax.sigmoid")
    unwritten.pattern("matmul_relu", *fused_pattern("relax.matmul", activation="relax.nn.relu"))
    with pytest.raises(BackendRegistrationError, match="backend 'c_ops' claims pattern 'matmul_relu', op relax.sigmoid with no C "
                                                       "emitter to write it: give each its emitter where it is declared"):
        byoc.register_backend(unwritten)
    assert "c_ops" not in byoc.list_backends()


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


def test_example_vendor_package_installs_and_runs_the_vendor_kit(tmp_path):
    """The out-of-tree example is installed like any plugin, found through its entry point, and
    passes byoc's vendor test kit in its own tests."""
    site = tmp_path / "site"
    example = os.path.join(REPO, "examples", "byoc-acme-npu")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target", str(site), example],
                   check=True)
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", example,
                             os.path.join(example, "tests")], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    summary = result.stdout
    assert "acme_npu      resnet18" in summary and "FAIL" not in summary, summary[-3000:]
    assert "acme_npu: " in summary and "0 other failure(s)" in summary, summary[-3000:]


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
