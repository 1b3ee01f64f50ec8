"""The artifact: one file that holds a compiled model.

A zip archive (stored, not compressed) with a manifest, the host library (host code and C
regions), each accelerator sub-module (JSON graph or custom blob) and each distinct constant
once. Every file's SHA-256 is in the manifest and is checked on load, so a truncated or corrupt
artifact is refused with an error naming the part (and region) that is damaged, before anything
is loaded into the process.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import tvm

from byoc.backend.registry import get_backend, list_backends
from byoc.errors import ArtifactError, MissingVendorError, UnknownBackendError
from byoc.runtime_metadata.artifact_types import RegionArtifact, TensorSpec
from byoc.runtime_metadata.constants import ConstantStore
from byoc.runtime_metadata.engine_cache import EngineCache, default_cache_dir
from byoc.runtime_metadata.model import CompiledModel

FORMAT = "byoc.artifact"
VERSION = 1
_EXTENSIONS = {"json": "json", "c": "c", "custom": "bin"}


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_artifact(model: CompiledModel, path: str | os.PathLike) -> None:
    files: dict[str, bytes] = {"host.so": model.host_library}
    for key, array in model.store.contents().items():
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        files[f"constants/{key}.npy"] = buffer.getvalue()
    regions = []
    for artifact in model.artifacts:
        name = f"regions/{artifact.symbol}.{_EXTENSIONS[artifact.codegen]}"
        files[name] = artifact.payload
        regions.append({**artifact.describe(), "file": name})
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "tvm_version": tvm.__version__,
        "target": model.target,
        "inputs": [vars(s) for s in model.inputs],
        "outputs": [vars(s) for s in model.outputs],
        "vendors": model.vendor_origins,
        "backend_options": model.backend_options,
        "constants": model.store.names(),
        "files": {name: _sha256(data) for name, data in files.items()},
        "regions": regions,
        "partition": model.partition,
        "build_fallbacks": model.build_fallbacks,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".partial") as tmp:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as archive:
            archive.writestr("manifest.json", json.dumps(manifest, indent=1, default=list))
            for name, data in files.items():
                archive.writestr(name, data)
    os.replace(tmp.name, path)


def read_manifest(path: str | os.PathLike) -> dict:
    with _open(path) as archive:
        return _manifest(archive, path)


def _open(path: str | os.PathLike) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except FileNotFoundError:
        raise ArtifactError(f"artifact {os.fspath(path)!r} does not exist") from None
    except (zipfile.BadZipFile, OSError) as error:
        raise ArtifactError(f"{os.fspath(path)!r} is not a byoc artifact, or it is truncated ({error})") from error


def _manifest(archive: zipfile.ZipFile, path) -> dict:
    try:
        manifest = json.loads(archive.read("manifest.json"))
    except KeyError:
        raise ArtifactError(f"{os.fspath(path)!r} has no manifest: not a byoc artifact") from None
    except (zipfile.BadZipFile, ValueError, OSError) as error:
        raise ArtifactError(f"artifact {os.fspath(path)!r}: the manifest is corrupt ({error})") from error
    if manifest.get("format") != FORMAT:
        raise ArtifactError(f"{os.fspath(path)!r} is not a byoc artifact (format {manifest.get('format')!r})")
    if manifest.get("version") != VERSION:
        raise ArtifactError(f"artifact {os.fspath(path)!r} is version {manifest.get('version')}; this byoc reads version {VERSION}")
    return manifest


def _read_checked(archive: zipfile.ZipFile, manifest: dict, name: str, what: str, path) -> bytes:
    try:
        data = archive.read(name)
    except KeyError:
        raise ArtifactError(f"artifact {os.fspath(path)!r}: {what} ({name}) is missing") from None
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise ArtifactError(f"artifact {os.fspath(path)!r}: {what} ({name}) is corrupt or truncated ({error})") from error
    if _sha256(data) != manifest["files"].get(name):
        raise ArtifactError(f"artifact {os.fspath(path)!r}: {what} ({name}) fails its checksum: the file is corrupt")
    return data


def load(
    path: str | os.PathLike,
    cache_dir: str | os.PathLike | None = None,
    engines: str = "lazy",
    backend_options: Mapping[str, dict] | None = None,
) -> CompiledModel:
    """Load an artifact written by `CompiledModel.export`, in this or any other process.
    `backend_options` override the build's per-backend options (e.g. the accelerator
    configuration this runtime drives)."""
    with _open(path) as archive:
        manifest = _manifest(archive, path)
        backends = {}
        for backend_name in sorted({r["backend"] for r in manifest["regions"]}):
            try:
                backends[backend_name] = get_backend(backend_name)
            except UnknownBackendError:
                origin = manifest["vendors"].get(backend_name, "an unknown package")
                raise MissingVendorError(
                    f"artifact {os.fspath(path)!r} needs vendor {backend_name!r}, registered by {origin}; install that "
                    f"package. Registered vendors here: {', '.join(list_backends())}"
                ) from None
        host_library = _read_checked(archive, manifest, "host.so", "the host library", path)
        store = ConstantStore()
        for name, key in manifest["constants"].items():
            file = f"constants/{key}.npy"
            if key not in store.contents():
                data = _read_checked(archive, manifest, file, f"constant {name!r}", path)
                store.put(key, np.load(io.BytesIO(data), allow_pickle=False))
            store.bind(name, key)
        artifacts = []
        for entry in manifest["regions"]:
            what = f"region {entry['symbol']} ({entry['backend']})"
            payload = _read_checked(archive, manifest, entry["file"], what, path)
            artifacts.append(
                RegionArtifact(
                    symbol=entry["symbol"],
                    backend=entry["backend"],
                    codegen=entry["codegen"],
                    payload=payload,
                    constants=list(entry["constants"]),
                    inputs=[TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in entry["inputs"]],
                    outputs=[TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in entry["outputs"]],
                    vendor_version=entry["vendor_version"],
                    format_name=entry["format_name"],
                    info=entry.get("info", {}),
                )
            )
    model = CompiledModel(
        host_library,
        artifacts,
        backends,
        store,
        [TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in manifest["inputs"]],
        [TensorSpec(s["name"], tuple(s["shape"]), s["dtype"]) for s in manifest["outputs"]],
        manifest["target"],
        manifest["vendors"],
        {**manifest.get("backend_options", {}), **(backend_options or {})},
        EngineCache(cache_dir if cache_dir is not None else default_cache_dir()),
        partition=manifest.get("partition"),
        build_fallbacks=manifest.get("build_fallbacks", {}),
    )
    if engines == "eager":
        model.create_engines()
    return model
