"""Models with dynamic dimensions: one artifact for every shape in range.

The model is the zoo's BERT encoder written with dynamic axes (`batch`, `sequence`), as
exporters write them; onnxruntime runs the same file as the reference (fp32: 1e-4 absolute).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
import threading
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import byoc
from byoc.errors import ByocError, InputError, ModelLoadError
from byoc.ir.dims import dims_of
from byoc.models.bert import bert_encoder
from byoc.runtime_metadata.shape_memory import ShapeMemory

TOLERANCE = 1e-4
DIMS = {"batch": (1, 8), "sequence": (1, 64)}
BUCKETS = {"batch": [1, 2], "sequence": [16]}


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return bert_encoder(layers=2, hidden=64, heads=4, intermediate=128, seq_len=64, vocab=100, dynamic=True)


@pytest.fixture(scope="module")
def session(model) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def compiled(model) -> byoc.CompiledModel:
    return byoc.build(byoc.partition_for(byoc.from_onnx(model, dims=DIMS), "dnnl"), shape_buckets=BUCKETS)


def _tokens(shape, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 100, shape).astype(np.int64)


def test_symbolic_import_keeps_named_dimensions(model):
    mod = byoc.from_onnx(model, dims=DIMS)
    main = mod["main"]
    assert str(main.params[0].ty.shape) == "R.shape([batch, sequence])"
    assert dict(main.attrs["tir_var_upper_bound"]) == {"batch": 8, "sequence": 64}
    partitioned = byoc.partition_for(mod, "dnnl")
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and report.offload_ratio_macs == 1.0  # decided at the opt shape: every MAC offloaded


def test_dynamic_bert_one_artifact_three_shapes_in_a_fresh_process(compiled, model, tmp_path):
    """Compiled once, its dnnl region one library for every shape; from the exported artifact."""
    artifact, onnx_file = tmp_path / "bert.byoc", tmp_path / "bert.onnx"
    compiled.export(artifact)
    onnx.save(model, onnx_file)
    script = textwrap.dedent(f"""
        import json, numpy as np, onnxruntime as ort, byoc
        model = byoc.load({str(artifact)!r})
        session = ort.InferenceSession({str(onnx_file)!r}, providers=["CPUExecutionProvider"])
        errors = {{}}
        for shape in [(1, 16), (2, 16), (3, 40)]:
            ids = np.random.default_rng(sum(shape)).integers(0, 100, shape).astype(np.int64)
            got = model.run(input_ids=ids)[0]
            assert got.shape == (*shape, 64), got.shape
            errors[str(shape)] = float(np.abs(got - session.run(None, {{"input_ids": ids}})[0]).max())
        print(json.dumps({{"errors": errors, "regions": model.inspect()["shape_specialised"]}}))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert max(found["errors"].values()) < TOLERANCE, found["errors"]
    region = found["regions"]["dnnl_0"]
    assert region["symbolic"] and region["built_ahead"] == ["any_shape"]
    assert region["built_here"] == []  # no shape compiled anything at run time


def test_shapes_in_range_match_onnxruntime(compiled, session):
    for shape in [(1, 1), (8, 64), (2, 16)]:
        ids = _tokens(shape, 1)
        np.testing.assert_allclose(compiled.run(input_ids=ids)[0], session.run(None, {"input_ids": ids})[0], atol=TOLERANCE)


def test_out_of_range_and_inconsistent_inputs_are_clear_errors(compiled):
    with pytest.raises(InputError, match=r"input 'input_ids' dim 1 \(sequence\) is 65, outside the range 1\.\.64"):
        compiled.run(input_ids=_tokens((1, 65)))
    with pytest.raises(InputError, match="expected 2 dimensions"):
        compiled.run(input_ids=_tokens((1, 2, 3)))


def test_onnxruntime_vendor_runs_every_shape_on_one_session(model, session, tmp_path):
    """onnxruntime takes symbolic shapes: one engine for the region, whatever the shape, also
    from the exported artifact."""
    built = byoc.build(byoc.partition_for(byoc.from_onnx(model, dims=DIMS), "onnxruntime"))
    (artifact,) = built.artifacts
    graph = json.loads(artifact.payload)
    assert graph["inputs"][0]["shape"] == ["batch", "sequence"]
    assert graph["dims"] == {"batch": {"low": 1, "high": 8, "opt": 8}, "sequence": {"low": 1, "high": 64, "opt": 64}}
    built.export(tmp_path / "bert.byoc")
    loaded = byoc.load(tmp_path / "bert.byoc")
    for compiled in (built, loaded):
        # The model is its region and values of the shape alone (position ids and their
        # embeddings, computed once per shape): run without the VM, on buffers kept per shape.
        assert compiled.parts.direct_call is not None and compiled.parts.direct_call.shape_values
        for shape in [(8, 64), (3, 5), (1, 1), (2, 17), (3, 5), (8, 64)]:
            ids = _tokens(shape, 2)
            np.testing.assert_allclose(compiled.run(input_ids=ids)[0], session.run(None, {"input_ids": ids})[0], atol=TOLERANCE)
        region = compiled.inspect()["shape_specialised"]["onnxruntime_0"]
        assert region["symbolic"] and region["built_ahead"] == ["any_shape"] and region["built_here"] == []
    assert "one build for every shape: onnxruntime_0" in built.report().to_table()
    host = built.report().host_ops
    assert host and all(op.reasons == ["depends on the model's shape alone: the host computes it once per shape and keeps it"]
                        for op in host)
    with pytest.raises(InputError, match=r"dim 1 \(sequence\) is 65, outside the range 1\.\.64"):
        loaded.run(input_ids=_tokens((1, 65)))


