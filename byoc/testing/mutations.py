"""Artifacts with the wrong meaning, as a buggy writer or an older byoc would write them.

Each mutant changes what an artifact means (a constant's shape or dtype, a region's inputs, the
host library, the manifest's records) and then recomputes every checksum, so that only the
meaning is wrong. Every mutant is loaded and run in a separate process on the original model's
inputs: it must be refused with an `ArtifactError`, or run and give the original's outputs
(harmless: the part it changed is not used to compute them). A crash, another error, or a
different result is a finding.
"""

from __future__ import annotations

import copy
import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from byoc.runtime_metadata.constants import content_key

REFUSED, HARMLESS, WRONG, CRASHED, UNCLEAR = "refused", "harmless", "wrong result", "crashed", "unclear error"


class ArtifactFiles:
    """An artifact's files and manifest, rewritten with every checksum recomputed."""

    def __init__(self, path: str | os.PathLike) -> None:
        with zipfile.ZipFile(path) as archive:
            self.files = {name: archive.read(name) for name in archive.namelist() if name not in ("manifest.json", "manifest.sig")}
            self.manifest = json.loads(archive.read("manifest.json"))
        self.unlisted: dict[str, bytes] = {}  # written to the archive, left out of the manifest

    def copy(self) -> ArtifactFiles:
        other = object.__new__(ArtifactFiles)
        other.files = dict(self.files)
        other.manifest = copy.deepcopy(self.manifest)
        other.unlisted = dict(self.unlisted)
        return other

    def write(self, path: str | os.PathLike) -> None:
        self.manifest["files"] = {name: hashlib.sha256(data).hexdigest() for name, data in self.files.items()}
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
            archive.writestr("manifest.json", json.dumps(self.manifest, indent=1))
            for name, data in {**self.files, **self.unlisted}.items():
                archive.writestr(name, data)

    # ----------------------------------------------------------- constants
    def largest_constant(self) -> tuple[str, str] | None:
        """(name, key) of the largest constant, or None."""
        specs = self.manifest["constant_specs"]
        named = sorted(self.manifest["constants"].items(), key=lambda item: -int(np.prod(specs[item[1]]["shape"] or [1])))
        return named[0] if named else None

    def array(self, key: str) -> np.ndarray:
        return np.load(io.BytesIO(self.files[f"constants/{key}.npy"]), allow_pickle=False)

    def replace_constant(self, key: str, array: np.ndarray, rekey: bool, record: bool, regions: bool) -> None:
        """Store `array` for the content `key`: under a new content key (`rekey`), with the
        manifest's record of its dtype and shape updated (`record`), and with what regions
        expect of it updated too (`regions`)."""
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        new_key = content_key(array) if rekey else key
        del self.files[f"constants/{key}.npy"]
        self.files[f"constants/{new_key}.npy"] = buffer.getvalue()
        spec = self.manifest["constant_specs"].pop(key)
        self.manifest["constant_specs"][new_key] = {"shape": list(array.shape), "dtype": str(array.dtype)} if record else spec
        names = [n for n, k in self.manifest["constants"].items() if k == key]
        for name in names:
            self.manifest["constants"][name] = new_key
        if regions:
            for region in self.manifest["regions"]:
                for expected in region["constant_specs"]:
                    if expected["name"] in names:
                        expected.update(shape=list(array.shape), dtype=str(array.dtype))

    # -------------------------------------------------------------- regions
    def regions(self, codegen: str | None = None) -> list[dict]:
        return [r for r in self.manifest["regions"] if codegen is None or r["codegen"] == codegen]

    def region(self, symbol: str) -> dict:
        return next(r for r in self.manifest["regions"] if r["symbol"] == symbol)


@dataclass(frozen=True)
class Mutant:
    name: str
    mutate: Callable[[ArtifactFiles], None]


def _widen(spec: dict) -> None:
    spec["shape"][-1] += 1


def _patch_machine(files: ArtifactFiles) -> None:
    library = bytearray(files.files["host.so"])
    machine = struct.unpack_from("<H", library, 18)[0]
    struct.pack_into("<H", library, 18, 183 if machine == 62 else 62)
    files.files["host.so"] = bytes(library)


def _drop_region(files: ArtifactFiles, region: dict) -> None:
    files.manifest["regions"].remove(region)
    del files.files[region["file"]]


def _rename_region(files: ArtifactFiles, region: dict) -> None:
    old = region["file"]
    region["symbol"] += "_renamed"
    region["file"] = old.replace(".", "_renamed.", 1)
    files.files[region["file"]] = files.files.pop(old)


def _graph_input_shape(files: ArtifactFiles, region: dict, also_manifest: bool) -> None:
    graph = json.loads(files.files[region["file"]])
    graph["inputs"][0]["shape"][-1] += 1
    files.files[region["file"]] = json.dumps(graph).encode()
    if also_manifest:
        region["inputs"][0]["shape"][-1] += 1


