"""What the build produces: each region, the model's tensors, and the parts of a compiled model.

These types sit below the model, its artifact writer and its profiler, which all read them and
import nothing from each other in a circle.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from byoc.runtime_metadata.constants import ConstantStore


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
    # The shape and dtype the region's code expects of each constant, in `constants` order:
    # checked on load against the stored arrays, and by C regions themselves when initialised.
    constant_specs: list[TensorSpec] = field(default_factory=list)

    def describe(self) -> dict:
        data = asdict(self)
        del data["payload"]
        data["payload_bytes"] = len(self.payload)
        return data


@dataclass(frozen=True)
class EmbeddedEngine:
    """A region's engine built at compile time (`build(..., engines="embed")`), and what it is
    bound to on the machine that built it (the vendor's `JsonRuntime.environment`). `plan` is
    the vendor's saved engine behind a header with its checksum and the region's cache key."""

    plan: bytes
    environment: dict[str, str]


@dataclass
class ModelParts:
    """Everything a compiled model is made of, and all that its artifact holds: the host
    library (host code and C regions), each offloaded region, the constants, the model's
    inputs and outputs, and what the build recorded. The build makes it, the artifact writes
    and reads it, and `CompiledModel` runs it."""

    host_library: bytes
    artifacts: list[RegionArtifact]
    store: ConstantStore
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    target: str
    vendor_origins: dict[str, str]
    backend_options: dict[str, dict] = field(default_factory=dict)
    partition: dict | None = None  # the partition record, when the module came from partition_for
    build_fallbacks: dict[str, str] = field(default_factory=dict)  # region symbol -> why it runs on the host
    engines: dict[str, EmbeddedEngine] = field(default_factory=dict)  # region symbol -> its engine, built ahead