class _Cut:
    """onnxruntime's engine whose `run_new` gives outputs cut to one column: not the region's."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def run(self, inputs, outputs) -> None:
        self.inner.run(inputs, outputs)

    def run_new(self, inputs):
        return [output[..., :1] for output in self.inner.run_new(inputs)]


def test_a_shape_met_first_runs_on_outputs_the_engine_allocates_and_checked(model, session):
    """A model that is one engine for every shape runs a shape met for the first time through
    the engine's `run_new` (onnxruntime's own `run`, outputs it allocates handed over), one met
    again on kept buffers. The build checks `run_new` against `run`: one that gives other outputs
    is an EngineError naming the region under `strict`, else the region falls back."""
    from byoc.vendors.onnxruntime import build_engine

    built = byoc.build(byoc.partition_for(byoc.from_onnx(model, dims=DIMS), "onnxruntime"))
    for shape, first in [((3, 5), True), ((3, 5), False), ((1, 9), True)]:
        ids = _tokens(shape, 3)
        got = built.run(input_ids=ids)[0]
        np.testing.assert_allclose(got, session.run(None, {"input_ids": ids})[0], atol=TOLERANCE)
        assert got.ctypes.data % 64 == 0 or not first  # onnxruntime's own, handed over
    onnxruntime = byoc.get_backend("onnxruntime")
    cut = dataclasses.replace(onnxruntime, codegen=dataclasses.replace(
        onnxruntime.codegen, build_engine=lambda graph, constants, options: _Cut(build_engine(graph, constants, options))))
    partitioned = byoc.partition_for(byoc.from_onnx(model, dims=DIMS), "onnxruntime")
    with pytest.raises(byoc.errors.EngineError, match=r"region onnxruntime_0__\w+ \(onnxruntime\): the engine's run_new gave "
                                                      r"\[\(\(8, 64, 1\), 'float32'\)\], not the outputs run writes"):
        byoc.build(partitioned, backends={"onnxruntime": cut}, strict=True)
    with pytest.warns(UserWarning, match="run_new"):
        fallen = byoc.build(partitioned, backends={"onnxruntime": cut})
    assert "onnxruntime_0" in fallen.report().build_fallbacks
    ids = _tokens((3, 5))
    np.testing.assert_allclose(fallen.run(input_ids=ids)[0], session.run(None, {"input_ids": ids})[0], atol=TOLERANCE)


def test_a_region_the_engine_cannot_take_symbolically_is_generated_per_shape(model, session):
    """A vendor that declares symbolic shapes but refuses this region's: generated per shape,
    with the reason in `inspect`, and still correct."""
    import dataclasses

    from byoc.codegen_json import JsonRuntime
    from byoc.vendors.onnxruntime import build_engine, onnxruntime

    def static_only(graph, constants, options):
        if "dims" in graph:
            raise NotImplementedError("this engine takes static shapes only")
        return build_engine(graph, constants, options)

    vendor = dataclasses.replace(onnxruntime, codegen=JsonRuntime(build_engine=static_only, version="static-only"))
    built = byoc.build(byoc.partition_for(byoc.from_onnx(model, dims=DIMS), "onnxruntime"), backends={"onnxruntime": vendor})
    ids = _tokens((3, 5), 2)
    np.testing.assert_allclose(built.run(input_ids=ids)[0], session.run(None, {"input_ids": ids})[0], atol=TOLERANCE)
    region = built.inspect()["shape_specialised"]["onnxruntime_0"]
    assert not region["symbolic"] and region["built_ahead"] == ["batch8_sequence64"] and region["built_here"] == ["batch3_sequence5"]
    assert "this engine takes static shapes only" in region["per_shape_reason"]


def test_threads_running_one_library_at_different_shapes(compiled, session):
    """A dnnl region written for every shape is made again under its lock when the shape
    changes: threads alternating shapes each get onnxruntime's numbers."""
    cases = []
    for seed, shape in enumerate([(1, 5), (3, 40), (2, 64), (8, 3)]):
        ids = _tokens(shape, seed)
        cases.append((ids, session.run(None, {"input_ids": ids})[0]))
    errors: list[float] = []

    def work(offset: int) -> None:
        for step in range(40):
            ids, want = cases[(step + offset) % len(cases)]
            errors.append(float(np.abs(compiled.run(input_ids=ids)[0] - want).max()))

    threads = [threading.Thread(target=work, args=(offset,)) for offset in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(errors) == 120 and max(errors) < TOLERANCE
    assert compiled.inspect()["shape_specialised"]["dnnl_0"]["symbolic"]


def _dnnl_static_shapes_only() -> dict:
    """dnnl with its kernel library unable to make kernels again for other shapes (no
    `ownership`), as a C library of static shapes is: its regions are generated per shape."""
    dnnl = byoc.get_backend("dnnl")
    return {"dnnl": dataclasses.replace(dnnl, codegen=dataclasses.replace(dnnl.codegen, ownership=""))}


@pytest.mark.parametrize("fault, reason", [
    ("\nthis is not C;\n", "its C code for every shape did not compile"),
    ("\n#undef dnnl_primitive_create\n#define dnnl_primitive_create(primitive, pd) dnnl_unimplemented\n", "primitive creation"),
])
def test_a_c_region_not_made_for_every_shape_is_generated_per_shape(model, session, fault, reason):
    """Where a C library's code for every shape does not compile, or its kernels cannot be
    made at load, the region is generated per shape (the static path), with the reason."""
    dnnl = byoc.get_backend("dnnl")
    broken = dataclasses.replace(dnnl, codegen=dataclasses.replace(dnnl.codegen, ownership=dnnl.codegen.ownership + fault))
    built = byoc.build(byoc.partition_for(byoc.from_onnx(model, dims=DIMS), "dnnl"), backends={"dnnl": broken})
    region = built.inspect()["shape_specialised"]["dnnl_0"]
    assert not region["symbolic"] and reason in region["per_shape_reason"], region
    ids = _tokens((2, 7))
    np.testing.assert_allclose(built.run(input_ids=ids)[0], session.run(None, {"input_ids": ids})[0], atol=TOLERANCE)
    assert built.report().regions[0].backend == "dnnl"


def test_c_variants_built_on_first_use_are_bounded(model):
    """A C library's variants stay loaded with their weights: past max_shapes a new shape is an
    error saying so and what to do instead (a decoder's cache length, new at every step, took a
    base-width GPT-2 past 24 GB when dnnl generated per shape)."""
    built = byoc.build(byoc.partition_for(byoc.from_onnx(model, dims=DIMS), "dnnl"), max_shapes=1, backends=_dnnl_static_shapes_only())
    assert "onednn regions take static shapes only" in built.inspect()["shape_specialised"]["dnnl_0"]["per_shape_reason"]
    built.run(input_ids=_tokens((1, 3)))
    built.run(input_ids=_tokens((1, 3)))
    with pytest.raises(byoc.errors.EngineError, match=r"region dnnl_0 \(dnnl\): batch1_sequence4 would be shape 2 generated here, "
                       r"over max_shapes=1: its variants are C libraries that stay loaded .*shape_buckets.*onnxruntime"):
        built.run(input_ids=_tokens((1, 4)))
    assert built.inspect()["shape_specialised"]["dnnl_0"]["built_here"] == ["batch1_sequence3"]


def test_engine_variants_built_on_first_use_are_evicted_and_say_so(model):
    """Variants run by engines are kept at most max_shapes, the least recently used evicted;
    meeting more says, once, that each new shape builds again and what to do instead."""
    from byoc.errors import ShapeVariantWarning

    built = byoc.build(byoc.partition_for(byoc.from_onnx(model, dims=DIMS), "reference"), max_shapes=1)
    built.run(input_ids=_tokens((1, 3)))
    with pytest.warns(ShapeVariantWarning, match=r"region reference_0 \(reference\): more shapes than the 1 it keeps .* each new "
                      r"value of batch, sequence generates and compiles it again .*onnxruntime"):
        built.run(input_ids=_tokens((1, 4)))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ShapeVariantWarning)
        built.run(input_ids=_tokens((1, 5)))
    assert built.inspect()["shape_specialised"]["reference_0"]["built_here"] == ["batch1_sequence5"]


