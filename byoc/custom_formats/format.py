"""The API of a vendor's own binary format (paper section 3.3, option 3).

At compile time `serialize(graph, constants, options)` turns the region (its JSON graph and
constants) into the vendor's bytes; at load time `deserialize(payload, options)` turns them into
an engine. byoc wraps the bytes in a checked container and stores them in the artifact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from byoc.backend.codegen import Codegen, RegionCode, RegionSignature, RegionSource, vendor_call
from byoc.backend.engine import Engine
from byoc.custom_formats.container import read_header, unwrap, wrap

Graph = Mapping[str, Any]


@dataclass(frozen=True)
class CustomFormat(Codegen):
    kind: ClassVar[str] = "custom"
    extension: ClassVar[str] = "bin"
    engine_source: ClassVar[str] = "deserialized"

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

    @property
    def library_version(self) -> str:
        return f"{self.name}-{self.version}"

    def generate(self, region: RegionSource) -> RegionCode:
        settings = dict(region.settings)
        raw = self.serialize(region.graph, region.constants, settings)
        payload = wrap(raw, self.name, self.version, region.symbol, region.backend, self.config(settings) or "",
                       [[list(shape), dtype] for shape, dtype in region.inputs], [[list(shape), dtype] for shape, dtype in region.outputs])
        # The blob carries its constants: none go to byoc's constant store.
        return RegionCode(payload, self.name, (), self.describe(raw, settings) if self.describe else {})

    def make_engine(self, code: RegionCode, constants, options: dict, where: str) -> Engine:
        config = vendor_call(f"{where}: the vendor's options ({self.name}.config) failed", self.config, options)
        _, payload = unwrap(code.payload, self.name, self.versions(), where, config=config)
        return vendor_call(f"{where}: loading the vendor's binary ({self.name}.deserialize) failed", self.deserialize, payload, options)

    @classmethod
    def check_code(cls, payload: bytes, expected: RegionSignature, where: str) -> None:
        header = read_header(payload, where)
        if (header.symbol, header.backend, header.format) != (expected.symbol, expected.backend, expected.format_name):
            raise ValueError(f"{where}: its blob belongs to region {header.symbol} ({header.backend}, {header.format})")
        for kind, recorded, specs in (("inputs", header.inputs, expected.inputs), ("outputs", header.outputs, expected.outputs)):
            if recorded is not None and recorded != [[list(shape), dtype] for shape, dtype in specs]:
                raise ValueError(f"{where}: its blob was built for {kind} {recorded}; the manifest records "
                                 f"{[[list(shape), dtype] for shape, dtype in specs]}")
