"""The API of a vendor's own binary format (paper section 3.3, option 3).

At compile time `serialize(graph, constants, options)` turns the region (its JSON graph and
constants) into the vendor's bytes; at load time `deserialize(payload, options)` turns them into
an engine. byoc wraps the bytes in a checked container and stores them in the artifact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from byoc.runtime_metadata.engine import Engine

Graph = Mapping[str, Any]


@dataclass(frozen=True)
class CustomFormat:
    name: str
    version: int
    serialize: Callable[[Graph, Mapping[str, np.ndarray], dict], bytes]
    deserialize: Callable[[bytes, dict], Engine]
    # The accelerator configuration a blob is built for (e.g. "ethos-u55-256"), from the build
    # options and region attributes; at load, None (not configured) accepts any blob, and any
    # other configuration refuses blobs built for another one.
    config: Callable[[dict], str | None] = lambda options: None
    readable_versions: tuple[int, ...] = ()
    # What the vendor knows about a serialized region at build time (estimated cycles, memory
    # use); it goes into the artifact and the model's report.
    describe: Callable[[bytes, dict], dict] | None = None

    def versions(self) -> tuple[int, ...]:
        return self.readable_versions or (self.version,)