def _blob_header_inputs(files: ArtifactFiles, region: dict) -> None:
    from byoc.custom_formats.container import MAGIC

    blob = files.files[region["file"]]
    (length,) = struct.unpack_from("<I", blob, len(MAGIC))
    start = len(MAGIC) + 4
    header = json.loads(blob[start : start + length])
    header["inputs"][0][0][-1] += 1
    encoded = json.dumps(header, sort_keys=True).encode()
    files.files[region["file"]] = MAGIC + struct.pack("<I", len(encoded)) + encoded + blob[start + length :]


def _truncate_payload(files: ArtifactFiles, region: dict) -> None:
    data = files.files[region["file"]]
    files.files[region["file"]] = data[: len(data) * 3 // 4]


def _swap_payloads(files: ArtifactFiles, first: dict, second: dict) -> None:
    files.files[first["file"]], files.files[second["file"]] = files.files[second["file"]], files.files[first["file"]]


def _engine_mutants(files: ArtifactFiles) -> list[Mutant]:
    """Mutants of engines embedded at build time: each must be refused, or rebuilt (with a
    warning) to the original's outputs, never run as another region's engine."""
    embedding = [r for r in files.regions() if "engine" in r]
    if not embedding:
        return []
    symbol = embedding[0]["symbol"]

    def pick(f: ArtifactFiles) -> dict:
        return f.region(symbol)

    def truncate(f: ArtifactFiles) -> None:
        name = pick(f)["engine"]["file"]
        f.files[name] = f.files[name][: len(f.files[name]) // 2]

    def rename(f: ArtifactFiles) -> None:
        engine = pick(f)["engine"]
        f.files["engines/elsewhere.engine"] = f.files.pop(engine["file"])
        engine["file"] = "engines/elsewhere.engine"

    found = [
        Mutant(f"region {symbol}: embedded engine truncated", truncate),
        Mutant(f"region {symbol}: embedded engine built for another machine",
               lambda f: pick(f)["engine"]["environment"].update(platform="Plan9-mips")),
        Mutant(f"region {symbol}: embedded engine under another region's file name", rename),
    ]
    if len(embedding) >= 2:
        other = embedding[1]["symbol"]

        def swap(f: ArtifactFiles) -> None:
            first, second = pick(f)["engine"]["file"], f.region(other)["engine"]["file"]
            f.files[first], f.files[second] = f.files[second], f.files[first]

        found.append(Mutant(f"regions {symbol} and {other}: embedded engines swapped", swap))
    return found


def mutants(files: ArtifactFiles, other_host_library: bytes | None = None) -> list[Mutant]:
    """The mutants this artifact allows (a constant-less artifact has no constant mutants)."""
    found = [
        Mutant("manifest: an unknown version", lambda f: f.manifest.update(version=3)),
        Mutant("manifest: an input dtype outside the schema", lambda f: f.manifest["inputs"][0].update(dtype="float99")),
        Mutant("manifest: a listed file that nothing reads", lambda f: f.files.update({"extra.bin": b"unused"})),
        Mutant("manifest: a file it does not list", lambda f: f.unlisted.update({"extra.bin": b"unlisted"})),
        Mutant("manifest: the model's input shape changed", lambda f: _widen(f.manifest["inputs"][0])),
        Mutant("host library: truncated to half", lambda f: f.files.update({"host.so": f.files["host.so"][: len(f.files["host.so"]) // 2]})),
        Mutant("host library: built for another machine", _patch_machine),
        Mutant("host library: not a library", lambda f: f.files.update({"host.so": b"\x7fELF" + bytes(range(256)) * 8})),
    ]
    if files.manifest["partition"] is not None:
        found.append(Mutant("manifest: a malformed partition record", lambda f: f.manifest.update(partition={"regions": 5})))
    if other_host_library is not None:
        found.append(Mutant("host library: another model's", lambda f: f.files.update({"host.so": other_host_library})))
    if "tail" in files.manifest:
        found += [
            Mutant("tail: reads a tensor the compiled part does not give", lambda f: f.manifest["tail"]["inputs"].append("elsewhere")),
            Mutant("tail: not an ONNX model", lambda f: f.files.update({"tail.onnx": b"\x08\x07garbage"})),
            Mutant("tail: missing", lambda f: f.files.pop("tail.onnx")),
        ]
    largest = files.largest_constant()
    if largest is not None:
        _, key = largest

        def half(f: ArtifactFiles) -> np.ndarray:
            return f.array(key).reshape(-1)[: max(1, f.array(key).size // 2)].copy()

        found += [
            Mutant("constant: half its length, records kept", lambda f: f.replace_constant(key, half(f), rekey=True, record=False, regions=False)),
            Mutant("constant: half its length, its record rewritten", lambda f: f.replace_constant(key, half(f), rekey=True, record=True, regions=False)),
            Mutant("constant: half its length, every record rewritten", lambda f: f.replace_constant(key, half(f), rekey=True, record=True, regions=True)),
            Mutant("constant: float64, every record rewritten",
                   lambda f: f.replace_constant(key, f.array(key).astype(np.float64), rekey=True, record=True, regions=True)),
            Mutant("constant: other values under the old key", lambda f: f.replace_constant(key, f.array(key) + 1, rekey=False, record=True, regions=False)),
            Mutant("constant: missing", lambda f: f.files.pop(f"constants/{key}.npy")),
        ]
    for region in files.regions()[:1]:
        symbol = region["symbol"]

        def pick(f: ArtifactFiles, symbol: str = symbol) -> dict:
            return f.region(symbol)

        found += [
            Mutant(f"region {symbol}: dropped from the manifest", lambda f, pick=pick: _drop_region(f, pick(f))),
            Mutant(f"region {symbol}: renamed", lambda f, pick=pick: _rename_region(f, pick(f))),
            Mutant(f"region {symbol}: input shape changed in the manifest", lambda f, pick=pick: _widen(pick(f)["inputs"][0])),
            Mutant(f"region {symbol}: payload truncated", lambda f, pick=pick: _truncate_payload(f, pick(f))),
        ]
        if region["codegen"] == "json":
            found += [
                Mutant(f"region {symbol}: graph input shape changed", lambda f, pick=pick: _graph_input_shape(f, pick(f), False)),
                Mutant(f"region {symbol}: graph and manifest input shape changed", lambda f, pick=pick: _graph_input_shape(f, pick(f), True)),
            ]
        if region["codegen"] == "custom":
            found.append(Mutant(f"region {symbol}: blob header inputs changed", lambda f, pick=pick: _blob_header_inputs(f, pick(f))))
    same_kind = [r for r in files.regions() if r["codegen"] == files.regions()[0]["codegen"]] if files.regions() else []
    if len(same_kind) >= 2:
        first, second = same_kind[0]["symbol"], same_kind[1]["symbol"]
        found.append(Mutant(f"regions {first} and {second}: payloads swapped",
                            lambda f: _swap_payloads(f, f.region(first), f.region(second))))
    return found + _engine_mutants(files)


@dataclass
class MutantResult:
    artifact: str
    mutant: str
    outcome: str
    detail: str


_RUNNER = """
import json, sys, numpy as np, byoc
from byoc.errors import ArtifactError
directory, names = sys.argv[1], sys.argv[2:]
with np.load(f"{directory}/inputs.npz") as data:
    inputs = {k: data[k] for k in data.files}
with np.load(f"{directory}/outputs.npz") as data:
    expected = [data[f"arr_{i}"] for i in range(len(data.files))]
for name in names:
    try:
        outputs = byoc.load(f"{directory}/{name}.byoc").run(**inputs)
    except ArtifactError as error:
        result = ["refused", f"{type(error).__name__}: {error}"]
    except Exception as error:
        result = ["unclear error", f"{type(error).__name__}: {error}"]
    else:
        same = len(outputs) == len(expected) and all(o.shape == e.shape and np.array_equal(o, e) for o, e in zip(outputs, expected))
        result = ["harmless", "ran and gave the original outputs"] if same else ["wrong result", "ran and gave other outputs"]
    print(json.dumps([name, *result]), flush=True)
"""


def run_mutants(original: str | os.PathLike, inputs: dict[str, np.ndarray], directory: str | os.PathLike,
                other_host_library: bytes | None = None) -> list[MutantResult]:
    """Write every mutant of `original` under `directory` and load and run each in a fresh
    process (one process for all, a new one after a crash) on `inputs`."""
    import byoc

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    expected = byoc.load(original).run(**inputs)
    np.savez(directory / "inputs.npz", **inputs)
    np.savez(directory / "outputs.npz", *expected)
    base = ArtifactFiles(original)
    names: dict[str, str] = {}
    for index, mutant in enumerate(mutants(base, other_host_library)):
        files = base.copy()
        mutant.mutate(files)
        stem = f"mutant{index:02d}"
        files.write(directory / f"{stem}.byoc")
        names[stem] = mutant.name
    results: dict[str, MutantResult] = {}
    pending = list(names)
    label = os.path.basename(os.fspath(original))
    while pending:
        process = subprocess.run([sys.executable, "-c", _RUNNER, str(directory), *pending], capture_output=True, text=True,
                                 env=os.environ.copy())
        for line in process.stdout.splitlines():
            stem, outcome, detail = json.loads(line)
            results[stem] = MutantResult(label, names[stem], outcome, detail)
        pending = [stem for stem in pending if stem not in results]
        if pending and process.returncode == 0:
            raise RuntimeError(f"the mutant runner stopped early: {process.stderr[-2000:]}")
        if pending:  # the first pending mutant took the process down
            stem = pending.pop(0)
            results[stem] = MutantResult(label, names[stem], CRASHED, f"exit status {process.returncode}: {process.stderr.strip()[-300:]}")
    return [results[stem] for stem in names]
