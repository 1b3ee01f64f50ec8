"""transformers architectures exported with torch.onnx (byoc.models.exported): the files users
bring, through byoc + dnnl against onnxruntime on the same file."""

from __future__ import annotations

import sys

import numpy as np
import onnx
import pytest

import byoc
from byoc import models as zoo
from byoc.benchmarking.models import check_model
from byoc.errors import DynamicShapeError, UnknownModelError
from byoc.models import exported
from byoc.runtime_metadata.artifact_types import DEFAULT_MAX_SHAPES

from conftest import assert_fp32_close, onednn_executions, onnxruntime_outputs

needs_torch = pytest.mark.skipif(exported.available() is not None, reason=exported.available() or "")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("exported")


def test_the_suite_comes_first_and_unknown_names_are_listed():
    assert exported.names()[: len(exported.SUITE)] == list(exported.SUITE)
    with pytest.raises(UnknownModelError, match="bert, gpt2, vit, convnext, whisper_encoder, t5_encoder"):
        exported.export("alexnet")


def test_a_missing_extra_names_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import onnxscript now raises ImportError
    assert "onnxscript" in exported.available() and "byoc[torch]" in exported.available()
    with pytest.raises(exported.MissingExtraError, match=r"pip install -e '\.\[torch\]'"):
        exported.path("bert", cache_dir=tmp_path)


@needs_torch
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_an_export_is_quiet_and_cached(name, cache, capfd, monkeypatch):
    first = exported.path(name, cache_dir=cache)
    said = capfd.readouterr()
    assert said.out == "" and said.err.count("\n") == 1, said  # torch's chatter is silenced
    assert said.err.startswith(f"exporting {name} (tiny, static) ...") and said.err.rstrip().endswith(" s")
    data = first.read_bytes()

    def no_second_export(*args, **kwargs):
        raise AssertionError("exported again")

    monkeypatch.setattr(exported, "_export", no_second_export)
    assert exported.path(name, cache_dir=cache) == first and first.read_bytes() == data
    assert [p.name for p in cache.iterdir() if p.name.startswith(f".{name}")] == []  # no temporary file left behind
    assert onnx.load(first).ir_version <= exported.MAX_IR_VERSION


@needs_torch
@pytest.mark.parametrize("name", ["bert", "gpt2"])
def test_dnnl_matches_onnxruntime_on_the_exported_file(name, cache, tmp_path):
    model = exported.export(name, cache_dir=cache)
    inputs = exported.sample_inputs(model, seed=1)
    ids = inputs["input_ids"]
    assert ids.dtype == np.int64 and 0 <= ids.min() and ids.max() < 1000 and np.all(inputs["attention_mask"] == 1)
    assert all(np.array_equal(a, b) for a, b in zip(inputs.values(), zoo.sample_inputs(model, seed=1).values()))
    partitioned = byoc.partition_for(byoc.from_onnx(model), "dnnl")
    assert byoc.report(partitioned).offload_ratio_macs > 0.9
    compiled = byoc.build(partitioned)
    assert_fp32_close(compiled.run(**inputs), onnxruntime_outputs(model, inputs))
    _no_reference_code(compiled, model, tmp_path)


def _no_reference_code(compiled, model, tmp_path) -> None:
    """No primitive of a run is oneDNN's reference code (C loops, 10-1000x its JIT kernels)."""
    slow = [fields[3:7] for fields in onednn_executions(compiled, model, tmp_path) if fields[4].startswith("ref")]
    assert not slow, slow


