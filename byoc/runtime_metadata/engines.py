"""Engine creation for regions the host calls through Python: JSON graphs and custom blobs.

Engines are created once per region (on first use, or at load when asked) and kept in memory;
engines of JSON backends that can save themselves are also kept in the disk cache.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

from byoc.backend.spec import Backend
from byoc.codegen_json.schema import load_graph
from byoc.custom_formats.container import unwrap
from byoc.errors import ByocError, CacheError, EngineError
from byoc.runtime_metadata.artifact_types import RegionArtifact
from byoc.runtime_metadata.constants import ConstantStore
from byoc.runtime_metadata.engine import Engine
from byoc.runtime_metadata.engine_cache import EngineCache, engine_cache_key


@dataclass
class EngineRecord:
    engine: Engine
    seconds: float
    source: str  # "built", "disk cache", "deserialized"


def create_engine(
    artifact: RegionArtifact,
    backend: Backend,
    store: ConstantStore,
    options: dict,
    cache: EngineCache | None,
) -> EngineRecord:
    where = f"region {artifact.symbol} ({artifact.backend})"
    start = time.perf_counter()
    try:
        if artifact.codegen == "json":
            engine, source = _json_engine(artifact, backend, store, options, cache, where)
        else:
            fmt = backend.custom_format
            _, payload = unwrap(artifact.payload, fmt.name, fmt.versions(), where, config=fmt.config(options))
            engine, source = fmt.deserialize(payload, options), "deserialized"
    except ByocError:
        raise
    except Exception as error:
        raise EngineError(f"{where}: building the engine failed: {type(error).__name__}: {error}") from error
    return EngineRecord(engine, time.perf_counter() - start, source)


def _json_engine(artifact, backend, store, options, cache, where):
    runtime = backend.json_runtime
    graph = load_graph(artifact.payload, where)
    constants = store.subset(artifact.constants)
    cacheable = cache is not None and runtime.save_engine is not None and runtime.load_engine is not None
    key = engine_cache_key(artifact, store, options) if cacheable else ""
    if cacheable:
        try:
            blob = cache.get(artifact.backend, key)
            if blob is not None:
                return runtime.load_engine(blob, graph, constants, options), "disk cache"
        except CacheError as error:
            warnings.warn(f"byoc: {where}: {error}; rebuilding the engine", stacklevel=4)
            cache.discard(artifact.backend, key)
        except Exception as error:
            warnings.warn(f"byoc: {where}: cached engine could not be loaded ({error}); rebuilding it", stacklevel=4)
            cache.discard(artifact.backend, key)
    engine = runtime.build_engine(graph, constants, options)
    if cacheable:
        cache.put(artifact.backend, key, runtime.save_engine(engine))
    return engine, "built"
