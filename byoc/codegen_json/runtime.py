"""What a backend that takes JSON graphs provides: how to build an engine from a graph, and
optionally how to save a built engine (for the disk cache and for artifacts that embed their
engines) and load it back."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from byoc.backend.codegen import Codegen, RegionCode, RegionSignature, RegionSource, vendor_call
from byoc.backend.engine import Engine
from byoc.backend.settings import VendorSettings
from byoc.codegen_json.references import value_spec
from byoc.codegen_json.schema import load_graph

JsonGraph = Mapping[str, Any]
Constants = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class JsonRuntime(Codegen):
    """`build_engine(graph, constants, settings)` makes the engine of one region, with the
    vendor's settings (its `VendorSettings`: those the region was partitioned with, under the
    build and load settings).

    When `save_engine` and `load_engine` are given, built engines are cached on disk under a key
    that covers the graph, the constants, the settings and `version` (the vendor library's
    version), so an expensive build is done once per machine. A saved engine is often bound to
    the machine that built it (a TensorRT plan to its GPU model and TensorRT release):
    `environment()` describes what it is bound to here ({"tensorrt": "10.13.0", "gpu": ...}).
    That description is part of the cache key, and an engine embedded in an artifact is only
    loaded where it is the same.
    """

    kind: ClassVar[str] = "json"
    extension: ClassVar[str] = "json"

    build_engine: Callable[[JsonGraph, Constants, VendorSettings], Engine]
    version: str
    save_engine: Callable[[Engine], bytes] | None = None
    load_engine: Callable[[bytes, JsonGraph, Constants, VendorSettings], Engine] | None = None
    environment: Callable[[], dict[str, str]] | None = None
    # Whether `build_engine` needs TVM's compiler (see `Codegen.builds_with_compiler`).
    needs_compiler: bool = False
    # False where a saved engine is worth embedding in an artifact but not caching on disk (it is
    # no faster to read than to build, and caching would write its weights again at every build).
    cache_engines: bool = True

    @property
    def library_version(self) -> str:
        return self.version

    @property
    def builds_with_compiler(self) -> bool:
        return self.needs_compiler

    def generate(self, region: RegionSource) -> RegionCode:
        payload = json.dumps(region.graph, sort_keys=True, separators=(",", ":")).encode()
        return RegionCode(payload, "json", tuple(region.constants))

    def make_engine(self, code: RegionCode, constants: Constants, settings: VendorSettings, where: str,
                    hardware_given: bool = True) -> Engine:
        graph = load_graph(code.payload, where)
        return vendor_call(f"{where}: building the engine (build_engine) failed", self.build_engine, graph, constants, settings)

    @property
    def saves_engines(self) -> bool:
        return self.save_engine is not None and self.load_engine is not None

    @property
    def caches_engines(self) -> bool:
        return self.saves_engines and self.cache_engines

    def saved_engine(self, engine: Engine) -> bytes:
        return self.save_engine(engine)

    def engine_from_saved(self, saved: bytes, code: RegionCode, constants: Constants, settings: VendorSettings, where: str) -> Engine:
        return self.load_engine(saved, load_graph(code.payload, where), constants, settings)

    def machine(self) -> dict[str, str]:
        """What a saved engine is bound to on this machine (empty when nothing is declared)."""
        return dict(self.environment()) if self.environment is not None else {}

    @classmethod
    def check_code(cls, payload: bytes, expected: RegionSignature, where: str) -> None:
        graph = load_graph(payload, where)
        if (graph["symbol"], graph["backend"]) != (expected.symbol, expected.backend):
            raise ValueError(f"{where}: its JSON graph is region {graph['symbol']} ({graph['backend']})")
        inputs = [(tuple(i["shape"]), i["dtype"]) for i in graph["inputs"]]
        if inputs != list(expected.inputs):
            raise ValueError(f"{where}: its JSON graph takes inputs {inputs}; the manifest records {list(expected.inputs)}")
        outputs = [(tuple(value_spec(graph, ref)["shape"]), value_spec(graph, ref)["dtype"]) for ref in graph["outputs"]]
        if outputs != list(expected.outputs):
            raise ValueError(f"{where}: its JSON graph gives outputs {outputs}; the manifest records {list(expected.outputs)}")
        table = {name: (tuple(c["shape"]), c["dtype"]) for name, c in graph["constants"].items()}
        if table != dict(expected.constants):
            raise ValueError(f"{where}: its JSON graph's constants differ from what the manifest records for the region")
