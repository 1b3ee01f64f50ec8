import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import byoc
from byoc.cli import main
from byoc.errors import InputError
from byoc.models import exported


def test_models_lists_the_zoo_and_the_exported_architectures(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "resnet50" in out and "ssd_detector" in out
    assert "hf:bert" in out and "hf:swin" in out and "hf:NAME:SIZE" in out


def test_a_model_name_that_is_not_one_suggests_the_closest(capsys):
    assert main(["partition", "resnet5", "--vendor", "reference"]) != 0
    err = capsys.readouterr().err
    assert "did you mean 'resnet50'" in err and "hf:NAME[:SIZE]" in err


def test_partition_prints_a_report_and_draws(tmp_path, capsys):
    svg, dot = tmp_path / "g.svg", tmp_path / "g.dot"
    assert main(["partition", "bert_encoder", "--small", "--vendor", "reference", "--svg", str(svg), "--dot", str(dot)]) == 0
    out = capsys.readouterr().out
    assert "offload ratio:" in out and "embeddings/Gather" in out
    assert svg.read_text().startswith("<svg") and dot.read_text().startswith("digraph")


def test_partition_json_and_options(capsys):
    assert main(["partition", "mlp", "--small", "--vendor", "reference", "--json", "--max-ops", "2"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert all(r["num_ops"] <= 2 for r in data["regions"]) and len(data["regions"]) > 1


def test_partition_at_int8_precision(capsys):
    assert main(["partition", "resnet18", "--small", "--vendor", "dnnl", "--precision", "int8", "--calibration", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (region,) = data["regions"]
    assert any(pattern.startswith("dnnl.qconv2d") for pattern in region["patterns"]), region["patterns"]
    # a budget with another precision than auto: a clear error, no traceback
    assert main(["partition", "mlp", "--small", "--vendor", "dnnl", "--precision", "int8", "--max-rel-l2", "0.01"]) != 0
    assert "max_rel_l2 is the error budget of precision='auto'" in capsys.readouterr().err


def test_partition_of_an_onnx_file(tmp_path, capsys):
    import onnx

    from byoc import models

    path = tmp_path / "mlp.onnx"
    onnx.save(models.get("mlp", small=True), path)
    assert main(["partition", str(path), "--vendor", "reference"]) == 0
    assert "mlp.onnx" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["partition", "mlp", "--vendor", "nope"], "unknown backend 'nope'; registered backends:"),
        (["partition", "alexnet", "--vendor", "reference"], "neither an ONNX file nor a zoo model"),
        (["partition", "/no/such/model.onnx", "--vendor", "reference"], "no such file"),
    ],
)
def test_errors_name_what_was_wrong(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["partition", "mlp", "--vendor", "reference", "--min-ops", "-5"], "argument --min-ops: must be at least 0, got -5"),
        (["partition", "mlp", "--vendor", "reference", "--max-ops", "two"], "argument --max-ops: expected a whole number, got 'two'"),
        (["partition", "mlp", "--vendor", "dnnl", "--placement", "auto", "--budget-s", "-3"], "argument --budget-s: must be at least 0, got -3"),
        (["demo", "--repeat", "0"], "argument --repeat: must be at least 1, got 0"),
        (["run", "model.byoc", "--profile", "--repeat", "0"], "argument --repeat: must be at least 1, got 0"),
        (["compile", "mlp", "--vendor", "reference", "-o", "m.byoc", "--accuracy-samples", "-2"], "must be at least 0, got -2"),
        (["bench", "--rounds", "0"], "argument --rounds: must be at least 1, got 0"),
        (["run", "model.byoc", "--shape-memory", "lots"], "argument --shape-memory: expected a size in bytes (e.g. 268435456, 256M, 1G)"),
        (["compile", "mlp", "--vendor", "dnnl", "-o", "m.byoc", "--shape-memory", "0"], "must be at least 1 byte, got '0'"),
    ],
)
def test_counts_and_budgets_out_of_range_are_usage_errors(argv, message, capsys):
    """Before, a count of 0 ran into a traceback (an IndexError in `demo`, a ValueError from
    profiling) or was taken as it was (a negative placement budget measured nothing)."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_console_script_entry_point():
    result = subprocess.run([sys.executable, "-m", "byoc", "models"], capture_output=True, text=True, check=True)
    assert "mlp" in result.stdout


def test_matrix_writes_the_vendor_table(tmp_path):
    env = {**__import__("os").environ, "OMP_NUM_THREADS": "2", "TVM_NUM_THREADS": "2"}
    markdown, data = tmp_path / "matrix.md", tmp_path / "matrix.json"
    result = subprocess.run([sys.executable, "-m", "byoc.testing.matrix", "--vendors", "reference", "vitis_ai", "--models", "mlp",
                             "--threads", "2", "--rounds", "2", "--int8-samples", "4", "--calibration", "2",
                             "--markdown", str(markdown), "--json", str(data)], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "matrix [" in result.stderr  # progress
    rows = json.loads(data.read_text())["rows"]
    assert [(r["vendor"], r["model"], r["passed"]) for r in rows] == [("reference", "mlp", True), ("vitis_ai", "mlp", True)]
    assert rows[0]["onnxruntime_ms"] > 0 and rows[1]["estimated_ms"] is not None and rows[1]["sqnr_db"] > 20
    text = markdown.read_text()
    assert "## vitis_ai" in text and "| mlp | 88.9% | 100.0% | 1 | nn.softmax |" in text


def test_bench_compares_with_the_references_and_breaks_slower_systems_down(tmp_path):
    data = tmp_path / "bench.json"
    result = subprocess.run([sys.executable, "-m", "byoc", "bench", "--models", "mlp", "--skip-tvm", "--rounds", "4", "--threads", "1",
                             "--json", str(data)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    (model,) = json.loads(data.read_text())["results"]
    systems = {s["system"]: s for s in model["systems"]}
    assert {"onnxruntime", "byoc + dnnl", "byoc + onnxruntime"} <= set(systems)
    assert all(s["median_ms"] > 0 and s["max_abs_error"] < 1e-3 for s in systems.values())
    best = min(systems[r]["median_ms"] for r in ("onnxruntime", "openvino") if r in systems)
    slower = {name for name, s in systems.items() if name.startswith("byoc") and s["median_ms"] > best}
    assert set(model["breakdowns"]) == slower
    for name in slower:
        assert f"mlp, {name}: slower than the fastest reference" in result.stdout
    if "openvino" not in systems:
        assert "pip install 'byoc[bench]'" in result.stdout


def test_bench_refuses_an_unknown_model():
    result = subprocess.run([sys.executable, "-m", "byoc", "bench", "--models", "alexnet", "--threads", "1"], capture_output=True, text=True)
    assert result.returncode == 2 and "unknown zoo model 'alexnet'" in result.stderr


@pytest.mark.parametrize("command, name, suggestion", [(["byoc.testing.matrix"], "mobilenetv2", "mobilenet_v2"),
                                                        (["byoc.testing.matrix"], "vision:ssdlite32", "ssdlite320"),
                                                        (["byoc", "bench"], "hf:bertt", "bert")])
def test_a_misspelt_model_gets_the_closest_name_and_no_traceback(command, name, suggestion):
    result = subprocess.run([sys.executable, "-m", *command, "--models", name, "--threads", "1"], capture_output=True, text=True)
    assert result.returncode == 2 and f"(did you mean '{suggestion}'?)" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_the_vision_suite_says_what_it_needs_where_it_is_not_installed():
    from byoc.models import vision

    if vision.available() is None:
        pytest.skip("torchvision is installed here")
    result = subprocess.run([sys.executable, "-m", "byoc.testing.matrix", "--models", "vision", "--threads", "1"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "the vision suite:" in result.stderr and "torchvision==0.28.0" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_node_case_rates_are_the_same_in_several_processes():
    from byoc.testing.matrix import node_case_rates

    pattern = "^test_(relu|max_int64|softmax_axis_0)$"
    alone = node_case_rates(["onnxruntime", "dnnl"], pattern)
    shared = node_case_rates(["onnxruntime", "dnnl"], pattern, jobs=2)
    assert alone == shared and [r.handled - r.not_taken for r in alone[0]] == [3, 2]


def test_a_dynamic_file_compiles_with_shapes_and_checks_its_accuracy(tmp_path, capsys):
    """A file with dynamic axes compiles as it is, its named dimensions kept dynamic; `--shapes`
    fixes them; the accuracy check runs on any file, also one whose input names the importer
    renames (`input.1`)."""
    x = helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["batch", 8])
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], np.linspace(-1, 1, 32, dtype=np.float32))
    nodes = [helper.make_node("MatMul", ["input.1", "w"], ["m"], name="m"), helper.make_node("Relu", ["m"], ["y"], name="y")]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])], [w])
    path = tmp_path / "dynamic.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    artifact = str(tmp_path / "dynamic.byoc")
    assert main(["compile", str(path), "--vendor", "onnxruntime", "-o", artifact]) == 0
    capsys.readouterr()
    model = byoc.load(artifact)
    for batch in (1, 5, 64):
        x = np.linspace(-1, 1, batch * 8, dtype=np.float32).reshape(batch, 8)
        np.testing.assert_allclose(model.run(x)[0], np.maximum(x @ np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4), 0),
                                   rtol=1e-5, atol=1e-6)
    assert main(["compile", str(path), "--vendor", "onnxruntime", "-o", artifact, "--shapes", "input.1=3x8",
                 "--accuracy-samples", "2"]) == 0
    assert "relative L2 0.00%" in capsys.readouterr().out
    assert main(["run", artifact]) == 0
    assert "output 0 (y): shape (3, 4) float32" in capsys.readouterr().out
    assert main(["partition", str(path), "--vendor", "dnnl", "--shapes", "input.1=3x9"]) == 2
    assert "dim 1 is 8 in the model, not 9" in capsys.readouterr().err


def test_run_generates_the_inputs_left_out_in_the_shape_the_given_ones_fix(tmp_path, capsys):
    """`byoc run` with one input of a dynamic artifact given: the other is generated with the
    dimensions the given file fixes, not at the range's top (which made a mismatch error)."""
    x, mask = (helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "sequence"]) for n in ("x", "mask"))
    graph = helper.make_graph([helper.make_node("Mul", ["x", "mask"], ["y"], name="y")], "g", [x, mask],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence"])])
    path, artifact, given = tmp_path / "two.onnx", str(tmp_path / "two.byoc"), tmp_path / "x.npy"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert main(["compile", str(path), "--vendor", "onnxruntime", "--dims", "batch=1:4", "sequence=1:16", "-o", artifact]) == 0
    np.save(given, np.ones((2, 5), np.float32))
    capsys.readouterr()
    assert main(["run", artifact, "--input", f"x={given}"]) == 0
    assert "output 0 (y): shape (2, 5) float32" in capsys.readouterr().out
    assert main(["run", artifact]) == 0
    assert "output 0 (y): shape (4, 16) float32" in capsys.readouterr().out


def test_an_input_the_model_never_reads_is_taken_by_name_and_ignored(tmp_path, capsys):
    """As onnxruntime takes it: serving code feeds every input the file declares."""
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("x", "token_type_ids")]
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="y")], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path, artifact, given = tmp_path / "unused.onnx", str(tmp_path / "unused.byoc"), tmp_path / "t.npy"
    onnx.save(model, path)
    x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
    feeds = {"x": x, "token_type_ids": np.zeros((2, 3), np.float32)}
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(path), "dnnl"))
    assert [s.name for s in compiled.inputs] == ["x"]
    for model_run in (compiled, _reloaded(compiled, tmp_path)):
        np.testing.assert_array_equal(model_run.run(**feeds)[0], np.maximum(x, 0))
        with pytest.raises(InputError, match="unknown input\\(s\\) \\['z'\\]"):
            model_run.run(x=x, z=x)
    assert main(["compile", str(path), "--vendor", "onnxruntime", "-o", artifact]) == 0
    np.save(given, feeds["token_type_ids"])
    capsys.readouterr()
    assert main(["run", artifact, "--input", f"token_type_ids={given}"]) == 0
    assert main(["inspect", artifact]) == 0
    assert "declared, never read (taken by name and ignored): token_type_ids" in capsys.readouterr().out


