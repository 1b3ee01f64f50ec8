"""What the build produces for one region, and how a compiled model describes its tensors."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str

    def describe(self) -> str:
        return f"{self.shape} {self.dtype}"


@dataclass
class RegionArtifact:
    """One offloaded region after code generation.

    `payload` is the JSON graph text (json), the C source (c), or the container-wrapped binary
    (custom). `constants` names the entries of the constant store the region uses, in order.
    """

    symbol: str
    backend: str
    codegen: str
    payload: bytes
    constants: list[str]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    vendor_version: str = ""
    format_name: str = ""
    info: dict = field(default_factory=dict)

    def describe(self) -> dict:
        data = asdict(self)
        del data["payload"]
        data["payload_bytes"] = len(self.payload)
        return data