def test_dims_and_shapes_are_checked_against_the_model(model):
    with pytest.raises(ModelLoadError, match=r"unknown dimension\(s\) \['seq'\]; the model's named dynamic dimensions are 'batch', 'sequence'"):
        byoc.from_onnx(model, dims={"seq": (1, 64)})
    with pytest.raises(ModelLoadError, match=r"expected 1 <= low <= opt <= high"):
        byoc.from_onnx(model, dims={"batch": (4, 2), "sequence": 64})
    with pytest.raises(ModelLoadError, match="given a range by dims= and fixed by shapes"):
        byoc.from_onnx(model, shapes={"input_ids": [1, 16]}, dims={"sequence": 64})
    # a named dimension dims= leaves out keeps an open range
    assert {name: str(r) for name, r in dims_of(byoc.from_onnx(model, dims={"sequence": 64})).items()} == {
        "batch": "1..", "sequence": "1..64"}
    with pytest.raises(ModelLoadError, match=r"shapes\[ids\]|unknown input\(s\) \['ids'\]"):
        byoc.from_onnx(model, shapes={"ids": [1, 16]})


def test_shape_buckets_are_checked(model):
    partitioned = byoc.partition_for(byoc.from_onnx(model, dims=DIMS), "dnnl")
    with pytest.raises(ByocError, match=r"sequence=128 is outside its range 1\.\.64"):
        byoc.build(partitioned, shape_buckets={"sequence": [128]})
    with pytest.raises(ByocError, match=r"unknown dimension\(s\) \['seq'\]"):
        byoc.build(partitioned, shape_buckets=[{"seq": 4}])
    static = byoc.partition_for(byoc.from_onnx(bert_encoder(layers=1, hidden=32, heads=2, intermediate=64, seq_len=8, vocab=50)),
                                "dnnl")
    with pytest.raises(ByocError, match="applies to models with dynamic dimensions"):
        byoc.build(static, shape_buckets={"batch": [1]})


