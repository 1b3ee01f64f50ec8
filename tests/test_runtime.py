"""The three code-generation formats end to end, the artifact, caches, profiling, concurrency."""

import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
import zipfile

import numpy as np
import pytest
from c_vendor import make_c_backend
from custom_vendor import make_custom_backend

import byoc
from byoc.codegen_json import tvm_engine
from byoc.errors import ArtifactError, BuildError, CustomFormatError, EngineError, InputError, JsonGraphError, MissingVendorError
from byoc.runtime_metadata.engine_cache import engine_cache_key, pack_entry

from conftest import REPO, assert_fp32_close, onnxruntime_outputs, small_model, small_module
from graphs import chain_module, registered


@pytest.fixture(scope="module")
def c_backend():
    with registered(make_c_backend()) as (backend,):
        yield backend


@pytest.fixture(scope="module")
def custom_backend():
    with registered(make_custom_backend()) as (backend,):
        yield backend


def _fresh_process_run(artifact, inputs_path, vendors_module=None):
    """Load an artifact in a new interpreter and return its outputs."""
    setup = f"import sys; sys.path.insert(0, {os.path.join(REPO, 'tests')!r}); import byoc\n"
    if vendors_module:
        setup += f"import {vendors_module.split(':')[0]} as v; byoc.register_backend(v.{vendors_module.split(':')[1]}())\n"
    script = setup + f"""
import numpy as np
inputs = dict(np.load({str(inputs_path)!r}))
outputs = byoc.load({str(artifact)!r}).run(**inputs)
np.savez({str(inputs_path) + '.out.npz'!r}, *outputs)
"""
    subprocess.run([sys.executable, "-c", script], check=True, env=os.environ.copy())
    with np.load(str(inputs_path) + ".out.npz") as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


@pytest.mark.parametrize(
    "vendor, model_name, register",
    [
        ("reference", "resnet18", None),
        ("cloops", "resnet18", "c_vendor:make_c_backend"),
        ("blobby", "mlp", "custom_vendor:make_custom_backend"),
    ],
    ids=["json", "c", "custom"],
)
def test_format_exports_to_one_file_and_runs_in_a_fresh_process(vendor, model_name, register, tmp_path, c_backend, custom_backend):
    model = small_model(model_name)
    inputs = byoc.models.sample_inputs(model, seed=5)
    partitioned = byoc.partition_for(small_module(model_name), vendor)
    compiled = byoc.build(partitioned)
    expected = onnxruntime_outputs(model, inputs)
    assert_fp32_close(compiled.run(**inputs), expected)
    artifact = tmp_path / "model.byoc"
    compiled.export(artifact)
    assert {a.codegen for a in compiled.artifacts} == {byoc.get_backend(vendor).codegen.kind}
    np.savez(tmp_path / "inputs.npz", **inputs)
    assert_fp32_close(_fresh_process_run(artifact, tmp_path / "inputs.npz", register), expected)


def test_generated_c_compiles_without_warnings(tmp_path, c_backend):
    from byoc.runtime_metadata.build import region_functions
    from byoc.runtime_metadata.constants import ConstantStore
    from byoc.runtime_metadata.generate_regions import generate_region

    partitioned = byoc.partition_for(small_module("resnet18"), "cloops")
    ((symbol, backend, func),) = region_functions(partitioned)
    source = generate_region(func, symbol, c_backend, ConstantStore(), c_backend.settings).payload.decode()
    path = tmp_path / "region.c"
    path.write_text(source)
    import tvm_ffi.libinfo as ffi_info

    includes = [f"-I{ffi_info.find_include_path()}", f"-I{ffi_info.find_dlpack_include_path()}"]
    for compiler, standard in (("gcc", "-std=c11"), ("g++", "-std=c++17")):
        language = "c" if compiler == "gcc" else "c++"
        command = [compiler, "-x", language, standard, "-Wall", "-Wextra", "-c", str(path), "-o", str(tmp_path / "r.o"), *includes]
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode == 0 and result.stderr == "", result.stderr


