"""What a backend that takes JSON graphs provides: how to build an engine from a graph, and
optionally how to save a built engine (for the disk cache and for artifacts that embed their
engines) and load it back."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from byoc.runtime_metadata.engine import Engine

JsonGraph = Mapping[str, Any]
Constants = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class JsonRuntime:
    """`build_engine(graph, constants, options)` makes the engine of one region.

    When `save_engine` and `load_engine` are given, built engines are cached on disk under a key
    that covers the graph, the constants, the options and `version` (the vendor library's
    version), so an expensive build is done once per machine. A saved engine is often bound to
    the machine that built it (a TensorRT plan to its GPU model and TensorRT release):
    `environment()` describes what it is bound to here ({"tensorrt": "10.13.0", "gpu": ...}).
    That description is part of the cache key, and an engine embedded in an artifact is only
    loaded where it is the same.
    """

    build_engine: Callable[[JsonGraph, Constants, dict], Engine]
    version: str
    save_engine: Callable[[Engine], bytes] | None = None
    load_engine: Callable[[bytes, JsonGraph, Constants, dict], Engine] | None = None
    environment: Callable[[], dict[str, str]] | None = None

    @property
    def saves_engines(self) -> bool:
        return self.save_engine is not None and self.load_engine is not None

    def machine(self) -> dict[str, str]:
        """What a saved engine is bound to on this machine (empty when nothing is declared)."""
        return dict(self.environment()) if self.environment is not None else {}
