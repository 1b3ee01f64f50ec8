"""Loading the host library (host code plus C regions) and initialising its C regions.

A shared library is loaded once per process and never unloaded, and its C regions keep their
state in file-scope variables. Libraries are therefore stored by content and by the constants
their C regions are initialised with: two models with the same library and the same constants
share one loaded copy, initialised once, from constants kept alive for the rest of the process.
Two models of one architecture with different weights compile to the same library bytes, and
each needs its own copy: the dynamic loader keeps one copy per file, so each gets its own file.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
from pathlib import Path

import tvm

from byoc.cache_dirs import library_cache_dir
from byoc.codegen_c.generate import CONSTANT_MISMATCH, init_symbol
from byoc.errors import ArtifactError, EngineError
from byoc.runtime_metadata.artifact_types import ModelParts, RegionArtifact
from byoc.runtime_metadata.constants import ConstantStore
from byoc.runtime_metadata.elf import check_shared_library
from byoc.runtime_metadata.signature import check_signature, read_signature, signature

_initialised: dict[tuple[str, str], list] = {}  # (library path, symbol) -> constants kept alive
_lock = threading.Lock()


def libraries_directory() -> Path:
    """Where shared libraries are kept as files (beside the engine cache)."""
    directory = library_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def library_file(data: bytes, variant: str = "") -> Path:
    """The library `data` as a file, one per content and `variant`."""
    digest = hashlib.sha256(data).hexdigest()
    directory = libraries_directory()
    path = directory / f"{digest[:32]}{'-' + variant if variant else ''}.so"
    if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
        with tempfile.NamedTemporaryFile(dir=directory, delete=False, suffix=".tmp") as tmp:
            tmp.write(data)
        os.replace(tmp.name, path)
    return path


def load_host_library(parts: ModelParts, where: str = "the host library") -> tvm.runtime.Module:
    """The host library of `parts`, loaded once per process, checked against the model's parts
    (see `signature`), its C regions initialised with their constants."""
    check_shared_library(parts.host_library, where)
    module, path = load_library(parts.host_library, parts.artifacts, parts.store, where)
    check_signature(read_signature(module, where), signature(parts.inputs, parts.outputs, parts.artifacts), where)
    initialise(module, path, parts.artifacts, parts.store)
    return module


def load_library(data: bytes, artifacts: list[RegionArtifact], store: ConstantStore, where: str) -> tuple[tvm.runtime.Module, Path]:
    """The library `data`, loaded from its own file for the constants its C regions among
    `artifacts` are initialised with (see above), and that file."""
    initialised_with = [(a.symbol, [store.key(n) for n in a.constants]) for a in artifacts if a.linked_into_host]
    variant = hashlib.sha256(repr(initialised_with).encode()).hexdigest()[:16] if initialised_with else ""
    path = library_file(data, variant)
    try:
        return tvm.runtime.load_module(str(path)), path
    except Exception as error:  # TVM raises InternalError, ValueError, ... with no common base
        raise ArtifactError(f"{where} cannot be loaded: {str(error).strip().splitlines()[-1]}") from error


def initialise(module: tvm.runtime.Module, path: Path, artifacts: list[RegionArtifact], store: ConstantStore) -> None:
    """Each C region among `artifacts` initialised with its constants, once per loaded file;
    the constants stay alive for the rest of the process."""
    with _lock:
        for artifact in artifacts:
            if not artifact.linked_into_host or (str(path), artifact.symbol) in _initialised:
                continue
            constants = [tvm.runtime.from_dlpack(store.get(name)) for name in artifact.constants]
            init = module.get_function(init_symbol(artifact.symbol), query_imports=True)
            try:
                init(*constants)
            except Exception as error:
                # A region's C code checks the constants it is given against what it was built
                # for (see byoc.codegen_c.generate): a mismatch is an inconsistent model.
                if CONSTANT_MISMATCH in str(error):
                    raise ArtifactError(f"region {artifact.symbol} ({artifact.backend}): initialisation failed: {error}") from error
                failure = EngineError(f"region {artifact.symbol} ({artifact.backend}): initialisation failed: {error}")
                failure.region = artifact.symbol  # `build` falls back from it
                raise failure from error
            _initialised[(str(path), artifact.symbol)] = constants