def _reloaded(compiled, tmp_path):
    compiled.export(tmp_path / "exported.byoc")
    return byoc.load(tmp_path / "exported.byoc")


def test_run_reads_bfloat16_inputs_that_numpy_saved_as_raw_bytes(tmp_path, capsys):
    """`np.save` writes an ml_dtypes bfloat16 array as |V2; `byoc run` reads it as the bfloat16
    input it is."""
    import ml_dtypes

    x = helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), tmp_path / "up.onnx")
    data = np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16)
    np.save(tmp_path / "x.npy", data)
    artifact = str(tmp_path / "up.byoc")
    assert main(["compile", str(tmp_path / "up.onnx"), "--vendor", "dnnl", "-o", artifact]) == 0
    assert main(["run", artifact, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "out")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "output0.npy"), data.astype(np.float32))


@pytest.mark.skipif(exported.available() is not None, reason=exported.available() or "")
def test_an_exported_architecture_with_dims_is_exported_with_dynamic_axes(tmp_path, capsys):
    """`hf:NAME` was exported with static shapes only, so `--dims batch=...` was refused: the
    model had no dynamic dimension to name."""
    artifact = str(tmp_path / "bert.byoc")
    assert main(["compile", "hf:bert", "--vendor", "dnnl", "--dims", "batch=1:4", "sequence=1:64", "-o", artifact]) == 0
    assert "one build for every shape" in capsys.readouterr().out
    ids = tmp_path / "ids.npy"
    np.save(ids, np.ones((2, 9), np.int64))
    assert main(["run", artifact, "--input", f"input_ids={ids}", "--input", f"attention_mask={ids}"]) == 0
    assert "shape (2, 9, 128)" in capsys.readouterr().out


