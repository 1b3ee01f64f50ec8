"""The interface of a backend's processing steps (`Backend.processing`): passes over a region's
JSON graph applied at code generation, before the graph is handed to the backend's format.
byoc's own passes (quantization, layout, casting) are in byoc.processing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from byoc.backend.settings import VendorSettings

Graph = dict[str, Any]
Constants = dict[str, np.ndarray]


@dataclass(frozen=True)
class RegionContext:
    symbol: str
    backend: str
    attrs: Mapping[str, str]  # the region function's byoc attributes (calibration ranges)
    settings: VendorSettings  # the vendor's settings (partition and build)
    # What a pass records for the artifact (the region's `info`): e.g. the CPU feature its int8
    # kernels need to be exact (`REQUIRES`, read back at load by byoc.runtime_metadata.model).
    notes: dict[str, Any] = field(default_factory=dict)


class RegionPass(Protocol):
    """One processing step: (graph, constants, context) -> (graph, constants)."""

    name: str

    def __call__(self, graph: Graph, constants: Constants, context: RegionContext) -> tuple[Graph, Constants]: ...