@needs_torch
@pytest.mark.parametrize("name, dnnl_regions", [("qwen2", 1), ("swin", 1), ("falcon", 1), ("deberta", 3)])
def test_architectures_beyond_the_suite_are_one_region_on_each_vendor(name, dnnl_regions, cache, tmp_path):
    """Rotary embeddings and grouped-query attention (Qwen2, of the Llama family), padded
    windows and patch merging by strided slices (Swin), multi-query attention (Falcon),
    disentangled attention with its padding mask (DeBERTa): each export one region on
    onnxruntime and dnnl, every MAC offloaded, onnxruntime's numbers; on dnnl, no reference
    code (Swin's position bias, a post-op, once ran its scores' products there). DeBERTa's
    gathers by relative distance have no oneDNN primitive: they cut its dnnl region in three."""
    model = exported.export(name, cache_dir=cache)
    inputs = exported.sample_inputs(model)
    for vendor in ("dnnl", "onnxruntime"):
        partitioned = byoc.partition_for(byoc.from_onnx(model), vendor)
        report = byoc.report(partitioned)
        regions = dnnl_regions if vendor == "dnnl" else 1
        assert len(report.regions) == regions and report.offload_ratio_macs == 1.0, report.to_table()
        compiled = byoc.build(partitioned)
        assert_fp32_close(compiled.run(**inputs), onnxruntime_outputs(model, inputs))
        if vendor == "dnnl":
            _no_reference_code(compiled, model, tmp_path)


@needs_torch
def test_a_dynamic_export_runs_at_the_shapes_given(cache):
    model = exported.export("gpt2", dynamic=True, cache_dir=cache)
    dims = [[d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim] for value in model.graph.input]
    assert dims == [["batch", "sequence"], ["batch", "sequence"]]
    assert {k: v.shape for k, v in exported.sample_inputs(model).items()} == {"input_ids": (1, 32), "attention_mask": (1, 32)}
    inputs = {"input_ids": np.arange(48, dtype=np.int64).reshape(3, 16), "attention_mask": np.ones((3, 16), np.int64)}
    mod = byoc.from_onnx(model, shapes={name: value.shape for name, value in inputs.items()})
    compiled = byoc.build(byoc.partition_for(mod, "dnnl"))
    assert_fp32_close(compiled.run(**inputs), onnxruntime_outputs(model, inputs))
    with pytest.raises(DynamicShapeError, match=r"input_ids \[batch, sequence\]"):
        check_model(str(exported.path("gpt2", dynamic=True, cache_dir=cache)))


@needs_torch
def test_a_dynamic_export_compiles_as_it_is_and_runs_any_shape_the_model_takes(cache, tmp_path, capsys):
    """No dims= and no shapes: `batch` stays open, `sequence` is bounded by GPT-2's position table,
    and the artifact `byoc compile` writes is right at shapes across the range."""
    from byoc.cli import main
    from byoc.ir.dims import dims_of

    path = exported.path("gpt2", dynamic=True, cache_dir=cache)
    model = onnx.load(path)
    mod = byoc.from_onnx(model)
    positions = next(i for i in model.graph.initializer if "wpe" in i.name or "position" in i.name).dims[0]
    assert {name: str(r) for name, r in dims_of(mod).items()} == {"batch": "1..", "sequence": f"1..{positions}"}
    assert "bounded by the model" in byoc.report(byoc.partition_for(mod, "dnnl")).to_table()
    artifact = tmp_path / "gpt2.byoc"
    assert main(["compile", str(path), "--vendor", "dnnl", "-o", str(artifact)]) == 0
    capsys.readouterr()
    compiled = byoc.load(artifact)
    for batch, sequence in ((1, 1), (3, 17), (2, positions)):
        ids = np.random.default_rng(sequence).integers(0, 100, (batch, sequence), dtype=np.int64)
        inputs = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
        assert_fp32_close(compiled.run(**inputs), onnxruntime_outputs(model, inputs))


@needs_torch
def test_the_vendor_kit_and_matrix_take_exported_models(cache, monkeypatch):
    from byoc.testing.kit import evaluate, exported_model_names, model_case

    monkeypatch.setenv("BYOC_EXPORT_CACHE_DIR", str(cache))
    assert exported_model_names() == [f"hf:{name}" for name in exported.SUITE]
    result = evaluate("onnxruntime", model_case("hf:bert"), samples=1)
    assert result.passed, (result.error, result.violation)
    assert len(result.report.regions) == 1 and result.report.offload_ratio_nodes == 1.0