def test_cli_compiles_and_inspects_a_dynamic_file(model, tmp_path, capsys):
    from byoc.cli import main

    onnx_file, artifact = tmp_path / "bert.onnx", tmp_path / "bert.byoc"
    onnx.save(model, onnx_file)
    assert main(["compile", str(onnx_file), "--vendor", "dnnl", "--dims", "batch=1:4", "sequence=1:32",
                 "--shape-buckets", "batch=1,2", "sequence=8", "-o", str(artifact), "--accuracy-samples", "1",
                 "--shape-memory", "64M"]) == 0
    out = capsys.readouterr().out
    assert "1 region(s) (1 with one build for every shape)" in out and "max abs error" in out
    assert main(["run", str(artifact), "--profile", "--repeat", "1", "--shape-memory", "1.5G"]) == 0
    assert "kept per shape: 0.0 MiB in 1 entry of at most 1536.0 MiB (shape_memory)" in capsys.readouterr().out
    assert byoc.load(artifact).shape_memory.limit == 64 << 20
    assert main(["inspect", str(artifact)]) == 0
    out = capsys.readouterr().out
    assert "dimension sequence: 1 to 32" in out
    assert "dnnl_0 (dnnl): one build for every shape of batch, sequence (symbolic shapes)" in out
    assert main(["compile", str(onnx_file), "--vendor", "onnxruntime", "--dims", "batch=1:4", "sequence=1:32",
                 "-o", str(artifact)]) == 0
    assert "1 region(s) (1 with one build for every shape)" in capsys.readouterr().out
    assert main(["inspect", str(artifact)]) == 0
    assert "onnxruntime_0 (onnxruntime): one build for every shape of batch, sequence (symbolic shapes)" in capsys.readouterr().out


