"""The API of a vendor's own binary format (paper section 3.3, option 3).

At compile time `serialize(graph, constants, settings)` turns the region (its JSON graph and
constants) into the vendor's bytes; at load time `deserialize(payload, settings)` turns them into
an engine, with the vendor's settings (its `VendorSettings`). byoc wraps the bytes in a checked
container, which records the hardware they are built for (`settings.hardware()`), and stores
them in the artifact.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from byoc.backend.codegen import Codegen, RegionCode, RegionSignature, RegionSource, vendor_call
from byoc.backend.engine import Engine
from byoc.backend.settings import VendorSettings
from byoc.custom_formats.container import read_header, unwrap, wrap

Graph = Mapping[str, Any]


@dataclass(frozen=True)
class CustomFormat(Codegen):
    kind: ClassVar[str] = "custom"
    extension: ClassVar[str] = "bin"
    engine_source: ClassVar[str] = "deserialized"

    name: str
    version: int
    serialize: Callable[[Graph, Mapping[str, np.ndarray], VendorSettings], bytes]
    deserialize: Callable[[bytes, VendorSettings], Engine]
    readable_versions: tuple[int, ...] = ()
    # What the vendor knows about a serialized region at build time (estimated cycles, memory
    # use); it goes into the artifact and the model's report.
    describe: Callable[[bytes, VendorSettings], dict] | None = None
    # Why this machine has no device to run the blobs on, or None (see `Codegen.device_missing`).
    device: Callable[[], str | None] | None = None
    # The pip distributions whose libraries its engines load (see `Codegen.runtime_packages`).
    packages: tuple[str, ...] = ()

    def device_missing(self) -> str | None:
        return self.device() if self.device is not None else None

    def runtime_packages(self) -> tuple[str, ...]:
        return self.packages

    def versions(self) -> tuple[int, ...]:
        return self.readable_versions or (self.version,)

    @property
    def library_version(self) -> str:
        return f"{self.name}-{self.version}"

    def generate(self, region: RegionSource) -> RegionCode:
        settings = region.settings
        raw = self.serialize(region.graph, region.constants, settings)
        payload = wrap(raw, self.name, self.version, region.symbol, region.backend, settings.hardware(),
                       [[list(shape), dtype] for shape, dtype in region.inputs], [[list(shape), dtype] for shape, dtype in region.outputs])
        # The blob carries its constants: none go to byoc's constant store.
        return RegionCode(payload, self.name, (), self.describe(raw, settings) if self.describe else {})

    def make_engine(self, code: RegionCode, constants, settings: VendorSettings, where: str, hardware_given: bool = True) -> Engine:
        # A blob built for other hardware than the settings name is refused, not run.
        hardware = vendor_call(f"{where}: the vendor's settings (hardware()) failed", settings.hardware) if hardware_given else None
        _, payload = unwrap(code.payload, self.name, self.versions(), where, config=hardware)
        return vendor_call(f"{where}: loading the vendor's binary ({self.name}.deserialize) failed", self.deserialize, payload, settings)

    @classmethod
    def check_code(cls, payload: bytes, expected: RegionSignature, where: str) -> None:
        header = read_header(payload, where)
        if (header.symbol, header.backend, header.format) != (expected.symbol, expected.backend, expected.format_name):
            raise ValueError(f"{where}: its blob belongs to region {header.symbol} ({header.backend}, {header.format})")
        for kind, recorded, specs in (("inputs", header.inputs, expected.inputs), ("outputs", header.outputs, expected.outputs)):
            if recorded is not None and recorded != [[list(shape), dtype] for shape, dtype in specs]:
                raise ValueError(f"{where}: its blob was built for {kind} {recorded}; the manifest records "
                                 f"{[[list(shape), dtype] for shape, dtype in specs]}")