# Helpers only one language accepts: `new` is a C++ keyword, templates are not C.
_ONLY_IN = {"c": "static int byoc_probe(void) { int new = 1; return new; }",
            "c++": "template <typename T> static T byoc_probe(T x) { return x; }"}


@pytest.mark.parametrize("language", ["c", "c++"])
def test_a_region_is_compiled_as_its_library_says(language):
    import c_vendor

    library = dataclasses.replace(c_vendor.LIBRARY, prologue=_ONLY_IN[language], language=language)
    with registered(make_c_backend("cloops_language", library)):
        model = small_model("mlp")
        inputs = byoc.models.sample_inputs(model, seed=2)
        compiled = byoc.build(byoc.partition_for(small_module("mlp"), "cloops_language"))
        assert_fp32_close(compiled.run(**inputs), onnxruntime_outputs(model, inputs))
    with pytest.raises(ValueError, match="language must be 'c' or 'c\\+\\+', got 'fortran'"):
        dataclasses.replace(c_vendor.LIBRARY, language="fortran")


def test_constants_are_stored_once(tmp_path):
    partitioned = byoc.partition_for(small_module("mlp"), "reference", max_ops_per_region=1)
    compiled = byoc.build(partitioned)
    named = compiled.store.names()
    assert len(compiled.artifacts) > 3
    assert len(set(named.values())) == len(compiled.store.contents()) <= len(named)
    compiled.export(tmp_path / "m.byoc")
    with zipfile.ZipFile(tmp_path / "m.byoc") as archive:
        files = [n for n in archive.namelist() if n.startswith("constants/")]
    assert len(files) == len(set(named.values()))


