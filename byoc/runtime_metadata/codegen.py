"""Code generation of every region at build time, by the backend's chosen format.

Each region is first written as a JSON graph (byoc's vendor-neutral region form); a JSON backend
ships it as is, a C backend turns it into C source through its emitter table, and a custom
backend turns it into its own binary through its serialize hook.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tvm import relax

from byoc.backend.spec import Backend
from byoc.codegen_json.graph import value_spec
from byoc.codegen_json.serialize import region_to_json
from byoc.custom_formats.container import wrap
from byoc.partition.outline import TARGET_ATTR
from byoc.processing.passes import RegionContext, apply_passes
from byoc.runtime_metadata.artifact_types import RegionArtifact, TensorSpec
from byoc.runtime_metadata.constants import ConstantStore


def _output_specs(graph: Mapping[str, Any]) -> list[TensorSpec]:
    specs = (value_spec(graph, ref) for ref in graph["outputs"])
    return [TensorSpec(f"output{position}", tuple(s["shape"]), s["dtype"]) for position, s in enumerate(specs)]


def region_attrs(func: relax.Function) -> dict[str, str]:
    """The byoc attributes of a region function (calibration ranges and the like)."""
    return {str(k): str(v) for k, v in (func.attrs or {}).items() if str(k).startswith("byoc.")}


def generate_region(func: relax.Function, symbol: str, backend: Backend, store: ConstantStore, options: dict) -> RegionArtifact:
    graph, constants = region_to_json(func, symbol, backend.name)
    attrs = region_attrs(func)
    if backend.processing:
        context = RegionContext(symbol, backend.name, attrs, options)
        graph, constants = apply_passes(backend.processing, graph, constants, context)
    inputs = [TensorSpec(i["name"], tuple(i["shape"]), i["dtype"]) for i in graph["inputs"]]
    outputs = _output_specs(graph)
    artifact = RegionArtifact(symbol, backend.name, backend.codegen, b"", [], inputs, outputs)
    artifact.vendor_version = backend.library_version()
    artifact.constant_specs = [TensorSpec(name, tuple(graph["constants"][name]["shape"]), graph["constants"][name]["dtype"])
                               for name in constants] if backend.codegen != "custom" else []
    if backend.codegen == "json":
        if attrs.get(TARGET_ATTR):  # the configuration the engine is built for (TensorRT's version, precision)
            graph = {**graph, "target": attrs[TARGET_ATTR]}
        store.add_all(constants)
        artifact.payload = json.dumps(graph, sort_keys=True, separators=(",", ":")).encode()
        artifact.constants = list(constants)
        artifact.format_name = "json"
    elif backend.codegen == "c":
        from byoc.codegen_c.generate import generate_c_source

        store.add_all(constants)
        artifact.payload = generate_c_source(graph, backend.c_library, constants, options).encode()
        artifact.constants = list(constants)
        artifact.format_name = "c"
    else:
        fmt = backend.custom_format
        settings = {**attrs, **options}  # region attributes (e.g. the target) under build options
        raw = fmt.serialize(graph, constants, settings)
        artifact.payload = wrap(raw, fmt.name, fmt.version, symbol, backend.name, fmt.config(settings) or "",
                                [[list(s.shape), s.dtype] for s in inputs], [[list(s.shape), s.dtype] for s in outputs])
        artifact.format_name = fmt.name
        artifact.info = fmt.describe(raw, settings) if fmt.describe else {}
    return artifact
