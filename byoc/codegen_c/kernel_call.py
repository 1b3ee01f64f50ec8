"""What an emitter of a C kernel library reads and writes: the buffers of one kernel, the nodes it
covers, and the C it returns (file-scope state, code run once at initialisation, code run per
call). The generator (`generate`) makes the calls; each library's emitters answer them."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from byoc.backend.settings import VendorSettings

C_TYPES = {
    "float32": "float",
    "float64": "double",
    "float16": "uint16_t",
    "int8": "int8_t",
    "uint8": "uint8_t",
    "int32": "int32_t",
    "int64": "int64_t",
    "bool": "uint8_t",
}


@dataclass(frozen=True)
class CBuffer:
    """A tensor as the generated C sees it: `name` is a pointer of type `ctype*`."""

    name: str
    shape: tuple[int, ...]  # a dimension may be a SymbolicDim (byoc.codegen_c.symbolic_shapes): `str()` writes it in C
    dtype: str
    kind: str  # "input", "output", "constant", "intermediate" or "internal" (no memory)

    @property
    def ctype(self) -> str:
        return C_TYPES[self.dtype]

    @property
    def size(self) -> int:
        """Its element count: an expression where the shape is symbolic (byoc.codegen_c.symbolic_shapes)."""
        return math.prod(self.shape)


@dataclass
class KernelCall:
    """One kernel of a region: the JSON nodes it covers and the buffers it reads and writes."""

    region: str
    name: str  # a unique C identifier prefix for this kernel's state
    pattern: str | None  # composite pattern name without the backend prefix, or None
    nodes: list[dict[str, Any]]
    inputs: list[CBuffer]
    outputs: list[CBuffer]
    constants: Mapping[str, np.ndarray]  # values of constant inputs, by buffer name
    arg_buffers: list[list[CBuffer | None]]  # per node, per argument: its buffer (None: not a tensor)
    graph: Mapping[str, Any] = field(default_factory=dict)  # the whole region, for emitters that look around
    # per node, per output: its buffer, "internal" ones (read by nobody outside) included
    node_outputs: list[list[CBuffer]] = field(default_factory=list)
    settings: VendorSettings = field(default_factory=VendorSettings)  # the vendor's settings
    readers: Mapping[tuple, list[dict[str, Any]]] = field(default_factory=dict)  # by value ("node", id, index): the region's nodes reading it

    def node(self, op: str) -> dict[str, Any]:
        """The (first) node of this kernel with op `op`."""
        return next(n for n in self.nodes if n["op"] == op)

    def arg(self, node: dict[str, Any], index: int) -> CBuffer:
        buffer = self.arg_buffers[self.nodes.index(node)][index]
        if buffer is None:
            raise ValueError(f"argument {index} of node {node['name']!r} is not a tensor")
        return buffer

    def readers_of(self, node: dict[str, Any], index: int = 0) -> list[dict[str, Any]]:
        """The nodes of the region that read output `index` of `node` (of any kernel)."""
        return list(self.readers.get(("node", node["id"], index), ()))

    def where(self) -> str:
        """A human-readable location for error messages."""
        return f"region {self.region}, node {self.nodes[0]['name']}"


@dataclass
class KernelCode:
    state: str = ""
    init: str = ""
    run: str = ""
    # Extra include lines this kernel needs.
    includes: Sequence[str] = ()
    # In a region with symbolic shapes: whether its init reads `byoc_settled` (see
    # byoc.codegen_c.generate), so that it is made again when that changes.
    reads_settled: bool = False


Emitter = Callable[[KernelCall], KernelCode]
