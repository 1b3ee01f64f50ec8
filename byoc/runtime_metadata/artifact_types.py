"""What the build produces: each region, the model's tensors, and the parts of a compiled model.

These types sit below the model, its artifact writer and its profiler, which all read them and
import nothing from each other in a circle.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from byoc.backend.codegen import Codegen, RegionCode, RegionSignature
from byoc.codegen_c.library import CLibrary
from byoc.codegen_json.runtime import JsonRuntime
from byoc.custom_formats.format import CustomFormat
from byoc.errors import ArtifactError
from byoc.ir.dim_range import DimRange
from byoc.ir.shape_conditions import ShapeCheck
from byoc.ir.tail import ModelTail
from byoc.runtime_metadata.constants import ConstantStore
from byoc.runtime_metadata.shape_memory import DEFAULT_SHAPE_MEMORY

# Variants built on first use that a shape-specialised region keeps in memory, by default.
DEFAULT_MAX_SHAPES = 16

# The code formats by the kind an artifact records for each region.
FORMATS: dict[str, type[Codegen]] = {fmt.kind: fmt for fmt in (JsonRuntime, CLibrary, CustomFormat)}


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
    # The vendor's settings the code was generated with (`VendorSettings.to_json`): engines are
    # made with them at load. None in an artifact made before regions recorded them.
    settings: dict | None = None

    @property
    def linked_into_host(self) -> bool:
        """Whether the region's code is compiled into the host library (no engine)."""
        return FORMATS[self.codegen].links_into_host

    def code(self) -> RegionCode:
        return RegionCode(self.payload, self.format_name, tuple(self.constants), self.info)

    def signature(self) -> RegionSignature:
        return RegionSignature(self.symbol, self.backend, self.format_name, [(s.shape, s.dtype) for s in self.inputs],
                               [(s.shape, s.dtype) for s in self.outputs], {s.name: (s.shape, s.dtype) for s in self.constant_specs})

    def describe(self) -> dict:
        data = asdict(self)
        del data["payload"]
        data["payload_bytes"] = len(self.payload)
        if self.settings is None:
            del data["settings"]
        return data


@dataclass(frozen=True)
class DirectCall:
    """The region the model is, which model input each of its inputs is, and which region
    output each model output is. In a model with dynamic dimensions, some region inputs may be
    values of the shape alone instead (`shape_values`: region input position -> position among
    the host's once-per-shape values, computed for the dimensions `dims` in that order); the
    model inputs in `inputs` then feed the region's other inputs, in order."""

    symbol: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    shape_values: Mapping[int, int] = field(default_factory=dict)
    dims: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        data = {"symbol": self.symbol, "inputs": list(self.inputs), "outputs": list(self.outputs)}
        if self.shape_values:
            data.update(shape_values={str(k): v for k, v in self.shape_values.items()}, dims=list(self.dims))
        return data

    @staticmethod
    def from_dict(data: dict) -> DirectCall:
        return DirectCall(str(data["symbol"]), tuple(int(i) for i in data["inputs"]), tuple(int(o) for o in data["outputs"]),
                          {int(k): int(v) for k, v in data.get("shape_values", {}).items()}, tuple(data.get("dims", ())))

    def fed_by_inputs(self, region: RegionArtifact) -> list[TensorSpec]:
        """The region's inputs that model inputs feed (those in `inputs`), in order."""
        return [spec for position, spec in enumerate(region.inputs) if position not in self.shape_values]

    def check(self, artifacts: Sequence[RegionArtifact], inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
              where: str, specialised: Sequence[SpecialisedRegion] = ()) -> None:
        """Raise ArtifactError unless this call fits the model's region and tensors (a region
        generated per shape: one of its variants, but for the sizes)."""
        per_shape = next((r for r in specialised if r.symbol == self.symbol and r.variants and not r.symbolic), None)
        symbol = next(iter(per_shape.variants.values())) if per_shape is not None else self.symbol
        region = next((a for a in artifacts if a.symbol == symbol), None)
        if region is None:
            raise ArtifactError(f"{where}: the direct call names region {self.symbol!r}, which is not a region of the model")
        fed = self.fed_by_inputs(region)
        ok = (len(self.inputs) == len(fed) and len(self.outputs) == len(outputs)
              and all(0 <= p < len(region.inputs) for p in self.shape_values)
              and all(0 <= i < len(inputs) and (_same_kind if per_shape is not None else _same)(inputs[i], spec) for i, spec in zip(self.inputs, fed))
              and all(0 <= o < len(region.outputs) and (_same_kind if per_shape is not None else _same)(region.outputs[o], spec)
                      for o, spec in zip(self.outputs, outputs)))
        if not ok:
            raise ArtifactError(f"{where}: the direct call of region {self.symbol} does not match the model's inputs and outputs")


