"""Artifacts that cannot hurt: mutants with recomputed checksums and the wrong meaning, signed
artifacts, engine-cache entries, threads and processes sharing a model or a cache, and a process
killed while it writes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections import Counter

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import byoc
from byoc import models as zoo
from byoc.errors import ArtifactError
from byoc.runtime_metadata.engine_cache import EngineCache
from byoc.testing.kit import onnxruntime_session
from byoc.testing.mutations import CRASHED, HARMLESS, REFUSED, UNCLEAR, WRONG, run_mutants

from conftest import small_model, small_module

VENDORS = ["reference", "dnnl", "onnxruntime", "vitis_ai", "ethos_u"]


def _options(vendor: str) -> dict:
    if byoc.get_backend(vendor).tolerance.precision == "int8":
        return {"calibration": [zoo.sample_inputs(small_model("mlp"), seed=s) for s in range(2)]}
    return {}


@pytest.fixture(scope="module")
def other_host_library(tmp_path_factory) -> bytes:
    path = tmp_path_factory.mktemp("other") / "other.byoc"
    byoc.build(byoc.partition_for(small_module("mlp"), "reference", max_ops_per_region=2)).export(path)
    return zipfile.ZipFile(path).read("host.so")


@pytest.mark.parametrize("vendor", VENDORS)
def test_mutants_are_refused_or_harmless(vendor, tmp_path, other_host_library):
    """Every mutant (a constant of half its length or of float64, a region dropped or renamed,
    a payload of another region, the host library truncated or another model's, ...) with
    recomputed checksums is refused with an ArtifactError or runs to the original's outputs."""
    original = tmp_path / "model.byoc"
    # Engines embedded where the vendor can save them (reference): their mutants too.
    byoc.build(byoc.partition_for(small_module("mlp"), vendor, max_ops_per_region=3, **_options(vendor)),
               engines="embed").export(original)
    results = run_mutants(original, zoo.sample_inputs(small_model("mlp"), seed=7), tmp_path / "mutants", other_host_library)
    outcomes = Counter(r.outcome for r in results)
    findings = [f"{r.mutant}: {r.outcome}: {r.detail}" for r in results if r.outcome in (WRONG, CRASHED, UNCLEAR)]
    assert not findings, "\n".join(findings)
    assert outcomes[REFUSED] >= 14 and outcomes[REFUSED] + outcomes[HARMLESS] == len(results), outcomes
    refusals = [r.detail for r in results if r.outcome == REFUSED]
    assert all(str(original.parent / "mutants") in d or "region" in d or "host library" in d for d in refusals), refusals


def test_models_of_one_architecture_keep_their_own_weights_in_one_process():
    """Two builds with different weights compile to the same host library bytes; each keeps its
    own C regions' constants."""
    first, second = (zoo.get("mlp", small=True, seed=seed) for seed in (1, 2))
    inputs = zoo.sample_inputs(first, seed=0)
    compiled = [byoc.build(byoc.partition_for(byoc.from_onnx(m), "dnnl")) for m in (first, second)]
    assert compiled[0].parts.host_library == compiled[1].parts.host_library
    want = [onnxruntime_session(m).run(None, inputs)[0] for m in (first, second)]
    for model, expected in zip(compiled, want):
        np.testing.assert_allclose(model.run(**inputs)[0], expected, rtol=1e-4, atol=1e-5)
    assert not np.allclose(want[0], want[1])


def test_signed_artifacts(tmp_path):
    key, stranger = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    compiled = byoc.build(byoc.partition_for(small_module("mlp"), "dnnl"))
    signed, unsigned = tmp_path / "signed.byoc", tmp_path / "unsigned.byoc"
    compiled.export(signed, sign_key=key)
    compiled.export(unsigned)
    inputs = zoo.sample_inputs(small_model("mlp"))
    loaded = byoc.load(signed, trusted_keys=[key.public_key()])
    np.testing.assert_array_equal(loaded.run(**inputs)[0], compiled.run(**inputs)[0])
    with pytest.raises(ArtifactError, match="is not signed, and trusted keys were given"):
        byoc.load(unsigned, trusted_keys=[key.public_key()])
    with pytest.raises(ArtifactError, match="signature matches none of the 1 trusted key"):
        byoc.load(signed, trusted_keys=[stranger.public_key()])
    byoc.load(unsigned)  # without trusted keys, nothing is asked
    # A signed manifest whose files were swapped afterwards fails its checksums.
    data = zipfile.ZipFile(signed)
    tampered = tmp_path / "tampered.byoc"
    library = bytearray(data.read("host.so"))
    library[len(library) // 2] ^= 0xFF
    with zipfile.ZipFile(tampered, "w") as out:
        for name in data.namelist():
            out.writestr(name, bytes(library) if name == "host.so" else data.read(name))
    with pytest.raises(ArtifactError, match="host.so\\) fails its checksum"):
        byoc.load(tampered, trusted_keys=[key.public_key()])


def test_cache_entries_of_another_region_or_with_garbage_are_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    partitioned = byoc.partition_for(small_module("mlp"), "reference")
    inputs = zoo.sample_inputs(small_model("mlp"))
    expected = byoc.build(partitioned, cache_dir=cache, engines="eager").run(**inputs)[0]
    (entry,) = (cache / "reference").glob("*.engine")
    store = EngineCache(cache)
    key = entry.stem
    donor = byoc.build(byoc.partition_for(small_module("mlp"), "reference", max_ops_per_region=2), cache_dir=tmp_path / "donor",
                       engines="eager")
    donor_entry = next((tmp_path / "donor" / "reference").glob("*.engine"))
    for damage, message in [
        (lambda: entry.write_bytes(donor_entry.read_bytes()), "belongs to another region"),
        (lambda: store.put("reference", key, os.urandom(4096)), "cached engine could not be loaded"),
    ]:
        damage()
        with pytest.warns(UserWarning, match=message):
            model = byoc.build(partitioned, cache_dir=cache, engines="eager")
        assert model.regions["reference_0"].record.source == "built"
        np.testing.assert_array_equal(model.run(**inputs)[0], expected)
    del donor


def test_eight_threads_give_bit_identical_outputs():
    mod = small_module("mlp")
    compiled = byoc.build(byoc.partition_for(mod, ["onnxruntime", "dnnl"], max_ops_per_region=3))
    assert {a.backend for a in compiled.artifacts} == {"onnxruntime", "dnnl"} or len(compiled.artifacts) > 1
    samples = [zoo.sample_inputs(small_model("mlp"), seed=s) for s in range(4)]
    reference = [compiled.run(**s)[0] for s in samples]
    mismatches: list[str] = []

    def worker(index: int) -> None:
        for run in range(200):
            sample = (index + run) % len(samples)
            if not np.array_equal(compiled.run(**samples[sample])[0], reference[sample]):
                mismatches.append(f"thread {index} run {run}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not mismatches, mismatches[:5]


_BUILD_ENGINES = """
import sys, numpy as np, byoc
model = byoc.load(sys.argv[1], cache_dir=sys.argv[2], engines="eager")
inputs = dict(np.load(sys.argv[3]))
np.save(sys.argv[4], model.run(**inputs)[0])
"""


def test_two_processes_building_one_engine_into_one_cache(tmp_path):
    artifact, cache, inputs = tmp_path / "model.byoc", tmp_path / "cache", tmp_path / "inputs.npz"
    compiled = byoc.build(byoc.partition_for(small_module("resnet18"), "reference"), cache_dir=tmp_path / "unused")
    compiled.export(artifact)
    sample = zoo.sample_inputs(small_model("resnet18"))
    np.savez(inputs, **sample)
    processes = [subprocess.Popen([sys.executable, "-c", _BUILD_ENGINES, str(artifact), str(cache), str(inputs), str(tmp_path / f"out{i}.npy")])
                 for i in range(2)]
    assert [p.wait(timeout=300) for p in processes] == [0, 0]
    expected = compiled.run(**sample)[0]
    for i in range(2):
        np.testing.assert_array_equal(np.load(tmp_path / f"out{i}.npy"), expected)
    entries = list((cache / "reference").iterdir())
    assert len(entries) == 1 and entries[0].suffix == ".engine", entries


_WRITE_FOREVER = """
import sys, byoc
from byoc.runtime_metadata.engine_cache import EngineCache
kind, path = sys.argv[1], sys.argv[2]
if kind == "export":
    model = byoc.load(path)  # the artifact the test wrote, written again and again over itself
    print("ready", flush=True)
    while True:
        model.export(path)
else:
    cache = EngineCache(path)
    print("ready", flush=True)
    size = 1
    while True:
        size = size * 2 % (64 << 20) or 1
        cache.put("reference", "0" * 64, b"x" * size)
"""


@pytest.mark.parametrize("kind", ["export", "cache"])
def test_a_kill_while_writing_leaves_the_previous_file_whole(kind, tmp_path):
    target = tmp_path / ("model.byoc" if kind == "export" else "cache")
    if kind == "export":
        byoc.build(byoc.partition_for(byoc.from_onnx(zoo.get("resnet18", small=True)), "dnnl")).export(target)
    else:
        EngineCache(target).put("reference", "0" * 64, b"previous")
    writer = subprocess.Popen([sys.executable, "-c", _WRITE_FOREVER, kind, str(target)], stdout=subprocess.PIPE, text=True)
    assert writer.stdout.readline().strip() == "ready"
    time.sleep(1.5)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    if kind == "export":
        model = byoc.load(target)
        sample = zoo.sample_inputs(small_model("resnet18"))
        assert model.run(**sample)[0].shape == (1, 1000)
    else:
        content = EngineCache(target).get("reference", "0" * 64)
        assert content == b"previous" or set(content) == {ord("x")}
