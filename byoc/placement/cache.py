"""The measurement cache: one small JSON file per measured candidate, on disk.

A key covers all a timing depends on: the candidate's content (TVM's structural hash of the
module: its ops, shapes, dtypes and constants' values), the backend, its library version and
configuration, the cost options it is partitioned under, the machine that timed it (CPU model,
thread count, or the RPC device), and the measurement protocol. A second search of the same model, or of a model that
shares blocks with one searched before, measures nothing again. An entry that cannot be read is
measured again and rewritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi

from byoc.backend.spec import Backend
from byoc.cache_dirs import default_placement_cache_dir
from byoc.placement.measure import PROTOCOL


def backend_version(backend: Backend | None) -> str:
    """The library a backend's timings depend on; the host's is TVM's."""
    if backend is None:
        return f"host tvm {tvm.__version__}"
    changed = backend.settings.changed()  # settings other than its defaults change what is timed
    return f"{backend.name} {backend.library_version()} {json.dumps(changed, sort_keys=True) if changed else ''}".strip()


def content_hash(mod: tvm.IRModule) -> str:
    return str(tvm_ffi.structural_hash(mod))


def candidate_key(content: str, backend: Backend | None, machine: str, extra: str = "", cost_options: Mapping[str, Any] | None = None) -> str:
    """The key of a candidate whose module has `content_hash` `content`, partitioned for
    `backend` under `cost_options` (which decide what its regions are; a region filter by its name)."""
    options = "" if backend is None else repr(sorted((name, _stable(value)) for name, value in (cost_options or {}).items()))
    parts = [str(PROTOCOL), content, backend_version(backend), machine, extra, options]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _stable(value: Any) -> Any:
    """`value` as text that is the same in every process: a set's members sorted (a string's
    hash, and so a set's order, changes between processes), a function by its name."""
    if isinstance(value, (set, frozenset, list, tuple)):
        return sorted(str(v) for v in value)
    return getattr(value, "__qualname__", value)


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
