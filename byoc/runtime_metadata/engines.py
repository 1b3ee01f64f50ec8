"""Engine creation for regions the host calls through Python: JSON graphs and custom blobs.

Engines are created once per region (on first use, or at load when asked) and kept in memory;
engines of JSON backends that can save themselves are also kept in the disk cache, or come
embedded in the artifact. An embedded engine is used only on a machine like the one that built
it (the vendor's `JsonRuntime.environment`); elsewhere it is rebuilt with a warning, or refused
with an error when the model is loaded with `strict_engines`.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

from byoc.backend.spec import Backend
from byoc.codegen_json.schema import load_graph
from byoc.custom_formats.container import unwrap
from byoc.errors import ByocError, CacheError, EngineError
from byoc.runtime_metadata.artifact_types import EmbeddedEngine, RegionArtifact
from byoc.runtime_metadata.constants import ConstantStore
from byoc.runtime_metadata.engine import Engine
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
    backend: Backend,
    store: ConstantStore,
    options: dict,
    cache: EngineCache | None,
    embedded: EmbeddedEngine | None = None,
    strict: bool = False,
) -> EngineRecord:
    where = f"region {artifact.symbol} ({artifact.backend})"
    start = time.perf_counter()
    if artifact.codegen == "json":
        engine, source, saved = _json_engine(artifact, backend, store, options, cache, where, embedded, strict)
    else:
        fmt = backend.custom_format
        config = _vendor_call(f"{where}: the vendor's options ({fmt.name}.config) failed", fmt.config, options)
        _, payload = unwrap(artifact.payload, fmt.name, fmt.versions(), where, config=config)
        engine = _vendor_call(f"{where}: loading the vendor's binary ({fmt.name}.deserialize) failed", fmt.deserialize, payload, options)
        source, saved = "deserialized", None
    return EngineRecord(engine, time.perf_counter() - start, source, saved)


def _vendor_call(failure: str, function, *args):
    """`function(*args)`, a vendor's code: what it raises becomes an EngineError that starts with
    `failure` and keeps the vendor's whole message and, as its cause, the vendor's traceback (a
    byoc error the vendor raised keeps its type: an OptionError stays the user's to fix)."""
    try:
        return function(*args)
    except EngineError:
        raise
    except ByocError as error:
        raise type(error)(f"{failure}: {error}") from error
    except Exception as error:
        raise EngineError(f"{failure}: {type(error).__name__}: {error}") from error


def save_for_embedding(record: EngineRecord, artifact: RegionArtifact, backend: Backend, store: ConstantStore,
                       options: dict) -> EmbeddedEngine | None:
    """The region's built engine as the artifact carries it, or None when its vendor cannot save
    engines (C regions, custom blobs and engines without `save_engine` are rebuilt at load).
    The saved bytes carry the region's cache key, so an engine moved to another region, or
    loaded with other options, is refused rather than run."""
    runtime = backend.json_runtime
    if artifact.codegen != "json" or runtime is None or not runtime.saves_engines:
        return None
    where = f"region {artifact.symbol} ({artifact.backend})"
    environment = machine(runtime, where)
    try:
        plan = record.saved if record.saved is not None else runtime.save_engine(record.engine)
    except Exception as error:
        raise EngineError(f"{where}: saving the engine to embed it failed: {type(error).__name__}: {error}") from error
    return EmbeddedEngine(pack_entry(engine_cache_key(artifact, store, options, environment), bytes(plan)), environment)


def machine(runtime, where: str) -> dict[str, str]:
    """What the vendor says a saved engine is bound to on this machine."""
    try:
        return runtime.machine()
    except Exception as error:
        raise EngineError(f"{where}: the vendor could not describe this machine: {type(error).__name__}: {error}") from error


def _embedded_engine(runtime, embedded: EmbeddedEngine, key: str, here: dict[str, str], graph, constants, options,
                     where: str, strict: bool):
    """The engine the artifact carries and its saved bytes, or None (with a warning) when it
    must be rebuilt."""
    there = embedded.environment
    differences = [f"{name} {there.get(name, '(none)')} there, {here.get(name, '(none)')} here"
                   for name in sorted(set(there) | set(here)) if there.get(name) != here.get(name)]
    if not runtime.saves_engines:
        problem = "the vendor installed here cannot load saved engines, so the one embedded in the artifact is not used"
    elif differences:
        problem = f"the engine embedded in the artifact was built for another machine ({'; '.join(differences)})"
    else:
        try:
            plan = unpack_entry(embedded.plan, key, "the engine embedded in the artifact")
            return runtime.load_engine(plan, graph, constants, options), plan
        except CacheError as error:
            problem = str(error)
        except Exception as error:
            problem = f"the engine embedded in the artifact could not be loaded ({type(error).__name__}: {error})"
    if strict:
        raise EngineError(f"{where}: {problem}; load without strict_engines to rebuild it on this machine")
    warnings.warn(f"byoc: {where}: {problem}; rebuilding it", stacklevel=5)
    return None


def _json_engine(artifact, backend, store, options, cache, where, embedded=None, strict=False):
    runtime = backend.json_runtime
    graph = load_graph(artifact.payload, where)
    constants = store.subset(artifact.constants)
    cacheable = cache is not None and runtime.saves_engines
    if embedded is not None or cacheable:  # the key names the saved engine this region may use
        here = machine(runtime, where) if runtime.saves_engines else {}
        key = engine_cache_key(artifact, store, options, here)
    if embedded is not None:
        loaded = _embedded_engine(runtime, embedded, key, here, graph, constants, options, where, strict)
        if loaded is not None:
            return loaded[0], "embedded", loaded[1]
    if cacheable:
        try:
            blob = cache.get(artifact.backend, key)
            if blob is not None:
                return runtime.load_engine(blob, graph, constants, options), "disk cache", blob
        except CacheError as error:
            warnings.warn(f"byoc: {where}: {error}; rebuilding the engine", stacklevel=4)
            cache.discard(artifact.backend, key)
        except Exception as error:
            warnings.warn(f"byoc: {where}: cached engine could not be loaded ({error}); rebuilding it", stacklevel=4)
            cache.discard(artifact.backend, key)
    engine = _vendor_call(f"{where}: building the engine (build_engine) failed", runtime.build_engine, graph, constants, options)
    if cacheable:
        try:
            saved = runtime.save_engine(engine)
            cache.put(artifact.backend, key, saved)
        except Exception as error:  # the engine is built and works: only the cache misses out
            warnings.warn(f"byoc: {where}: saving the engine for the cache (save_engine) failed: {type(error).__name__}: {error}; "
                          "it will be built again next time", stacklevel=4)
            return engine, "built", None
        return engine, "built", saved
    return engine, "built", None
