"""Code generation of every region at build time, by the backend's code format.

Each region is first written as a JSON graph (byoc's vendor-neutral region form) and processed
by the backend's passes; the backend's `Codegen` turns it into what the artifact keeps (the
graph itself, C source, or the vendor's binary: see byoc.backend.codegen).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tvm import relax

from byoc.backend.codegen import RegionSource
from byoc.backend.settings import VendorSettings
from byoc.backend.spec import Backend
from byoc.codegen_json.references import value_spec
from byoc.codegen_json.serialize import region_to_json
from byoc.ir.dims import DimRange
from byoc.processing.passes import RegionContext, apply_passes
from byoc.runtime_metadata.artifact_types import RegionArtifact, TensorSpec
from byoc.runtime_metadata.constants import ConstantStore


def _output_specs(graph: Mapping[str, Any]) -> list[TensorSpec]:
    specs = (value_spec(graph, ref) for ref in graph["outputs"])
    return [TensorSpec(f"output{position}", tuple(s["shape"]), s["dtype"]) for position, s in enumerate(specs)]


def region_attrs(func: relax.Function) -> dict[str, str]:
    """The byoc attributes of a region function (calibration ranges and the like)."""
    return {str(k): str(v) for k, v in (func.attrs or {}).items() if str(k).startswith("byoc.")}


def generate_region(func: relax.Function, symbol: str, backend: Backend, store: ConstantStore, settings: VendorSettings,
                    dims: Mapping[str, DimRange] | None = None) -> RegionArtifact:
    """The region's code with the vendor's `settings`: for its static shapes, or, given the
    model's `dims`, once for every shape in range (a backend that declares `symbolic_shapes`)."""
    graph, constants = region_to_json(func, symbol, backend.name, dims)
    attrs = region_attrs(func)
    context = RegionContext(symbol, backend.name, attrs, settings)
    if backend.processing:
        graph, constants = apply_passes(backend.processing, graph, constants, context)
    inputs = [TensorSpec(i["name"], tuple(i["shape"]), i["dtype"]) for i in graph["inputs"]]
    outputs = _output_specs(graph)
    source = RegionSource(symbol, backend.name, graph, constants, settings, [(s.shape, s.dtype) for s in inputs],
                          [(s.shape, s.dtype) for s in outputs])
    code = backend.codegen.generate(source)
    store.add_all({name: constants[name] for name in code.constants})
    return RegionArtifact(
        symbol, backend.name, backend.codegen.kind, code.payload, list(code.constants), inputs, outputs,
        vendor_version=backend.library_version(), format_name=code.format_name, info={**code.info, **context.notes},
        constant_specs=[TensorSpec(name, tuple(graph["constants"][name]["shape"]), graph["constants"][name]["dtype"])
                        for name in code.constants],
        settings=settings.record(backend.name),
    )