def test_shared_constant_is_stored_once_across_regions():
    import tvm
    from tvm import relax
    from tvm.relax import op as R

    weight = relax.const(np.ones((8, 8), "float32"))
    x = relax.Var("x", relax.TensorType((1, 8), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            a = builder.emit(R.matmul(x, weight), "a")
            b = builder.emit(R.sin(a), "b")
            out = builder.emit_output(R.matmul(b, weight))
        builder.emit_func_output(out)
    compiled = byoc.build(byoc.partition_for(builder.get(), "reference"))
    assert len(compiled.artifacts) == 2 and len(compiled.store.names()) == 2
    assert len(compiled.store.contents()) == 1
    del tvm


def test_inputs_are_checked_by_name_shape_and_dtype():
    compiled = byoc.build(byoc.partition_for(chain_module(["relu"]), "reference"))
    good = np.zeros((1, 8), "float32")
    assert compiled.run(x=good)[0].shape == (1, 8)
    with pytest.raises(InputError, match="takes 1 input"):
        compiled.run(good, good)
    with pytest.raises(InputError, match="input 'x': expected shape \\(1, 8\\), got \\(2, 8\\)"):
        compiled.run(np.zeros((2, 8), "float32"))
    with pytest.raises(InputError, match="input 'x': expected dtype float32, got float64"):
        compiled.run(np.zeros((1, 8)))
    with pytest.raises(InputError, match="unknown input"):
        compiled.run(y=good)


def test_failing_codegen_falls_back_to_the_host_or_fails_when_strict():
    backend = make_custom_backend("flaky")
    backend.codegen = type(backend.codegen)(
        name="flaky", version=1, serialize=lambda graph, constants, options: 1 / 0, deserialize=lambda payload, options: None
    )
    mod = chain_module(["matmul", "relu"])
    x = np.ones((1, 8), "float32")
    with registered(backend):
        partitioned = byoc.partition_for(mod, "flaky")
        expected = ("region flaky_0 \\(flaky\\): code generation failed: ZeroDivisionError.*falls back to the host: "
                    "its 2 op\\(s\\) from node 'matmul0' on and [0-9,]+ MACs run on the host instead \\(build with strict=True")
        with pytest.warns(UserWarning, match=expected):
            compiled = byoc.build(partitioned)
        assert compiled.artifacts == []
        # The report says what really runs: the region's ops are on the host, with the reason.
        report = compiled.report()
        assert report.regions == [] and report.offload_ratio_macs == 0.0
        assert byoc.report(partitioned).offload_ratio_macs == 1.0
        reasons = [r for reasons in report.host_reasons().values() for r in reasons]
        assert reasons and all("flaky_0 fell back at build time: code generation failed: ZeroDivisionError" in r for r in reasons)
        reference = byoc.build(byoc.partition_for(mod, "reference")).run(x)
        np.testing.assert_allclose(compiled.run(x)[0], reference[0], rtol=1e-6)
        with pytest.raises(BuildError, match="region flaky_0 \\(flaky\\): code generation failed"):
            byoc.build(partitioned, strict=True)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    path = tmp_path_factory.mktemp("artifact") / "bert.byoc"
    byoc.build(byoc.partition_for(small_module("bert_encoder"), "reference", max_ops_per_region=40)).export(path)
    return path


def _damaged(exported, tmp_path, name, mutate):
    data = bytearray(exported.read_bytes())
    mutate(data)
    path = tmp_path / name
    path.write_bytes(bytes(data))
    return path


def test_truncated_artifact_is_refused(exported, tmp_path):
    for fraction in (0.1, 0.5, 0.99):
        path = _damaged(exported, tmp_path, "cut.byoc", lambda d, f=fraction: d.__delitem__(slice(int(len(d) * f), None)))
        with pytest.raises(ArtifactError, match="truncated|not a byoc artifact|corrupt"):
            byoc.load(path)


def test_flipped_bytes_in_each_part_are_refused_naming_the_part(exported, tmp_path):
    with zipfile.ZipFile(exported) as archive:
        entries = {info.filename: info for info in archive.infolist()}
    for name, expected in [("host.so", "host library"), ("regions/reference_0.json", "region reference_0 \\(reference\\)")]:
        info = entries[name]
        start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)

        def flip(d, at=start + info.file_size // 2):
            d[at] ^= 0xFF

        with pytest.raises(ArtifactError, match=expected):
            byoc.load(_damaged(exported, tmp_path, "flip.byoc", flip))


@pytest.mark.parametrize("model_name, vendor", [("bert_encoder", "dnnl"), ("resnet18", "reference")])
def test_region_graphs_hold_only_json_types(model_name, vendor):
    """Graphs are checked by the compiled validator first, which takes nothing but JSON's own
    types; one TVM String (a node's name) sent every graph to jsonschema, 300x slower."""
    import jsonschema_rs

    from byoc.codegen_json.schema import schema
    from byoc.codegen_json.serialize import region_to_json
    from byoc.runtime_metadata.build import region_functions

    validator = jsonschema_rs.validator_for(schema())
    for symbol, backend, func in region_functions(byoc.partition_for(small_module(model_name), vendor)):
        graph, _ = region_to_json(func, symbol, backend)
        assert validator.is_valid(graph), symbol


def test_garbage_and_missing_artifacts(tmp_path):
    garbage = tmp_path / "g.byoc"
    garbage.write_bytes(b"definitely not a zip file")
    with pytest.raises(ArtifactError, match="not a byoc artifact"):
        byoc.load(garbage)
    with pytest.raises(ArtifactError, match="does not exist"):
        byoc.load(tmp_path / "missing.byoc")


def test_json_graph_failing_the_schema_is_refused_naming_region(exported, tmp_path):
    model = byoc.load(exported)
    artifact = model.artifacts[0]
    graph = json.loads(artifact.payload)
    graph["nodes"][0]["args"] = [{"node": 99}]
    artifact.payload = json.dumps(graph).encode()
    with pytest.raises(JsonGraphError, match="region reference_0 \\(reference\\).*node 99"):
        model.create_engines()


def test_missing_vendor_names_the_package(tmp_path, custom_backend):
    path = tmp_path / "m.byoc"
    byoc.build(byoc.partition_for(small_module("mlp"), "blobby")).export(path)
    script = f"import byoc; byoc.load({str(path)!r})"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode != 0
    assert "MissingVendorError" in result.stderr and "needs vendor 'blobby', registered by user code" in result.stderr
    assert issubclass(MissingVendorError, ArtifactError)


def test_a_vendor_whose_library_is_missing_here_is_refused_at_load_with_its_reason(tmp_path):
    """The vendor is registered, but says its library is not on this machine (`unavailable`):
    the load refuses before any run, with the vendor's own words, not an ImportError at the
    first call."""
    backend = make_c_backend("cloops_gone")
    path = tmp_path / "m.byoc"
    with registered(backend):
        byoc.build(byoc.partition_for(small_module("mlp"), "cloops_gone")).export(path)
        backend.unavailable = lambda: "libcloops is not installed: pip install cloops"
        try:
            with pytest.raises(MissingVendorError, match="needs vendor 'cloops_gone', which cannot run its regions here: "
                                                         "libcloops is not installed: pip install cloops"):
                byoc.load(path)
        finally:
            backend.unavailable = None


def test_corrupt_or_foreign_blobs_are_refused(custom_backend):
    compiled = byoc.build(byoc.partition_for(small_module("mlp"), "blobby"))
    artifact = compiled.artifacts[0]
    original = artifact.payload
    region = compiled.regions[artifact.symbol]
    cases = [
        (original[:-10], "truncated"),
        (original[:-5] + bytes(b ^ 0xFF for b in original[-5:]), "checksum mismatch"),
        (b"NOTABLOB" + original[8:], "bad magic"),
        (original.replace(b'"version": 2', b'"version": 7'), "version 7; this runtime reads versions \\[2\\]"),
        (original.replace(b"blobby-v1", b"blobby-v9"), "built for accelerator configuration 'blobby-v9'.*configured for 'blobby-v1'"),
    ]
    for payload, message in cases:
        artifact.payload = payload
        region.record = None
        with pytest.raises(CustomFormatError, match="region blobby_0 \\(blobby\\).*" + message):
            region.ensure_engine()
    artifact.payload = original


def test_engines_are_built_once_and_cached_on_disk(tmp_path):
    partitioned = byoc.partition_for(small_module("mlp"), "reference")
    cache = tmp_path / "cache"
    first = byoc.build(partitioned, cache_dir=cache, engines="eager")
    record = first.regions["reference_0"].record
    assert record.source == "built"
    first.run(**byoc.models.sample_inputs(small_model("mlp")))
    assert first.regions["reference_0"].record is record  # cached in memory
    second = byoc.build(partitioned, cache_dir=cache, engines="eager")
    assert second.regions["reference_0"].record.source == "disk cache"
    entries = list(cache.rglob("*.engine"))
    assert len(entries) == 1
    # A different input shape is a different region: never a cache hit by symbol name alone.
    batch2 = byoc.from_onnx(byoc.models.get("mlp", small=True, batch=2))
    other = byoc.build(byoc.partition_for(batch2, "reference"), cache_dir=cache, engines="eager")
    assert other.regions["reference_0"].record.source == "built"
    assert len(list(cache.rglob("*.engine"))) == 2


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_cache_entry_is_rebuilt(tmp_path, damage):
    partitioned = byoc.partition_for(small_module("mlp"), "reference")
    cache = tmp_path / "cache"
    byoc.build(partitioned, cache_dir=cache, engines="eager")
    (entry,) = cache.rglob("*.engine")
    data = bytearray(entry.read_bytes())
    if damage == "truncate":
        del data[len(data) // 2 :]
    else:
        data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="engine cache entry .* (truncated|corrupt).*rebuilding"):
        model = byoc.build(partitioned, cache_dir=cache, engines="eager")
    assert model.regions["reference_0"].record.source == "built"
    inputs = byoc.models.sample_inputs(small_model("mlp"))
    assert_fp32_close(model.run(**inputs), onnxruntime_outputs(small_model("mlp"), inputs))
    assert byoc.build(partitioned, cache_dir=cache, engines="eager").regions["reference_0"].record.source == "disk cache"


def test_embedded_engines_load_without_a_build(tmp_path):
    partitioned = byoc.partition_for(small_module("mlp"), "reference")
    byoc.build(partitioned, cache_dir=tmp_path / "build-cache", engines="eager")
    # From a warm cache: the engine is a loaded library, which TVM cannot save again.
    compiled = byoc.build(partitioned, cache_dir=tmp_path / "build-cache", engines="embed")
    assert compiled.regions["reference_0"].record.source == "disk cache"
    path = tmp_path / "mlp.byoc"
    compiled.export(path)
    assert compiled.inspect()["regions"][0]["embedded_engine"]["environment"] == tvm_engine.environment()
    # The engine reads its constants from the artifact's: it does not store them again.
    with zipfile.ZipFile(path) as archive:
        engine = archive.read("engines/reference_0.engine")
    largest = max((compiled.parts.store.get(name) for name in compiled.parts.artifacts[0].constants), key=lambda a: a.nbytes)
    assert largest.nbytes > 4096 and largest.tobytes()[:4096] not in engine
    loaded = byoc.load(path, cache_dir=tmp_path / "empty-cache", engines="eager", strict_engines=True)
    assert loaded.regions["reference_0"].record.source == "embedded"
    assert not list((tmp_path / "empty-cache").rglob("*.engine"))  # nothing was built, so nothing cached
    inputs = byoc.models.sample_inputs(small_model("mlp"))
    assert_fp32_close(loaded.run(**inputs), onnxruntime_outputs(small_model("mlp"), inputs))
    # Re-exported, the loaded model keeps its engines.
    loaded.export(tmp_path / "again.byoc")
    assert byoc.load(tmp_path / "again.byoc", engines="eager").regions["reference_0"].record.source == "embedded"


def test_an_engine_embedded_for_another_machine_is_rebuilt_or_refused(tmp_path):
    partitioned = byoc.partition_for(small_module("mlp"), "reference")
    compiled = byoc.build(partitioned, cache_dir=tmp_path / "cache", engines="embed")
    # As if the engine had been built on another architecture (for TensorRT: another GPU model).
    embedded = compiled.parts.engines["reference_0"]
    here = embedded.environment["platform"]
    compiled.parts.engines["reference_0"] = dataclasses.replace(embedded, environment={**embedded.environment,
                                                                                        "platform": "Linux-riscv64"})
    path = tmp_path / "mlp.byoc"
    compiled.export(path)
    differs = f"built for another machine \\(platform Linux-riscv64 there, {here} here\\)"
    with pytest.raises(EngineError, match=f"region reference_0 \\(reference\\): the engine embedded in the artifact was {differs}"):
        byoc.load(path, cache_dir=tmp_path / "other", engines="eager", strict_engines=True)
    with pytest.warns(UserWarning, match=f"{differs}; rebuilding it"):
        model = byoc.load(path, cache_dir=tmp_path / "other", engines="eager")
    assert model.regions["reference_0"].record.source == "built"
    inputs = byoc.models.sample_inputs(small_model("mlp"))
    assert_fp32_close(model.run(**inputs), onnxruntime_outputs(small_model("mlp"), inputs))


def test_an_embedded_engine_that_is_not_the_regions_or_does_not_load_is_rebuilt_or_refused(tmp_path):
    partitioned = byoc.partition_for(small_module("mlp"), "reference")
    compiled = byoc.build(partitioned, cache_dir=tmp_path / "cache", engines="embed")
    embedded = compiled.parts.engines["reference_0"]
    key = engine_cache_key(compiled.artifacts[0], compiled.store, compiled.regions["reference_0"].settings, embedded.environment)
    batch2 = byoc.from_onnx(byoc.models.get("mlp", small=True, batch=2))
    donor = byoc.build(byoc.partition_for(batch2, "reference"), cache_dir=tmp_path / "cache", engines="embed")
    cases = [
        # Another model's engine for the same symbol, written by a buggy tool with valid checksums.
        (donor.parts.engines["reference_0"], "belongs to another region or other build options"),
        # An engine of the right region that its vendor cannot read back.
        (dataclasses.replace(embedded, plan=pack_entry(key, b"not a library")), "could not be loaded"),
    ]
    for engine, problem in cases:
        compiled.parts.engines["reference_0"] = engine
        path = tmp_path / "mlp.byoc"
        compiled.export(path)
        with pytest.raises(EngineError, match=f"region reference_0 \\(reference\\): .*{problem}"):
            byoc.load(path, cache_dir=tmp_path / "other", engines="eager", strict_engines=True)
        with pytest.warns(UserWarning, match=f"{problem}.*; rebuilding it"):
            model = byoc.load(path, cache_dir=tmp_path / "other", engines="eager")
        assert model.regions["reference_0"].record.source in ("built", "disk cache")
        inputs = byoc.models.sample_inputs(small_model("mlp"))
        assert_fp32_close(model.run(**inputs), onnxruntime_outputs(small_model("mlp"), inputs))


def test_several_threads_run_one_model():
    model = small_model("resnet18")
    compiled = byoc.build(byoc.partition_for(small_module("resnet18"), "reference", max_ops_per_region=25))
    inputs = [byoc.models.sample_inputs(model, seed=s) for s in range(4)]
    expected = [onnxruntime_outputs(model, i) for i in inputs]
    errors = []

    def worker(index):
        try:
            for _ in range(3):
                assert_fp32_close(compiled.run(**inputs[index]), expected[index])
        except Exception as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_several_threads_run_a_c_model(c_backend):
    model = small_model("mlp")
    compiled = byoc.build(byoc.partition_for(small_module("mlp"), "cloops"))
    inputs = [byoc.models.sample_inputs(model, seed=s) for s in range(4)]
    expected = [onnxruntime_outputs(model, i) for i in inputs]
    results = {}

    def worker(index):
        results[index] = [compiled.run(**inputs[index]) for _ in range(20)]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for index in range(4):
        for outputs in results[index]:
            assert_fp32_close(outputs, expected[index])


def test_profile_reports_every_region_and_the_host():
    model = small_model("bert_encoder")
    compiled = byoc.build(byoc.partition_for(small_module("bert_encoder"), "reference", max_ops_per_region=30))
    profile = compiled.profile(**byoc.models.sample_inputs(model), repeat=3)
    parts = [row.part for row in profile.rows]
    assert parts == [a.symbol for a in compiled.artifacts] + ["host"]
    for row in profile.rows[:-1]:
        assert row.calls_per_run == 1 and row.execution_ms > 0 and row.init_ms > 0
    assert abs(sum(r.total_ms for r in profile.rows) - profile.median_run_ms) < 0.5 * profile.median_run_ms
    assert "transfer" in profile.to_table() and json.loads(profile.to_json())["runs"] == 3
    # The host's own kernels, one by one: the embedding gather stays on the host.
    kernels = {k.name: k for k in profile.host_kernels}
    assert kernels["take"].calls_per_run == 1 and not set(kernels) & set(parts)
    assert [k.ms for k in profile.host_kernels] == sorted((k.ms for k in profile.host_kernels), reverse=True)


def test_cli_compile_run_inspect(tmp_path, capsys):
    from byoc.cli import main

    artifact = tmp_path / "mlp.byoc"
    assert main(["compile", "mlp", "--small", "--vendor", "reference", "-o", str(artifact), "--embed-engines"]) == 0
    assert "1 region(s)" in capsys.readouterr().out
    assert main(["inspect", str(artifact)]) == 0
    assert f"reference_0: engine embedded, built for tvm {tvm_engine.environment()['tvm']}" in capsys.readouterr().out
    inputs = byoc.models.sample_inputs(small_model("mlp"))
    np.save(tmp_path / "x.npy", inputs["input"])
    argv = ["run", str(artifact), "--input", f"input={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "out")]
    argv += ["--profile", "--repeat", "2", "--strict-engines"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "output 0 (classifier/Softmax): shape (1, 10) float32" in out and "reference_0" in out
    assert_fp32_close([np.load(tmp_path / "out" / "output0.npy")], onnxruntime_outputs(small_model("mlp"), inputs))
    assert main(["run", str(artifact), "--input", "nope=x.npy"]) == 2
    assert main(["inspect", str(tmp_path / "x.npy")]) == 2


def test_a_c_region_checks_each_constant_it_is_given(tmp_path):
    """The constants' checks are a table in the region's C: a constant of another shape is named
    with its index and the shape the region was built for; the right ones initialise it."""
    import tvm

    from byoc.codegen_c.generate import CONSTANT_MISMATCH, init_symbol
    from byoc.runtime_metadata.compiler import export_shared

    compiled = byoc.build(byoc.partition_for(small_module("mlp"), "dnnl"))
    artifact = next(a for a in compiled.artifacts if a.linked_into_host)
    module = tvm.get_global_func("runtime.CSourceModuleCreate")(artifact.payload.decode(), "c", [artifact.symbol, init_symbol(artifact.symbol)], [])
    export_shared(module, str(tmp_path / "region.so"), [byoc.backend.registry.get_backend("dnnl").codegen])
    init = tvm.runtime.load_module(str(tmp_path / "region.so")).get_function(init_symbol(artifact.symbol))
    constants = [compiled.store.get(name) for name in artifact.constants]
    index = next(i for i, c in enumerate(constants) if c.ndim >= 1)
    wrong = list(constants)
    wrong[index] = np.zeros(constants[index].shape + (1,), constants[index].dtype)
    expected = f"{constants[index].dtype}{constants[index].shape}"
    with pytest.raises(Exception, match=f"constant {index} {CONSTANT_MISMATCH}, {re.escape(expected)}"):
        init(*[tvm.runtime.tensor(c) for c in wrong])
    init(*[tvm.runtime.tensor(c) for c in constants])


def test_outputs_keep_the_models_names_into_the_artifact(tmp_path, capsys):
    """A compiled model's outputs are named as the ONNX graph names them (they were output0,
    output1, ...), also loaded from its artifact and in `byoc inspect`; every kind of output (a
    region's, a host op's, an input passed through, a shape) keeps its place."""
    from onnx import TensorProto, helper

    from byoc.cli import main

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], np.linspace(-1, 1, 32, dtype=np.float32))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["logits"], name="mm"),
             helper.make_node("ArgMax", ["logits"], ["label"], name="am", axis=1, keepdims=0),
             helper.make_node("Identity", ["x"], ["x_again"], name="id"), helper.make_node("Shape", ["x"], ["shape"], name="sh")]
    outputs = [helper.make_tensor_value_info(name, dtype, shape) for name, dtype, shape in
               [("logits", TensorProto.FLOAT, [2, 4]), ("label", TensorProto.INT64, [2]), ("x_again", TensorProto.FLOAT, [2, 8]),
                ("shape", TensorProto.INT64, [2])]]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outputs, [w]), opset_imports=[helper.make_opsetid("", 17)])
    inputs = {"x": np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)}
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl"))
    names = ["logits", "label", "x_again", "shape"]
    assert [spec.name for spec in compiled.outputs] == names
    assert_fp32_close(compiled.run(inputs), onnxruntime_outputs(model, inputs))
    compiled.export(tmp_path / "m.byoc")
    assert [spec.name for spec in byoc.load(tmp_path / "m.byoc").outputs] == names
    assert main(["inspect", str(tmp_path / "m.byoc")]) == 0
    assert "outputs: logits (2, 4) float32, label (2,) int64, x_again (2, 8) float32, shape (2,) int64" in capsys.readouterr().out