def _dense_with_dynamic_axes() -> onnx.ModelProto:
    """A dense layer and ReLU over [batch, sequence, 16], as exporters write dynamic axes."""
    rng = np.random.default_rng(0)
    weight = onnx.numpy_helper.from_array(rng.standard_normal((16, 24)).astype("float32") * 0.3, "w")
    bias = onnx.numpy_helper.from_array(rng.standard_normal((24,)).astype("float32"), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["z"]),
             helper.make_node("Relu", ["z"], ["y"])]
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", 24])], [weight, bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("vendor", ["dnnl", "onnxruntime"])
def test_a_dynamic_export_compiles_with_no_shape_option_and_runs_three_shapes(vendor, tmp_path):
    """`byoc compile model.onnx -o m.byoc` on a file with dynamic axes, as it is: no --dims, no
    --shapes; the artifact runs shapes it was never told of, right against onnxruntime."""
    import onnxruntime as ort

    model = _dense_with_dynamic_axes()
    onnx.save(model, tmp_path / "model.onnx")
    assert main(["compile", str(tmp_path / "model.onnx"), "--vendor", vendor, "-o", str(tmp_path / "m.byoc")]) == 0
    compiled = byoc.load(tmp_path / "m.byoc")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch, sequence in ((1, 1), (2, 7), (5, 33)):
        x = np.random.default_rng(batch).standard_normal((batch, sequence, 16)).astype("float32")
        np.testing.assert_allclose(compiled.run(x)[0], session.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
