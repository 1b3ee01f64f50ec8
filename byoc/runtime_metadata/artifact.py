"""The artifact: one file that holds a compiled model, and the checks that make loading it safe.

A zip archive (stored, not compressed) with a manifest, the host library (host code and C
regions), each accelerator sub-module (JSON graph or custom blob), each distinct constant
once, and the engines built ahead for it (`build(..., engines="embed")`) with the machine each
was built for. The manifest follows a versioned JSON Schema (`manifest.schema.json`), checked on write
and on load, and records every file's SHA-256, every constant's dtype and shape, and for each
region what its code expects. Loading checks, before anything reaches the process:

- every file against its checksum, and no file that the manifest does not list;
- each constant's stored dtype, shape and content against its record and its content key;
- each region's constants, inputs and outputs against its sub-module (the JSON graph or the
  blob's container) and against the constants it is given;
- the host library's ELF structure against its size (a truncated library would otherwise
  kill the process with SIGBUS inside the dynamic loader);
- with `trusted_keys`, the manifest's Ed25519 signature (see `signing`).

Each refusal is an `ArtifactError` naming the artifact, the part and the region. Checksums
catch damage, not intent: an artifact is code (see `signing` for the trust model).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import tempfile
import zipfile
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import onnx
import tvm

from byoc.errors import ArtifactError, ByocError
from byoc.ir.dim_range import DimRange
from byoc.ir.shape_conditions import ShapeCheck, names_in
from byoc.ir.tail import ModelTail
from byoc.runtime_metadata.artifact_types import (
    DEFAULT_MAX_SHAPES,
    DEFAULT_SHAPE_MEMORY,
    FORMATS,
    DirectCall,
    EmbeddedEngine,
    ModelParts,
    RegionArtifact,
    SpecialisedRegion,
    TensorSpec,
)
from byoc.runtime_metadata.constants import ConstantStore, content_key
from byoc.runtime_metadata.elf import check_shared_library
from byoc.runtime_metadata.signing import SIGNATURE_FILE, PrivateKey, PublicKey, sign, verify

FORMAT = "byoc.artifact"
VERSION = 2
MANIFEST = "manifest.json"
HOST_LIBRARY = "host.so"
TAIL_FILE = "tail.onnx"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _spec(spec: TensorSpec) -> dict:
    return {"name": spec.name, "shape": list(spec.shape), "dtype": spec.dtype}


@functools.cache
def _validator() -> jsonschema.protocols.Validator:
    schema = json.loads(resources.files("byoc.runtime_metadata").joinpath("manifest.schema.json").read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def validate_manifest(manifest: Any, where: str) -> None:
    if isinstance(manifest, dict) and manifest.get("format") == FORMAT and manifest.get("version") != VERSION:
        raise ArtifactError(f"{where} is artifact version {manifest.get('version')!r}; this byoc reads version {VERSION}")
    error = jsonschema.exceptions.best_match(_validator().iter_errors(manifest))
    if error is not None:
        path = "/".join(str(p) for p in error.absolute_path) or "(document)"
        raise ArtifactError(f"{where}: the manifest fails its schema at {path}: {error.message}")


def _engine_file(symbol: str) -> str:
    return f"engines/{symbol}.engine"


def manifest_of(parts: ModelParts, files: dict[str, bytes]) -> dict:
    return {
        "format": FORMAT,
        "version": VERSION,
        "tvm_version": tvm.__version__,
        "target": parts.target,
        "inputs": [_spec(s) for s in parts.inputs],
        "outputs": [_spec(s) for s in parts.outputs],
        "vendors": parts.vendor_origins,
        "backend_options": parts.backend_options,
        "constants": parts.store.names(),
        "constant_specs": {key: {"shape": list(a.shape), "dtype": str(a.dtype)} for key, a in parts.store.contents().items()},
        "files": {name: _sha256(data) for name, data in files.items()},
        "host_library": {"file": HOST_LIBRARY, "machine": check_shared_library(parts.host_library, "the host library"),
                         "bytes": len(parts.host_library)},
        "regions": [
            {**a.describe(), "file": f"regions/{a.symbol}.{FORMATS[a.codegen].extension}",
             "inputs": [_spec(s) for s in a.inputs], "outputs": [_spec(s) for s in a.outputs],
             "constant_specs": [_spec(s) for s in a.constant_specs],
             **({"engine": {"file": _engine_file(a.symbol), "environment": parts.engines[a.symbol].environment}}
                if a.symbol in parts.engines else {})}
            for a in parts.artifacts
        ],
        "partition": parts.partition,
        "build_fallbacks": parts.build_fallbacks,
        **({"ignored_inputs": parts.ignored_inputs} if parts.ignored_inputs else {}),
        "direct_call": parts.direct_call.to_dict() if parts.direct_call is not None else None,
        **({"tail": {"file": TAIL_FILE, **parts.tail.info()}} if parts.tail is not None else {}),
        **({"dims": {name: r.to_list() for name, r in parts.dims.items()},
            "shape_checks": [check.to_dict() for check in parts.shape_checks],
            "dims_origin": parts.dims_origin,
            "specialised": [{**region.describe(), "template": _template_file(region.symbol) if region.template is not None else None}
                            for region in parts.specialised],
            "max_shapes": parts.max_shapes, "shape_memory": parts.shape_memory} if parts.dims else {}),
    }


def _template_file(symbol: str) -> str:
    return f"templates/{symbol}.py"


def write_artifact(parts: ModelParts, path: str | os.PathLike, sign_key: PrivateKey | None = None) -> None:
    """Write `parts` to one file, atomically: a reader, or a process killed while writing,
    never leaves anything but the previous file or the whole new one. With `sign_key`, the
    manifest is signed."""
    files: dict[str, bytes] = {HOST_LIBRARY: parts.host_library}
    for key, array in parts.store.contents().items():
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        files[f"constants/{key}.npy"] = buffer.getvalue()
    for artifact in parts.artifacts:
        files[f"regions/{artifact.symbol}.{FORMATS[artifact.codegen].extension}"] = artifact.payload
    symbols = {artifact.symbol for artifact in parts.artifacts}
    for region in parts.specialised:
        if region.template is not None:
            files[_template_file(region.symbol)] = region.template.encode()
    if parts.tail is not None:
        files[TAIL_FILE] = parts.tail.model
    for symbol, embedded in parts.engines.items():
        if symbol not in symbols:
            raise ArtifactError(f"an engine is embedded for region {symbol}, which the model does not have")
        files[_engine_file(symbol)] = embedded.plan
    manifest = manifest_of(parts, files)
    validate_manifest(manifest, "the artifact being written")
    text = json.dumps(manifest, indent=1, default=list).encode()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".partial") as tmp:
        try:
            with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as archive:
                archive.writestr(MANIFEST, text)
                if sign_key is not None:
                    archive.writestr(SIGNATURE_FILE, sign(text, sign_key))
                for name, data in files.items():
                    archive.writestr(name, data)
            tmp.flush()
            os.fsync(tmp.fileno())
        except BaseException:
            os.unlink(tmp.name)
            raise
    os.replace(tmp.name, path)


def _open(path: str | os.PathLike) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except FileNotFoundError:
        raise ArtifactError(f"artifact {os.fspath(path)!r} does not exist") from None
    except (zipfile.BadZipFile, OSError, ValueError) as error:
        raise ArtifactError(f"{os.fspath(path)!r} is not a byoc artifact, or it is truncated ({error})") from error


def _member(archive: zipfile.ZipFile, name: str, what: str, label: str) -> bytes:
    try:
        return archive.read(name)
    except KeyError:
        raise ArtifactError(f"{label}: {what} ({name}) is missing") from None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as error:
        raise ArtifactError(f"{label}: {what} ({name}) is corrupt or truncated ({error})") from error


def _manifest(archive: zipfile.ZipFile, label: str) -> tuple[dict, bytes]:
    text = _member(archive, MANIFEST, "the manifest", label)
    try:
        manifest = json.loads(text)
    except ValueError as error:
        raise ArtifactError(f"{label}: the manifest is corrupt ({error})") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{label} is not a byoc artifact (format {manifest.get('format') if isinstance(manifest, dict) else None!r})")
    validate_manifest(manifest, label)
    return manifest, text


def read_manifest(path: str | os.PathLike) -> dict:
    with _open(path) as archive:
        return _manifest(archive, f"artifact {os.fspath(path)!r}")[0]


class _Reader:
    """Reads and checks one artifact's parts."""

    def __init__(self, archive: zipfile.ZipFile, manifest: dict, label: str) -> None:
        self.archive = archive
        self.manifest = manifest
        self.label = label

    def read(self, name: str, what: str) -> bytes:
        data = _member(self.archive, name, what, self.label)
        if _sha256(data) != self.manifest["files"].get(name):
            raise ArtifactError(f"{self.label}: {what} ({name}) fails its checksum: the file is corrupt")
        return data

    def check_listing(self) -> None:
        listed = set(self.manifest["files"]) | {MANIFEST, SIGNATURE_FILE}
        unlisted = sorted(set(self.archive.namelist()) - listed)
        if unlisted:
            raise ArtifactError(f"{self.label}: holds file(s) its manifest does not list: {unlisted}")

    def tail(self) -> ModelTail | None:
        """The nodes that run after the compiled model, their ONNX model parsed (see byoc.ir.tail)."""
        entry = self.manifest.get("tail")
        if entry is None:
            return None
        data = self.read(entry["file"], "the tail")
        try:
            onnx.ModelProto.FromString(data)
        except Exception as error:  # a protobuf decode error
            raise ArtifactError(f"{self.label}: the tail ({entry['file']}) is not an ONNX model ({error})") from None
        return ModelTail.from_info(data, entry)

    def host_library(self) -> bytes:
        data = self.read(HOST_LIBRARY, "the host library")
        check_shared_library(data, f"{self.label}: the host library")
        return data

    def constants(self) -> ConstantStore:
        store = ConstantStore()
        specs = self.manifest["constant_specs"]
        for name, key in self.manifest["constants"].items():
            if key not in store.contents():
                what = f"constant {name!r}"
                array = self._array(self.read(f"constants/{key}.npy", what), what)
                spec = specs.get(key)
                if spec is None:
                    raise ArtifactError(f"{self.label}: {what} has no recorded dtype and shape")
                if str(array.dtype) != spec["dtype"] or list(array.shape) != spec["shape"]:
                    raise ArtifactError(f"{self.label}: {what} holds {array.dtype}{tuple(array.shape)}; the manifest records "
                                        f"{spec['dtype']}{tuple(spec['shape'])}")
                if content_key(array) != key:
                    raise ArtifactError(f"{self.label}: {what} does not hold the content its key names ({key})")
                store.put(key, array)
            store.bind(name, key)
        return store

    def _array(self, data: bytes, what: str) -> np.ndarray:
        try:
            return np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, OSError, EOFError) as error:
            raise ArtifactError(f"{self.label}: {what} is not a plain numpy array ({error})") from error

    def regions(self, store: ConstantStore) -> list[RegionArtifact]:
        artifacts = []
        symbols = [entry["symbol"] for entry in self.manifest["regions"]]
        if len(set(symbols)) != len(symbols):
            raise ArtifactError(f"{self.label}: the manifest lists a region twice: {symbols}")
        for entry in self.manifest["regions"]:
            where = f"{self.label}: region {entry['symbol']} ({entry['backend']})"
            artifact = RegionArtifact(
                symbol=entry["symbol"],
                backend=entry["backend"],
                codegen=entry["codegen"],
                payload=self.read(entry["file"], f"region {entry['symbol']} ({entry['backend']})"),
                constants=list(entry["constants"]),
                inputs=[TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in entry["inputs"]],
                outputs=[TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in entry["outputs"]],
                vendor_version=entry["vendor_version"],
                format_name=entry["format_name"],
                info=entry["info"],
                constant_specs=[TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in entry["constant_specs"]],
                settings=entry.get("settings"),
            )
            check_region(artifact, store, where)
            artifacts.append(artifact)
        return artifacts

    def specialised(self, artifacts: list[RegionArtifact], store: ConstantStore) -> list[SpecialisedRegion]:
        regions = []
        symbols = {a.symbol for a in artifacts}
        for entry in self.manifest.get("specialised", []):
            where = f"{self.label}: region {entry['symbol']} ({entry['backend']})"
            missing = sorted(set(entry["variants"].values()) - symbols)
            if missing:
                raise ArtifactError(f"{where}: its variant(s) {missing} are not in the artifact")
            unknown = sorted(set(entry["dims"]) - set(self.manifest["dims"]))
            if unknown:
                raise ArtifactError(f"{where}: uses dimension(s) {unknown} the model does not declare")
            absent = [name for name in entry["template_constants"] if name not in store.names()]
            if absent:
                raise ArtifactError(f"{where}: its template's constant {absent[0]!r} is not in the artifact")
            template = None
            if entry["template"] is not None:
                if entry["template"] != _template_file(entry["symbol"]):
                    raise ArtifactError(f"{where}: names the template {entry['template']}, which is not its own")
                template = self.read(entry["template"], f"the template of region {entry['symbol']}").decode()
            regions.append(SpecialisedRegion(entry["symbol"], entry["backend"], list(entry["dims"]),
                                             [list(d) for d in entry["input_dims"]], template,
                                             list(entry["template_constants"]), dict(entry["variants"]),
                                             bool(entry.get("symbolic", False)), str(entry.get("per_shape_reason", ""))))
        return regions

    def engines(self) -> dict[str, EmbeddedEngine]:
        embedded = {}
        for entry in self.manifest["regions"]:
            engine = entry.get("engine")
            if engine is not None:
                if engine["file"] != _engine_file(entry["symbol"]):
                    raise ArtifactError(f"{self.label}: region {entry['symbol']} ({entry['backend']}) names the engine "
                                        f"{engine['file']}, which is not its own")
                what = f"the embedded engine of region {entry['symbol']} ({entry['backend']})"
                embedded[entry["symbol"]] = EmbeddedEngine(self.read(engine["file"], what), dict(engine["environment"]))
        return embedded