@pytest.mark.parametrize("vendor", ["vitis_ai", "ethos_u"])
def test_int8_vendors_calibrate_over_shapes_and_compile_per_shape(vendor):
    """Calibrated on samples of several batch sizes; a program per batch size, within the int8
    vendors' stated bound (relative L2 <= 10%, top-1 agreement >= 90%)."""
    from byoc import models as zoo

    model = zoo.get("resnet18", small=True)
    for value in (model.graph.input[0], model.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    rng = np.random.default_rng(0)
    calibration = [{"input": rng.standard_normal((b, 3, 64, 64)).astype(np.float32)} for b in (1, 2, 2)]
    partitioned = byoc.partition_for(byoc.from_onnx(model, dims={"batch": (1, 2)}), vendor, calibration=calibration)
    compiled = byoc.build(partitioned, shape_buckets={"batch": [2]})
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (2, 1):
        x = rng.standard_normal((batch, 3, 64, 64)).astype(np.float32)
        got, want = compiled.run(input=x)[0], session.run(None, {"input": x})[0]
        assert np.linalg.norm(got - want) / np.linalg.norm(want) <= 0.10
        assert np.mean(got.argmax(1) == want.argmax(1)) >= 0.9
    region = compiled.inspect()["shape_specialised"][f"{vendor}_0"]
    assert region["built_ahead"] == ["batch2"] and region["built_here"] == ["batch1"]


def test_values_of_the_shape_alone_are_computed_once_per_shape(model, compiled, session):
    """The position embeddings sliced to the sequence length depend on the shape only: the host
    computes them in a function of their own, once per shape, and main reads them."""
    from byoc.runtime_metadata.build import region_functions
    from byoc.runtime_metadata.hoist_shape_values import hoist_shape_values
    from byoc.runtime_metadata.shape_values import SHAPE_VALUES, SHAPE_VALUES_FUNCTION
    from byoc.runtime_metadata.shape_variants import through_dispatch

    partitioned = byoc.partition_for(byoc.from_onnx(model, dims=DIMS), "dnnl")
    host = hoist_shape_values(through_dispatch(partitioned, [s for s, _, _ in region_functions(partitioned)]))
    assert "strided_slice" in host[SHAPE_VALUES_FUNCTION].script() and "strided_slice" not in host["main"].script()
    assert SHAPE_VALUES in host["main"].script()
    values = compiled._by_name[SHAPE_VALUES]
    for shape in [(2, 16), (2, 16), (1, 9)]:
        ids = _tokens(shape, 3)
        np.testing.assert_allclose(compiled.run(input_ids=ids)[0], session.run(None, {"input_ids": ids})[0], atol=TOLERANCE)
    assert (2, 16) in values._kept and (1, 9) in values._kept
    # A profile says what the model keeps for the shapes it has met, within which bounds.
    held = compiled.profile(input_ids=_tokens((1, 9)), repeat=1).held
    assert held["host memory"].startswith("TVM's naive allocator")
    assert held["values of the shape alone"].startswith(f"{len(values._kept)} shape(s), ")
    assert "(at most 1024 within 16 MiB)" in held["values of the shape alone"]
    assert held["kept per shape"].endswith("of at most 256.0 MiB (shape_memory); 0 dropped, least recently used first")
    assert "dnnl_0 variants made at run time" not in held  # one C library for every shape


def test_the_report_names_the_dimensions_and_the_regions_generated_per_shape(model, compiled):
    partitioned = byoc.partition_for(byoc.from_onnx(model, dims=DIMS), "dnnl")
    line = ("dynamic dimensions: batch 1..8 (opt 8; given), sequence 1..64 (opt 64; given) (MACs and bytes at each opt); generated "
            "per shape: none; one build for every shape: dnnl_0")
    assert line in byoc.report(partitioned).to_table()
    assert line in compiled.report().to_table()
    per_shape = byoc.build(partitioned, backends=_dnnl_static_shapes_only())
    assert "(MACs and bytes at each opt); generated per shape: dnnl_0" in per_shape.report().to_table()


def test_two_models_of_one_architecture_keep_their_own_weights_at_a_shape_built_on_first_use(model, session):
    """Their regions compile to the same code: each must run with its own weights, however the
    dynamic loader shares the library."""
    other = bert_encoder(layers=2, hidden=64, heads=4, intermediate=128, seq_len=64, vocab=100, dynamic=True, seed=1)
    other_session = ort.InferenceSession(other.SerializeToString(), providers=["CPUExecutionProvider"])
    first, second = (byoc.build(byoc.partition_for(byoc.from_onnx(m, dims=DIMS), "dnnl")) for m in (model, other))
    ids = _tokens((3, 11), 4)
    second.run(input_ids=ids)  # the second model's variant is made and initialised last
    np.testing.assert_allclose(first.run(input_ids=ids)[0], session.run(None, {"input_ids": ids})[0], atol=TOLERANCE)
    np.testing.assert_allclose(second.run(input_ids=ids)[0], other_session.run(None, {"input_ids": ids})[0], atol=TOLERANCE)


@pytest.mark.parametrize("vendor, named", [("dnnl", True), ("onnxruntime", True), ("dnnl", False)])
def test_repeats_over_a_dynamic_batch_and_a_constant_pick_from_it(vendor, named):
    """DeBERTa tiles its relative positions over the batch, `Tile(x, Concat(Shape(mask)[0:1], 1,
    1))`, whose repeats are a shape value (TVM refuses one as Tile's input); Falcon picks one of
    q, k and v by a constant GatherND coordinate into a tensor of any batch. Both import with the
    batch symbolic and run at each batch in range; so does the graph with its nodes unnamed, as
    graphs built by hand come (the importer tells Tile's repeats apart by name)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        [helper.make_node("Shape", ["mask"], ["shape"], name="shape"),
         helper.make_node("Slice", ["shape", "zero", "one"], ["batch"], name="batch"),
         helper.make_node("Concat", ["batch", "one", "one"], ["repeats"], axis=0, name="repeats"),
         helper.make_node("Tile", ["positions", "repeats"], ["tiled"], name="tile"),
         helper.make_node("MatMul", ["tiled", "w"], ["scores"], name="scores"),
         helper.make_node("Unsqueeze", ["scores", "zero"], ["stacked"], name="stack"),
         helper.make_node("Concat", ["stacked", "stacked"], ["qk"], axis=0, name="qk"),
         helper.make_node("GatherND", ["qk", "second"], ["picked"], name="pick")], "repeats",
        [helper.make_tensor_value_info("positions", TensorProto.FLOAT, [1, 6, 4]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", 6])],
        [helper.make_tensor_value_info("picked", TensorProto.FLOAT, ["batch", 6, 4])],
        [numpy_helper.from_array(np.array([0], np.int64), "zero"), numpy_helper.from_array(np.array([1], np.int64), "one"),
         numpy_helper.from_array(np.array([-1], np.int64), "second"),
         numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if not named:
        for node in model.graph.node:
            node.name = ""
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model, dims={"batch": (1, 8)}), vendor))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 3, 8):
        positions, mask = rng.standard_normal((1, 6, 4)).astype(np.float32), np.ones((batch, 6), np.int64)
        np.testing.assert_allclose(compiled.run(positions, mask)[0], session.run(None, {"positions": positions, "mask": mask})[0],
                                   rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize("vendor", ["dnnl", "onnxruntime"])
def test_padding_with_a_dynamic_batch(vendor):
    """Swin pads its windows whatever the batch: Pad of a feature map whose batch is symbolic
    imports as one `relax.nn.pad` and runs at each batch in range."""
    from onnx import TensorProto, helper, numpy_helper

    weights = numpy_helper.from_array(np.random.default_rng(0).standard_normal((6, 6)).astype(np.float32), "w")
    pads = numpy_helper.from_array(np.array([0, 0, 1, 0, 0, 0, 2, 0], np.int64), "pads")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Pad", ["h", "pads"], ["p"]),
         helper.make_node("MatMul", ["p", "w"], ["y"])], "padded",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 5, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 8, 6])], [weights, pads])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    mod = byoc.from_onnx(model, dims={"batch": (1, 4)})
    assert "R.nn.pad" in mod["main"].script()
    compiled = byoc.build(byoc.partition_for(mod, vendor, fallback_without_macs=False))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 3, 5, 6)).astype(np.float32)
        np.testing.assert_allclose(compiled.run(x)[0], session.run(None, {"x": x})[0], rtol=TOLERANCE, atol=TOLERANCE)


def test_a_shapes_dimensions_picked_by_constant_indices_stay_a_shape():
    """onnxruntime's transpose optimizer (which `quant_pre_process` runs before `quantize_static`)
    writes Shape(Transpose(x)) as Gather(Shape(x), perm). A Reshape to that must still import
    with a symbolic dimension: it was refused ("Reshape requires the input new shape to be
    Shape") on every exported transformer quantized with dynamic axes."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]), helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "perm"], ["ts"]), helper.make_node("Relu", ["t"], ["r"]),
             helper.make_node("Reshape", ["r", "ts"], ["y"])]
    graph = helper.make_graph(nodes, "picked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8, 4])],
                              [numpy_helper.from_array(np.array([0, 2, 1], np.int64), "perm")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model, dims={"batch": (1, 4)}), "dnnl"))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 4, 8)).astype(np.float32)
        np.testing.assert_allclose(compiled.run(x=x)[0], session.run(None, {"x": x})[0], atol=TOLERANCE)


