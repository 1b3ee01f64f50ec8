"""The on-disk engine cache, for vendors whose engine build is expensive.

An entry's key covers the region's content (its payload), its constants, its input shapes (they
are part of the payload), the build options, the vendor library's version and what the vendor
says a saved engine is bound to on this machine (GPU model, CUDA and TensorRT release): never
only the region's symbol name, which two different models share. Entries carry a checksum; a corrupt or
truncated entry is reported and rebuilt, never handed to a vendor loader.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path

from byoc.backend.settings import VendorSettings
from byoc.errors import CacheError
from byoc.runtime_metadata.artifact_types import RegionArtifact
from byoc.runtime_metadata.constants import ConstantStore

_MAGIC = b"BYOCENG2"
# content SHA-256, content length, and the entry's own key: an entry copied or renamed to
# another key's file (a buggy tool, a shared cache edited by hand) is refused, not loaded as
# the engine of a region it does not belong to.
_LAYOUT = struct.Struct("<32sQ64s")


def engine_cache_key(artifact: RegionArtifact, store: ConstantStore, settings: VendorSettings,
                     environment: Mapping[str, str] | None = None) -> str:
    digest = hashlib.sha256()
    description = {
        "backend": artifact.backend,
        "vendor_version": artifact.vendor_version,
        "environment": dict(environment or {}),
        "options": settings.changed(),  # the vendor's settings other than its defaults
        "constants": [store.key(name) for name in artifact.constants],
        "inputs": [[list(spec.shape), spec.dtype] for spec in artifact.inputs],
    }
    digest.update(json.dumps(description, sort_keys=True, default=str).encode())
    digest.update(hashlib.sha256(artifact.payload).digest())
    return digest.hexdigest()


def pack_entry(key: str, content: bytes) -> bytes:
    """A saved engine with its checksum and the key of the region it belongs to (cache entries
    and engines embedded in artifacts alike)."""
    return _MAGIC + _LAYOUT.pack(hashlib.sha256(content).digest(), len(content), key.encode("ascii")) + content


def unpack_entry(data: bytes, key: str, what: str) -> bytes:
    """The engine saved in `data`; CacheError when it is damaged or belongs to another key."""
    header = len(_MAGIC) + _LAYOUT.size
    if len(data) < header or not data.startswith(_MAGIC):
        raise CacheError(f"{what} is not a byoc engine entry")
    checksum, length, owner = _LAYOUT.unpack_from(data, len(_MAGIC))
    if owner.decode("ascii", "replace") != key:
        raise CacheError(f"{what} belongs to another region or other build options (key {owner[:16].decode('ascii', 'replace')}...)")
    content = data[header:]
    if len(content) != length:
        raise CacheError(f"{what} is truncated ({len(content)} of {length} bytes)")
    if hashlib.sha256(content).digest() != checksum:
        raise CacheError(f"{what} is corrupt (checksum mismatch)")
    return content


class EngineCache:
    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)

    def _path(self, backend: str, key: str) -> Path:
        return self.directory / backend / f"{key}.engine"

    def get(self, backend: str, key: str) -> bytes | None:
        """The cached engine bytes, None when absent; CacheError when the entry is damaged."""
        path = self._path(backend, key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        return unpack_entry(data, key, f"engine cache entry {path}")

    def put(self, backend: str, key: str, content: bytes) -> Path:
        path = self._path(backend, key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write then rename, so that a reader never sees half an entry.
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as tmp:
            tmp.write(pack_entry(key, content))
            tmp.flush()
            os.fsync(tmp.fileno())
        os.replace(tmp.name, path)
        return path

    def discard(self, backend: str, key: str) -> None:
        self._path(backend, key).unlink(missing_ok=True)
