"""What `byoc inspect` and `CompiledModel.inspect` print of a compiled model: its interface,
constants, each region with its engine's state, its vendors, the tail that runs after it and its
dynamic dimensions."""

from __future__ import annotations

from typing import TYPE_CHECKING

from byoc.runtime_metadata.artifact_types import EmbeddedEngine
from byoc.runtime_metadata.dispatch import RegionRuntime

if TYPE_CHECKING:  # the model calls this module: its type only
    from byoc.runtime_metadata.model import CompiledModel


def describe(model: CompiledModel) -> dict:
    parts, store = model.parts, model.store
    return {
        "target": parts.target,
        "inputs": [vars(s) for s in model.inputs],
        "outputs": [vars(s) for s in model.outputs],
        "host_library_bytes": len(parts.host_library),
        "constants": {"count": len(store.names()), "unique": len(store.contents()), "bytes": store.nbytes},
        "regions": [
            {
                **a.describe(),
                "constant_bytes": sum(store.get(n).nbytes for n in a.constants),
                "engine": _engine_state(model.regions.get(a.symbol)),
                "embedded_engine": _embedded_state(parts.engines.get(a.symbol)),
            }
            for a in model.artifacts
        ],
        "vendors": parts.vendor_origins,
        **({"tail": {**parts.tail.info(), "bytes": len(parts.tail.model)}} if parts.tail is not None else {}),
        **({"dims": {name: str(r) for name, r in parts.dims.items()},
            "shape_specialised": {symbol: runtime.describe() for symbol, runtime in model.specialised.items()}}
           if parts.dims else {}),
    }


def _engine_state(region: RegionRuntime | None) -> str:
    if region is None:
        return "linked into the host library"
    if region.record is None:
        return "not built yet"
    return f"{region.record.source} in {region.record.seconds:.3f} s"


def _embedded_state(embedded: EmbeddedEngine | None) -> dict | None:
    if embedded is None:
        return None
    return {"bytes": len(embedded.plan), "environment": embedded.environment}