def test_precision_int8_calibrates_over_shapes_and_serves_every_shape(model, session):
    """`precision="int8"` on a model with dynamic dimensions: calibrated on samples of several
    shapes, one int8 region, and at every shape as accurate as onnxruntime's own quantization of
    the file on the same samples."""
    from byoc.models.quantized import quantize_static

    rng = np.random.default_rng(5)
    samples = [{"input_ids": rng.integers(0, 100, shape).astype(np.int64)} for shape in [(1, 16), (2, 32), (1, 64), (4, 8)]]
    partitioned = byoc.partition_for(byoc.from_onnx(model, dims=DIMS), "dnnl", precision="int8", calibration=samples)
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and report.offload_ratio_macs == 1.0, report.to_table()
    assert any(pattern.startswith("dnnl.qdense") for pattern in report.regions[0].patterns), report.regions[0].patterns
    compiled = byoc.build(partitioned)
    theirs = ort.InferenceSession(quantize_static(model, samples, "uint8").SerializeToString(), providers=["CPUExecutionProvider"])
    for shape in [(1, 5), (3, 40), (8, 64)]:
        inputs = {"input_ids": rng.integers(0, 100, shape).astype(np.int64)}
        exact = session.run(None, inputs)[0]
        ours, onnxruntimes = (float(np.linalg.norm(got - exact) / np.linalg.norm(exact))
                              for got in (compiled.run(inputs)[0], theirs.run(None, inputs)[0]))
        assert ours <= onnxruntimes, (shape, ours, onnxruntimes)