def _same_kind(a: TensorSpec, b: TensorSpec) -> bool:
    """Same dtype and rank (a variant of a region generated per shape, against the model)."""
    return a.dtype == b.dtype and len(a.shape) == len(b.shape)


def _same(a: TensorSpec, b: TensorSpec) -> bool:
    """Same dtype and shape; the model records an output dimension that is an expression of its
    named ones as -1, which matches any expression of a region's."""
    return a.dtype == b.dtype and len(a.shape) == len(b.shape) and all(
        x == y or (isinstance(x, str) and y == -1) or (x == -1 and isinstance(y, str)) for x, y in zip(a.shape, b.shape))


@dataclass(frozen=True)
class EmbeddedEngine:
    """A region's engine built at compile time (`build(..., engines="embed")`), and what it is
    bound to on the machine that built it (the vendor's `JsonRuntime.environment`). `plan` is
    the vendor's saved engine behind a header with its checksum and the region's cache key."""

    plan: bytes
    environment: dict[str, str]


# The variant key of a region whose one variant takes every shape.
SYMBOLIC = "any_shape"


@dataclass
class SpecialisedRegion:
    """A region generated per shape: what the artifact keeps of it."""

    symbol: str
    backend: str
    dims: list[str]  # the named dimensions its tensors use
    # Each input's dimensions as the region sees them: an int, a dimension's name, or None (an
    # expression): the variant for a call is read off its tensors.
    input_dims: list[list[int | str | None]]
    # The region's Relax function as TVMScript, its tensor constants lifted to parameters; None
    # where it cannot be written so (then only the variants built ahead exist).
    template: str | None
    template_constants: list[str]  # constant store names bound to those parameters, in order
    variants: dict[str, str] = field(default_factory=dict)  # variant key -> the symbol of its region artifact
    # One variant for every shape (SYMBOLIC, its code written with symbolic shapes: a backend
    # that declares `symbolic_shapes`); else why the region is generated per shape, where its
    # backend takes symbolic shapes but not this region's.
    symbolic: bool = False
    per_shape_reason: str = ""

    def key(self, values: Mapping[str, int]) -> str:
        if self.symbolic:
            return SYMBOLIC
        return "_".join(f"{name}{values[name]}" for name in self.dims)

    def variant_symbol(self, values: Mapping[str, int]) -> str:
        return f"{self.symbol}__{self.key(values)}"

    def has_variant(self, symbol: str) -> bool:
        """Whether `symbol` names one of this region's variants (`variant_symbol`)."""
        return symbol.startswith(f"{self.symbol}__")

    def describe(self) -> dict:
        return {"symbol": self.symbol, "backend": self.backend, "dims": list(self.dims), "input_dims": self.input_dims,
                "template_constants": list(self.template_constants), "variants": dict(self.variants),
                "symbolic": self.symbolic, **({"per_shape_reason": self.per_shape_reason} if self.per_shape_reason else {})}


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
    # The model as one region called with its inputs (see byoc.runtime_metadata.direct), or None.
    direct_call: DirectCall | None = None
    # A model with dynamic dimensions: their ranges, its shape-specialised regions (whose
    # variants are among `artifacts`) and how many variants per region built on first use are
    # kept in memory (see byoc.runtime_metadata.shapes).
    dims: dict[str, DimRange] = field(default_factory=dict)
    # What the model's ops need of those dimensions, checked on each new input shape (see
    # byoc.ir.shape_conditions).
    shape_checks: list[ShapeCheck] = field(default_factory=list)
    dims_origin: dict[str, str] = field(default_factory=dict)  # where each range comes from, as the report says it
    # The nodes that run in onnxruntime after the compiled model, where shapes depend on the
    # data (see byoc.ir.tail); `outputs` are then the compiled part's, the tail's the model's.
    tail: ModelTail | None = None
    specialised: list[SpecialisedRegion] = field(default_factory=list)
    max_shapes: int = DEFAULT_MAX_SHAPES
    shape_memory: int = DEFAULT_SHAPE_MEMORY  # bytes (see byoc.runtime_metadata.shape_memory)
    # Inputs the model declares and never reads: `run` takes them by name and ignores them
    # (see byoc.ir.ignored_inputs).
    ignored_inputs: list[str] = field(default_factory=list)
