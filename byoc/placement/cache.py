"""The measurement cache: one small JSON file per measured candidate, on disk.

A key covers all a timing depends on: the candidate's content (TVM's structural hash of the
module: its ops, shapes, dtypes and constants' values), the backend, its library
version and configuration, the machine that timed it (CPU model, thread count, or the RPC
device), and the measurement protocol. A second search of the same model, or of a model that
shares blocks with one searched before, measures nothing again. An entry that cannot be read is
measured again and rewritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

import tvm
import tvm_ffi

from byoc.backend.spec import Backend
from byoc.placement.measure import PROTOCOL

PLACEMENT_CACHE_ENV = "BYOC_PLACEMENT_CACHE_DIR"


def default_placement_cache_dir() -> Path:
    configured = os.environ.get(PLACEMENT_CACHE_ENV)
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "byoc" / "placement"


def backend_version(backend: Backend | None) -> str:
    """The library a backend's timings depend on; the host's is TVM's."""
    if backend is None:
        return f"host tvm {tvm.__version__}"
    return f"{backend.name} {backend.library_version()} {backend.target}".strip()


def content_hash(mod: tvm.IRModule) -> str:
    return str(tvm_ffi.structural_hash(mod))


def candidate_key(content: str, backend: Backend | None, machine: str, extra: str = "") -> str:
    """The key of a candidate whose module has `content_hash` `content`."""
    parts = [str(PROTOCOL), content, backend_version(backend), machine, extra]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


class MeasurementCache:
    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_placement_cache_dir()

    def get(self, key: str) -> dict | None:
        try:
            with open(self.directory / f"{key}.json") as f:
                entry = json.load(f)
        except (OSError, ValueError):
            return None
        return entry if isinstance(entry, dict) and "ms" in entry else None

    def put(self, key: str, entry: dict) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(entry, f)
        os.replace(tmp, self.directory / f"{key}.json")