def test_a_sum_of_dimensions_reshaped_into_a_shape_stays_a_shape():
    """A decoder exported with its key/value cache builds the attention mask's shape from
    past + sequence: Squeeze(Shape(...)) twice, an Add, a Reshape to one element, a Concat, an
    Expand. TVM's Reshape converter refused the scalar ("Reshape expects the input data to be a
    Tensor"), so no decoder with a cache imported with dynamic axes."""
    from onnx import TensorProto, helper, numpy_helper

    def length(name, source, axis):
        return [helper.make_node("Shape", [source], [f"{name}_s"], start=axis, end=axis + 1),
                helper.make_node("Squeeze", [f"{name}_s"], [name])]

    nodes = [*length("p", "past", 1), *length("q", "x", 1), helper.make_node("Add", ["p", "q"], ["total"]),
             helper.make_node("Reshape", ["total", "minus_one"], ["total_1"]),
             helper.make_node("Shape", ["x"], ["b"], start=0, end=1),
             helper.make_node("Concat", ["b", "total_1", "width"], ["shape"], axis=0),
             helper.make_node("Expand", ["bias", "shape"], ["spread"]),
             helper.make_node("Concat", ["past", "x"], ["state"], axis=1), helper.make_node("Add", ["state", "spread"], ["y"])]
    constants = [numpy_helper.from_array(np.array([-1], np.int64), "minus_one"), numpy_helper.from_array(np.array([8], np.int64), "width"),
                 numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(1, 1, 8), "bias")]
    graph = helper.make_graph(nodes, "cache", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8]),
                                               helper.make_tensor_value_info("past", TensorProto.FLOAT, ["batch", "past", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "total", 8])], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model, dims={"batch": (1, 4), "seq": (1, 8), "past": (1, 32)}), "dnnl"))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for batch, seq, past in [(1, 1, 7), (3, 8, 1), (2, 1, 32)]:
        feeds = {"x": rng.standard_normal((batch, seq, 8)).astype(np.float32), "past": rng.standard_normal((batch, past, 8)).astype(np.float32)}
        np.testing.assert_allclose(compiled.run(**feeds)[0], session.run(None, feeds)[0], atol=TOLERANCE)