def check_region(artifact: RegionArtifact, store: ConstantStore, where: str) -> None:
    """Raise ArtifactError, naming `where`, unless the region's constants, inputs and outputs
    agree with its sub-module and with the constants it is given."""
    if [s.name for s in artifact.constant_specs] != artifact.constants:
        raise ArtifactError(f"{where}: records what its code expects of {len(artifact.constant_specs)} constant(s), "
                            f"but is given {len(artifact.constants)}")
    names = store.names()
    for spec in artifact.constant_specs:
        if spec.name not in names:
            raise ArtifactError(f"{where}: constant {spec.name!r} is not in the artifact")
        array = store.get(spec.name)
        if str(array.dtype) != spec.dtype or tuple(array.shape) != spec.shape:
            raise ArtifactError(f"{where}: constant {spec.name!r} is {array.dtype}{tuple(array.shape)}; "
                                f"the region's code expects {spec.dtype}{spec.shape}")
    try:
        FORMATS[artifact.codegen].check_code(artifact.payload, artifact.signature(), where)
    except (ByocError, ValueError) as error:
        raise ArtifactError(str(error)) from error


def _shape_checks(manifest: dict, label: str) -> list[ShapeCheck]:
    """The recorded conditions on the model's dimensions, each reading only dimensions it has."""
    checks = []
    for entry in manifest.get("shape_checks", []):
        try:
            check = ShapeCheck.from_dict(entry)
        except (KeyError, TypeError, ValueError) as error:
            raise ArtifactError(f"{label}: a shape check is malformed ({error}): {entry!r}") from None
        unknown = sorted(names_in(check.condition).union(*(names_in(e) for _, e in check.shown)) - set(manifest.get("dims", {})))
        if unknown:
            raise ArtifactError(f"{label}: the shape check of node {check.node!r} reads dimension(s) {unknown} the model does not have")
        checks.append(check)
    return checks


