"""Artifacts run where only TVM's runtime is installed: `byoc deploy` writes the folder a target
takes, and the folder is run as the target would run it (its requirements alone on the path, no
TVM compiler anywhere), checked against onnxruntime on the same inputs."""

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import byoc
from byoc.cli import main
from byoc.codegen_cuda.compile import nvcc
from byoc.deploy import check, deploy
from byoc.deploy.sizes import full_install, tree_bytes
from byoc.errors import ByocError
from tests.conftest import small_model, small_module


def _onnxruntime(model, inputs):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {i.name: x for i, x in zip(session.get_inputs(), inputs)})


def _within_fp32(got, want):
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * float(np.abs(w).max()))


@pytest.mark.skipif("dnnl" not in byoc.list_backends(), reason="oneDNN is not installed (pip install 'byoc[dnnl]')")
def test_resnet18_on_dnnl_deployed_runs_with_tvms_runtime_alone_its_libraries_from_the_folder(tmp_path, capsys):
    artifact, folder = tmp_path / "resnet18.byoc", tmp_path / "deployed"
    byoc.build(byoc.partition_for(small_module("resnet18"), "dnnl")).export(artifact)
    assert main(["deploy", str(artifact), "-o", str(folder), "--no-check"]) == 0
    summary = capsys.readouterr().out
    assert "engines embedded for a run without the compiler: none needed" in summary
    assert not (folder / "runtime" / "tvm" / "lib" / "libtvm_compiler.so").exists()
    requirements = (folder / "requirements.txt").read_text()
    assert "numpy==" in requirements and "onednn" not in requirements and "apache-tvm==" not in requirements
    result = check(folder)
    assert not result.compiler_loaded and result.tvm.startswith(str(folder))
    assert "libdnnl.so.3" in result.carried_libraries
    assert result.max_difference == 0.0
    _within_fp32(result.outputs, _onnxruntime(small_model("resnet18"), result.inputs))
    # The folder (the artifact, TVM's runtime, byoc's runtime modules, oneDNN's libraries) is at
    # most a fifth of a full install.
    folder_bytes, full = tree_bytes(folder), full_install(["dnnl"])
    assert folder_bytes <= full / 5, (folder_bytes, full)


def test_onnxruntime_regions_are_embedded_for_a_run_without_the_compiler(tmp_path, capsys):
    artifact, folder = tmp_path / "mlp.byoc", tmp_path / "deployed"
    byoc.build(byoc.partition_for(small_module("mlp"), "onnxruntime")).export(artifact)
    assert main(["deploy", str(artifact), "-o", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "engines embedded for a run without the compiler: onnxruntime_0" in out
    assert "checked as a target runs it" in out and "outputs within 0.0e+00" in out
    result = check(folder)
    _within_fp32(result.outputs, _onnxruntime(small_model("mlp"), result.inputs))


def test_deploy_refuses_a_folder_that_is_not_empty(tmp_path):
    artifact = tmp_path / "mlp.byoc"
    byoc.build(byoc.partition_for(small_module("mlp"), "onnxruntime")).export(artifact)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "kept.txt").write_text("kept")
    with pytest.raises(ByocError, match="is not empty"):
        deploy(artifact, tmp_path / "full")
    assert (tmp_path / "full" / "kept.txt").read_text() == "kept"


def _runtime_only(code: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *argv], capture_output=True, text=True, timeout=300,
                          env={"TVM_USE_RUNTIME_LIB": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})


def test_without_the_compiler_an_artifact_that_needs_it_is_refused_at_load_naming_the_region(tmp_path):
    artifact = tmp_path / "mlp.byoc"
    byoc.build(byoc.partition_for(small_module("mlp"), "onnxruntime")).export(artifact)
    done = _runtime_only("""
        import sys
        import byoc
        from byoc.errors import ArtifactError
        try:
            byoc.load(sys.argv[1])
        except ArtifactError as error:
            print("refused:", error)
        print("relax imported:", "tvm.relax" in sys.modules)
    """, str(artifact))
    assert done.returncode == 0, done.stderr
    assert "cannot run without byoc's compiler: region onnxruntime_0 (onnxruntime): its engine is built from the region's code" \
        in done.stdout
    assert "relax imported: False" in done.stdout


def test_import_byoc_and_load_need_no_compiler(tmp_path):
    artifact = tmp_path / "mlp.byoc"
    byoc.build(byoc.partition_for(small_module("mlp"), "reference"), engines="embed").export(artifact)
    done = _runtime_only("""
        import sys
        import numpy as np
        import byoc
        model = byoc.load(sys.argv[1])
        print(model.run(np.zeros(model.parts.inputs[0].shape, "float32"))[0].shape)
        print("relax imported:", "tvm.relax" in sys.modules)
    """, str(artifact))
    assert done.returncode == 0, done.stderr
    assert "relax imported: False" in done.stdout


@pytest.mark.parametrize("vendor", ["vitis_ai", "ethos_u"])
def test_custom_format_regions_run_without_the_compiler_or_the_vendors_build_tools(tmp_path, vendor):
    """A DPU program runs on its simulator, an Ethos-U payload on its executor: neither needs
    TVM's compiler, nor Vela (which is made unimportable here), at load or run."""
    if vendor == "ethos_u" and "ethos_u" not in byoc.list_backends():
        pytest.skip("Vela is not installed (pip install 'byoc[ethos_u]')")
    from byoc import models as zoo

    model = small_model("mlp")
    calibration = [list(zoo.sample_inputs(model, seed=seed).values()) for seed in range(2)]
    compiled = byoc.build(byoc.partition_for(small_module("mlp"), vendor, calibration=calibration))
    artifact = tmp_path / f"{vendor}.byoc"
    compiled.export(artifact)
    inputs = list(zoo.sample_inputs(model, seed=5).values())
    np.save(tmp_path / "x.npy", inputs[0])
    done = _runtime_only("""
        import sys
        import numpy as np
        sys.modules["ethosu"] = None
        import byoc
        model = byoc.load(sys.argv[1])
        np.save(sys.argv[3], model.run(np.load(sys.argv[2]))[0])
        print("relax imported:", "tvm.relax" in sys.modules)
    """, str(artifact), str(tmp_path / "x.npy"), str(tmp_path / "y.npy"))
    assert done.returncode == 0, done.stderr
    assert "relax imported: False" in done.stdout
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), compiled.run(*inputs)[0])


@pytest.mark.skipif(nvcc() is None, reason="nvcc is not installed")
def test_a_gpu_model_built_without_a_gpu_is_deployed_for_the_target_to_run(tmp_path, capsys):
    """Built here, where there is no GPU, the model is deployed loaded but not run, and its
    requirements name the libraries its regions open on the target."""
    from byoc.codegen_cuda.engine import device_missing

    if device_missing() is None:
        pytest.skip("this machine has a CUDA device: the deployment runs and is checked as any other")
    artifact, folder = tmp_path / "mlp.byoc", tmp_path / "deployed"
    with pytest.warns(UserWarning, match="its code is built, but not run or checked here"):
        byoc.build(byoc.partition_for(small_module("mlp"), "cuda")).export(artifact)
    assert main(["deploy", str(artifact), "-o", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "cuda's regions were loaded, not run, here" in out and "not checked here" in out
    assert (folder / "requirements.txt").read_text().endswith("nvidia-cublas\nnvidia-cudnn-cu13\n")
    assert (folder / "runtime" / "byoc" / "codegen_cuda" / "engine.py").exists()