def test_new_and_repeated_shapes_hand_back_outputs_of_their_own():
    """A shape met for the first time runs on the caller's arrays as they are (a decoder's every
    step is a new shape); one met again, on kept buffers. Either way the caller's inputs are left
    as they were, and an output that is an input (passed through, or reshaped) is a copy."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["same"]), helper.make_node("Relu", ["x"], ["relu"])],
                              "passthrough", [x], [helper.make_tensor_value_info("same", TensorProto.FLOAT, ["batch", 4]),
                                                   helper.make_tensor_value_info("relu", TensorProto.FLOAT, ["batch", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model, dims={"batch": (1, 64)}), "dnnl"))
    for index, batch in enumerate((3, 5, 3, 5, 7, 7)):
        values = np.random.default_rng(batch).standard_normal((batch, 4)).astype(np.float32)
        block = np.empty(values.nbytes + 64, np.uint8)  # 64-byte aligned every other time: taken as it is
        start = -block.ctypes.data % 64 + (4 if index % 2 else 0)
        given = block[start:start + values.nbytes].view(np.float32).reshape(values.shape)
        given[...] = values
        kept = given.copy()
        same, relu = compiled.run(x=given)
        np.testing.assert_array_equal(same, kept)
        np.testing.assert_array_equal(relu, np.maximum(kept, 0))
        assert not np.shares_memory(same, given) and not np.shares_memory(relu, given)
        same[...] = 7.0  # the caller owns what it is given
        np.testing.assert_array_equal(given, kept)


@pytest.mark.parametrize("vendor", ["dnnl", "onnxruntime"])
def test_the_profile_gives_a_shape_specialised_region_its_time(model, vendor):
    """The host calls a shape-specialised region by its name, its variant does the work: the
    profile listed the variant with no call and counted the region's time as the host's."""
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model, dims=DIMS), vendor))
    profile = compiled.profile(input_ids=_tokens((2, 9)), repeat=3)
    (region, host) = profile.rows
    assert (region.part, region.backend, region.calls_per_run, host.part) == (f"{vendor}_0", vendor, 1, "host")
    assert region.execution_ms > 0 and f"{vendor}_0" not in {k.name for k in profile.host_kernels}
    assert f"{vendor}_0 " in profile.to_table()


def test_the_host_calls_a_c_region_for_every_shape_with_no_python_between(compiled, session):
    """dnnl's region for every shape is C in the host library: the host calls it directly, as a
    static region, not through the dispatcher of regions generated per shape (5-8 us a call, a
    tenth of a small model's run). Still right at every shape, and still in the profile."""
    assert compiled.inspect()["shape_specialised"]["dnnl_0"]["symbolic"]
    dispatched = []

    def seen(frame, event, _arg):
        if event == "call" and frame.f_code.co_name == "__call__" and "self" in frame.f_locals:
            dispatched.append(type(frame.f_locals["self"]).__name__)

    for shape in [(1, 9), (2, 16), (1, 9)]:
        tokens = _tokens(shape)
        sys.setprofile(seen)
        try:
            (got,) = compiled.run(input_ids=tokens)
        finally:
            sys.setprofile(None)
        np.testing.assert_allclose(got, session.run(None, {"input_ids": tokens})[0], rtol=TOLERANCE, atol=TOLERANCE)
    assert "SpecialisedRuntime" not in dispatched, dispatched


def test_shape_values_are_kept_within_their_count_and_bytes(monkeypatch):
    """Values of the shape alone are computed once per shape and kept, for as many shapes as a
    generation loop meets (every cache length, met again by the next request), within a bound on
    their bytes too: past it the least recently used go first, and are computed again if met."""
    import tvm

    from byoc.runtime_metadata import shape_values

    computed = []

    def compute():
        def function(dims):
            computed.append(tuple(int(d) for d in dims))
            return (tvm.runtime.tensor(np.full((int(dims[0]),), float(dims[0]), np.float32)),)
        return function

    values = shape_values.ShapeValues(compute)
    for length in [*range(1, 65), *range(1, 65)]:  # a 64-token generation, then the next request's
        ((_, view),) = values.kept((length,))
        np.testing.assert_array_equal(view, np.full((length,), length, np.float32))
    assert computed == [(n,) for n in range(1, 65)]
    # ten float32 values, by their own bound or the model's: shapes 4 and 6 fit, not 8 beside them
    for memory, kept_bytes in ((ShapeMemory(4 * 10), shape_values.KEPT_BYTES), (ShapeMemory(), 4 * 10)):
        monkeypatch.setattr(shape_values, "KEPT_BYTES", kept_bytes)
        small = shape_values.ShapeValues(compute, memory)
        computed.clear()
        for length in (4, 6, 4, 8, 4, 6):
            assert int(small(tvm.runtime.ShapeTuple([length]))[0].shape[0]) == length
        assert computed == [(4,), (6,), (8,), (4,), (6,)]
        assert memory.held() == {"values of the shape alone": (2, 4 * 10)}


def test_values_and_engine_variants_share_one_byte_limit(model, session):
    """What a model keeps per shape met (its values of the shape alone, its regions' variants
    run by engines) stays within shape_memory together, the least recently used of any kind
    first out; a variant made again says so once; the profile shows what is held."""
    from byoc.errors import ShapeVariantWarning

    partitioned = byoc.partition_for(byoc.from_onnx(model, dims=DIMS), "reference")
    roomy = byoc.build(partitioned)
    for length in (3, 4, 3):
        roomy.run(input_ids=_tokens((1, length)))
    assert roomy.inspect()["shape_specialised"]["reference_0"]["built_here"] == ["batch1_sequence4", "batch1_sequence3"]
    held = roomy.shape_memory.held()
    assert held["values of the shape alone"][0] == 2 and held["region reference_0 (reference)"][0] == 2
    variant_bytes = held["region reference_0 (reference)"][1] // 2
    report = roomy.profile(input_ids=_tokens((1, 3)), repeat=1)
    assert "of at most 256.0 MiB (shape_memory)" in report.held["kept per shape"]
    assert "MiB of constants" in report.held["reference_0 variants made at run time"]

    # Room for one shape's variant and values, not for two shapes': the second drops the first's
    tight = byoc.build(partitioned, shape_memory=variant_bytes * 3 // 2)
    for length in (3, 4):
        tight.run(input_ids=_tokens((1, length)))
    assert {owner: count for owner, (count, _) in tight.shape_memory.held().items()} == {
        "values of the shape alone": 1, "region reference_0 (reference)": 1}
    assert tight.inspect()["shape_specialised"]["reference_0"]["built_here"] == ["batch1_sequence4"]
    with pytest.warns(ShapeVariantWarning, match=r"region reference_0 \(reference\): its variant for batch1_sequence3 was made "
                      r"before and dropped to keep the model within shape_memory=\d+ bytes"):
        got = tight.run(input_ids=_tokens((1, 3)))[0]
    np.testing.assert_allclose(got, session.run(None, {"input_ids": _tokens((1, 3))})[0], rtol=TOLERANCE, atol=TOLERANCE)
    assert "4 dropped, least recently used first" in tight.shape_memory.summary()  # each shape dropped the other's two


def test_shape_memory_is_set_at_build_and_again_at_load(model, tmp_path):
    built = byoc.build(byoc.partition_for(byoc.from_onnx(model, dims=DIMS), "dnnl"), shape_memory=5 << 20)
    path = tmp_path / "model.byoc"
    built.export(path)
    assert byoc.load(path).shape_memory.limit == 5 << 20
    assert byoc.load(path, shape_memory=1 << 30).shape_memory.limit == 1 << 30
    for wrong in (0, -1, 2.5, True, "64MB"):
        with pytest.raises(ByocError, match="shape_memory is the bytes a model keeps for the shapes it meets"):
            byoc.load(path, shape_memory=wrong)
    with pytest.raises(ByocError, match="shape_memory is the bytes"):
        byoc.build(byoc.partition_for(byoc.from_onnx(model, dims=DIMS), "dnnl"), shape_memory=0)
    assert "oneDNN's cache" in built.held()["dnnl's onednn library"]