def read_artifact(path: str | os.PathLike, trusted_keys: Iterable[PublicKey] | None = None) -> tuple[ModelParts, dict]:
    """The parts of the artifact at `path`, every check passed, and its manifest."""
    label = f"artifact {os.fspath(path)!r}"
    with _open(path) as archive:
        manifest, text = _manifest(archive, label)
        if trusted_keys is not None:
            signature = archive.read(SIGNATURE_FILE) if SIGNATURE_FILE in archive.namelist() else None
            verify(text, signature, trusted_keys, label)
        reader = _Reader(archive, manifest, label)
        reader.check_listing()
        host_library = reader.host_library()
        store = reader.constants()
        artifacts = reader.regions(store)
        specialised = reader.specialised(artifacts, store)
        engines = reader.engines()
        tail = reader.tail()
    parts = ModelParts(
        host_library=host_library,
        artifacts=artifacts,
        store=store,
        inputs=[TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in manifest["inputs"]],
        outputs=[TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in manifest["outputs"]],
        target=manifest["target"],
        vendor_origins=manifest["vendors"],
        backend_options=manifest["backend_options"],
        partition=manifest["partition"],
        build_fallbacks=manifest["build_fallbacks"],
        direct_call=DirectCall.from_dict(manifest["direct_call"]) if manifest.get("direct_call") else None,
        engines=engines,
        dims={name: DimRange(*values) for name, values in manifest.get("dims", {}).items()},
        shape_checks=_shape_checks(manifest, label),
        dims_origin=dict(manifest.get("dims_origin", {})),
        tail=tail,
        specialised=specialised,
        max_shapes=manifest.get("max_shapes", DEFAULT_MAX_SHAPES),
        shape_memory=manifest.get("shape_memory", DEFAULT_SHAPE_MEMORY),
        ignored_inputs=list(manifest.get("ignored_inputs", [])),
    )
    if parts.direct_call is not None:
        parts.direct_call.check(parts.artifacts, parts.inputs, parts.outputs, label, parts.specialised)
    return parts, manifest
