"""Engine creation for regions the host calls through Python (formats that make engines: JSON
graphs and custom blobs; C regions are linked into the host library).

Engines are created once per region (on first use, or at load when asked) and kept in memory;
engines that can save themselves (`Codegen.saves_engines`) are also kept in the disk cache, or
come embedded in the artifact. An embedded engine is used only on a machine like the one that
built it (`Codegen.machine`, a JsonRuntime's `environment`); elsewhere it is rebuilt with a
warning, or refused with an error when the model is loaded with `strict_engines`.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

from byoc.backend.codegen import Codegen
from byoc.backend.engine import Engine, EngineContext, creating_engine
from byoc.backend.runtime import VendorRuntime
from byoc.backend.settings import VendorSettings
from byoc.compiler_presence import compiler_missing
from byoc.errors import CacheError, EngineError
from byoc.runtime_metadata.artifact_types import EmbeddedEngine, RegionArtifact
from byoc.runtime_metadata.constants import ConstantStore
from byoc.runtime_metadata.engine_cache import EngineCache, engine_cache_key, pack_entry, unpack_entry


@dataclass
class EngineRecord:
    engine: Engine
    seconds: float
    source: str  # "built", "disk cache", "embedded", "deserialized"
    # The engine as its vendor saved it, where that was done or read anyway (cache, artifact):
    # an engine loaded from bytes cannot always save itself again (TVM's loaded libraries).
    saved: bytes | None = None


def create_engine(
    artifact: RegionArtifact,
    backend: VendorRuntime,
    store: ConstantStore,
    settings: VendorSettings,
    cache: EngineCache | None,
    context: EngineContext,
    embedded: EmbeddedEngine | None = None,
    strict: bool = False,
    hardware_given: bool = True,
) -> EngineRecord:
    """The region's engine, made by its code format with the vendor's `settings` (or read from
    the artifact or the disk cache) while `context` tells the vendor about the model around the
    region. Build (which checks it) and the runtime (on first use) both make engines here.
    `hardware_given`: see `Codegen.make_engine`."""
    where = f"region {artifact.symbol} ({artifact.backend})"
    start = time.perf_counter()
    with creating_engine(context):
        engine, source, saved = _engine(artifact, backend.codegen, store, settings, cache, where, embedded, strict, hardware_given)
    return EngineRecord(engine, time.perf_counter() - start, source, saved)


def save_for_embedding(record: EngineRecord, artifact: RegionArtifact, backend: VendorRuntime, store: ConstantStore,
                       settings: VendorSettings) -> EmbeddedEngine | None:
    """The region's built engine as the artifact carries it, or None when its vendor cannot save
    engines (C regions, custom blobs and engines without `save_engine` are rebuilt at load).
    The saved bytes carry the region's cache key, so an engine moved to another region, or
    loaded with other settings, is refused rather than run."""
    codegen = backend.codegen
    if not codegen.saves_engines:
        return None
    where = f"region {artifact.symbol} ({artifact.backend})"
    environment = machine(codegen, where)
    try:
        plan = record.saved if record.saved is not None else codegen.saved_engine(record.engine)
    except Exception as error:
        raise EngineError(f"{where}: saving the engine to embed it failed: {type(error).__name__}: {error}") from error
    return EmbeddedEngine(pack_entry(engine_cache_key(artifact, store, settings, environment), bytes(plan)), environment)


def machine(codegen: Codegen, where: str) -> dict[str, str]:
    """What the vendor says a saved engine is bound to on this machine."""
    try:
        return codegen.machine()
    except Exception as error:
        raise EngineError(f"{where}: the vendor could not describe this machine: {type(error).__name__}: {error}") from error


def _embedded_engine(codegen: Codegen, embedded: EmbeddedEngine, key: str, here: dict[str, str], artifact, constants,
                     settings, where: str, strict: bool):
    """The engine the artifact carries and its saved bytes, or None (with a warning) when it
    must be rebuilt."""
    there = embedded.environment
    differences = [f"{name} {there.get(name, '(none)')} there, {here.get(name, '(none)')} here"
                   for name in sorted(set(there) | set(here)) if there.get(name) != here.get(name)]
    if not codegen.saves_engines:
        problem = "the vendor installed here cannot load saved engines, so the one embedded in the artifact is not used"
    elif differences:
        problem = f"the engine embedded in the artifact was built for another machine ({'; '.join(differences)})"
    else:
        try:
            plan = unpack_entry(embedded.plan, key, "the engine embedded in the artifact")
            return codegen.engine_from_saved(plan, artifact.code(), constants, settings, where), plan
        except CacheError as error:
            problem = str(error)
        except Exception as error:
            problem = f"the engine embedded in the artifact could not be loaded ({type(error).__name__}: {error})"
    if strict:
        raise EngineError(f"{where}: {problem}; load without strict_engines to rebuild it on this machine")
    warnings.warn(f"byoc: {where}: {problem}; rebuilding it", stacklevel=5)
    return None


def _engine(artifact, codegen: Codegen, store, settings, cache, where, embedded=None, strict=False, hardware_given=True):
    """The region's engine, where it came from, and its saved bytes (when read or made)."""
    constants = store.subset(artifact.constants)
    cacheable = cache is not None and codegen.caches_engines
    if embedded is not None or cacheable:  # the key names the saved engine this region may use
        here = machine(codegen, where) if codegen.saves_engines else {}
        key = engine_cache_key(artifact, store, settings, here)
    if embedded is not None:
        loaded = _embedded_engine(codegen, embedded, key, here, artifact, constants, settings, where, strict)
        if loaded is not None:
            return loaded[0], "embedded", loaded[1]
    if cacheable:
        try:
            blob = cache.get(artifact.backend, key)
            if blob is not None:
                return codegen.engine_from_saved(blob, artifact.code(), constants, settings, where), "disk cache", blob
        except CacheError as error:
            warnings.warn(f"byoc: {where}: {error}; rebuilding the engine", stacklevel=4)
            cache.discard(artifact.backend, key)
        except Exception as error:
            warnings.warn(f"byoc: {where}: cached engine could not be loaded ({error}); rebuilding it", stacklevel=4)
            cache.discard(artifact.backend, key)
    missing = compiler_missing() if codegen.builds_with_compiler else None
    if missing is not None:
        raise EngineError(f"{where}: its engine must be built on this machine, and building it needs byoc's compiler: {missing}; "
                          "or embed the engine in the artifact on a machine like this one (byoc deploy)")
    engine = codegen.make_engine(artifact.code(), constants, settings, where, hardware_given)
    source = codegen.engine_source
    if cacheable:
        try:
            saved = codegen.saved_engine(engine)
            cache.put(artifact.backend, key, saved)
        except Exception as error:  # the engine is built and works: only the cache misses out
            warnings.warn(f"byoc: {where}: saving the engine for the cache (save_engine) failed: {type(error).__name__}: {error}; "
                          "it will be built again next time", stacklevel=4)
            return engine, source, None
        return engine, source, saved
    return engine, source, None