@needs_torch
@pytest.mark.parametrize("name", ["gpt2", "bert", "deberta", "falcon", "vit"])
def test_a_dynamic_export_compiled_once_runs_every_shape_in_range(name, cache):
    """One artifact, several shapes: the same offload as the static compile, onnxruntime's numbers,
    and dnnl's region one library for every shape, its kernels made again as the shape changes
    and back (BERT's pooler takes token 0 of a sequence of any length; DeBERTa tiles its relative
    positions over the batch; Falcon picks q, k and v out of one tensor of any batch)."""
    model = exported.export(name, dynamic=True, cache_dir=cache)
    text = name != "vit"
    dims = {"batch": (1, 4), "sequence": (1, 64)} if text else {"batch": (1, 4)}
    partitioned = byoc.partition_for(byoc.from_onnx(model, dims=dims), "dnnl")
    example = exported.sample_inputs(model)
    static = byoc.partition_for(byoc.from_onnx(model, shapes={k: v.shape for k, v in example.items()}), "dnnl")
    assert byoc.report(partitioned).offload_ratio_macs == byoc.report(static).offload_ratio_macs == 1.0
    compiled = byoc.build(partitioned)
    assert compiled.inspect()["shape_specialised"]["dnnl_0"]["symbolic"]
    for batch, length in [(1, 32), (3, 7), (1, 32)] if text else [(1, None), (3, None), (1, None)]:
        if text:
            inputs = {"input_ids": np.arange(batch * length, dtype=np.int64).reshape(batch, length) % 1000,
                      "attention_mask": np.ones((batch, length), np.int64)}
        else:
            inputs = {k: np.repeat(v, batch, axis=0) for k, v in example.items()}
        assert_fp32_close(compiled.run(**inputs), onnxruntime_outputs(model, inputs))


@needs_torch
def test_the_command_line_takes_an_exported_architecture_by_name(cache, monkeypatch, capsys):
    from byoc.cli import main

    monkeypatch.setenv("BYOC_EXPORT_CACHE_DIR", str(cache))
    assert main(["partition", "hf:gpt_neo", "--vendor", "onnxruntime"]) == 0
    out = capsys.readouterr().out
    assert "in 1 region(s)" in out, out


@needs_torch
@pytest.mark.parametrize("name, vendor", [("gpt2", "dnnl"), ("llama", "dnnl"), ("gpt2", "onnxruntime")])
def test_a_decoding_step_with_its_cache_generates_as_onnxruntime_does(name, vendor, cache):
    """The step text generation calls per token (`byoc.models.decoder_step`: past keys and values
    in, present ones out), compiled once for every batch, prompt and cache length in range:
    one region with every MAC, one build for every shape (dnnl: one library; onnxruntime: one
    session, each new length run by its own `run`), and greedy decoding of a prompt gives
    onnxruntime's tokens, each step's logits within 1e-4 of its, past the `max_shapes` a region
    generated per shape keeps (dnnl's loop stopped at token 17). Decoding one token at a time
    made the Llama family's rotated keys garbage on dnnl (see
    test_heads_of_one_token_times_a_broadcast_table)."""
    import onnxruntime as ort

    from byoc.models import decoder_step

    model = decoder_step.export(name, cache_dir=cache)
    dims = {"batch": (1, 4), "sequence": (1, 16), "past": (1, 64), "total": (2, 80)}
    partitioned = byoc.partition_for(byoc.from_onnx(model, dims=dims), vendor)
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and report.offload_ratio_macs == 1.0, report.to_table()
    compiled = byoc.build(partitioned)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [value.name for value in model.graph.input]
    # A first step attends to one masked cache position (the cache holds at least one).
    feeds = decoder_step.step_inputs(model, batch=2, sequence=5, past=1)
    feeds["attention_mask"][:, 0] = 0
    for _ in range(DEFAULT_MAX_SHAPES + 4):
        got, want = compiled.run(**feeds), session.run(None, feeds)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=1e-4)
        tokens = want[0][:, -1].argmax(-1)
        np.testing.assert_array_equal(got[0][:, -1].argmax(-1), tokens)
        batch = tokens.shape[0]
        feeds = {"input_ids": tokens[:, None].astype(np.int64),
                 "attention_mask": np.concatenate([feeds["attention_mask"], np.ones((batch, 1), np.int64)], axis=1),
                 **dict(zip(names[2:], want[1:]))}
    region = compiled.inspect()["shape_specialised"][f"{vendor}_0"]
    assert region["symbolic"] and region["built_here"] == [], region
