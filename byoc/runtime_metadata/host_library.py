"""Loading the host library (host code plus C regions) and initialising its C regions.

A shared library is loaded once per process and never unloaded, and its C regions keep their
state in file-scope variables. Libraries are therefore stored by content: two models with the
same library share one loaded copy, whose C regions are initialised once, from constants that
are kept alive for the rest of the process.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path

import tvm

from byoc.codegen_c.generate import init_symbol
from byoc.errors import EngineError
from byoc.runtime_metadata.artifact_types import RegionArtifact
from byoc.runtime_metadata.constants import ConstantStore
from byoc.runtime_metadata.engine_cache import default_cache_dir

_initialised: dict[tuple[str, str], list] = {}  # (library path, symbol) -> constants kept alive
_lock = threading.Lock()


def library_file(data: bytes) -> Path:
    digest = hashlib.sha256(data).hexdigest()
    directory = default_cache_dir().parent / "libraries"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{digest[:32]}.so"
    if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
        with tempfile.NamedTemporaryFile(dir=directory, delete=False, suffix=".tmp") as tmp:
            tmp.write(data)
        os.replace(tmp.name, path)
    return path


def load_host_library(data: bytes, artifacts: Iterable[RegionArtifact], store: ConstantStore) -> tvm.runtime.Module:
    path = library_file(data)
    module = tvm.runtime.load_module(str(path))
    with _lock:
        for artifact in artifacts:
            if artifact.codegen != "c" or (str(path), artifact.symbol) in _initialised:
                continue
            constants = [tvm.runtime.from_dlpack(store.get(name)) for name in artifact.constants]
            init = module.get_function(init_symbol(artifact.symbol), query_imports=True)
            try:
                init(*constants)
            except Exception as error:
                raise EngineError(f"region {artifact.symbol} ({artifact.backend}): initialisation failed: {error}") from error
            _initialised[(str(path), artifact.symbol)] = constants
    return module
