"""What a backend that takes JSON graphs provides: how to build an engine from a graph, and
optionally how to save a built engine for the disk cache and load it back."""

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
    version), so an expensive build is done once per machine.
    """

    build_engine: Callable[[JsonGraph, Constants, dict], Engine]
    version: str
    save_engine: Callable[[Engine], bytes] | None = None
    load_engine: Callable[[bytes, JsonGraph, Constants, dict], Engine] | None = None
