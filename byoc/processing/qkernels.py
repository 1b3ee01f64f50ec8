"""Reading a quantized (QDQ) region graph as int8 kernels, for int8 code generators.

Every compute kernel of a QDQ graph reads dequantized int8 tensors and int8 weights and its
result is quantized: this module resolves those quantize/dequantize nodes into the scales and
int8 data a code generator needs, so that a vendor walks kernels, not QDQ plumbing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

from byoc.codegen_json.references import kernels, ref_key
from byoc.errors import CodegenError

_QDQ = {"relax.quantize", "relax.dequantize"}


@dataclass(frozen=True)
class QTensor:
    """An int8 activation: produced by the quantize node `id` (its scale and zero point)."""

    id: int
    shape: tuple[int, ...]
    scale: float
    zero_point: int
    input_index: int | None = None  # the region input it quantizes, if any


@dataclass(frozen=True)
class QWeights:
    data: np.ndarray  # int8
    scale: np.ndarray  # per output channel (or one value)
    axis: int


@dataclass
class QKernel:
    index: int
    pattern: str | None
    nodes: list[dict[str, Any]]
    output: QTensor | None  # None when the result is not a quantized float (e.g. indices)
    operands: dict[tuple[int, int], object] = field(default_factory=dict)  # (node id, arg) -> operand

    def node(self, op: str) -> dict[str, Any] | None:
        return next((n for n in self.nodes if n["op"] == op), None)

    def ops(self) -> list[str]:
        return [n["op"] for n in self.nodes]

    def operand(self, node: dict[str, Any], index: int):
        """What argument `index` of `node` is: a QTensor (int8 activation), QWeights, a float
        constant (ndarray), "internal" (computed inside the kernel) or the literal reference."""
        return self.operands[(node["id"], index)]

    def bias(self, where: str) -> np.ndarray | None:
        """The constant operand of the kernel's add (its fused bias), or None without an add."""
        add = self.node("relax.add")
        if add is None:
            return None
        constants = [value for value in (self.operand(add, 0), self.operand(add, 1)) if isinstance(value, np.ndarray)]
        if not constants:
            raise CodegenError(f"{where}: node {add['name']!r} adds a computed tensor, not a constant bias, to {self.nodes[0]['name']!r}")
        return np.asarray(constants[0], np.float64)

    def inputs(self) -> list[QTensor]:
        """The int8 activations the kernel reads, in argument order (tuple arguments unpacked)."""
        seen: dict[int, QTensor] = {}
        for value in self.operands.values():
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, QTensor):
                    seen.setdefault(item.id, item)
        return list(seen.values())


def _scalar(array: np.ndarray) -> float:
    return float(np.asarray(array).reshape(-1)[0])


def _resolve(arg, inside: set[int], dequantized: dict[int, object], constants: Mapping[str, np.ndarray]):
    if "tuple" in arg:
        return [_resolve(item, inside, dequantized, constants) for item in arg["tuple"]]
    if "node" in arg and arg["node"] in inside:
        return "internal"
    if "node" in arg and arg["node"] in dequantized:
        return dequantized[arg["node"]]
    if "const" in arg:
        return constants[arg["const"]]
    return arg


def quantized_kernels(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> tuple[list[QKernel], list[QTensor]]:
    """The compute kernels of a QDQ graph, and the quantized tensor behind each graph output."""
    nodes = graph["nodes"]
    tensors: dict[int, QTensor] = {}  # quantize node id -> tensor
    dequantized: dict[int, object] = {}  # dequantize node id -> QTensor or QWeights
    quantizes_of: dict[tuple, int] = {}  # key of a float value -> the quantize node reading it
    for node in nodes:
        if node["op"] == "relax.quantize":
            source, scale, zero = node["args"]
            tensors[node["id"]] = QTensor(
                node["id"], tuple(node["outputs"][0]["shape"]), _scalar(constants[scale["const"]]), int(_scalar(constants[zero["const"]])),
                source.get("input"),
            )
            quantizes_of[ref_key(source)] = node["id"]
        elif node["op"] == "relax.dequantize":
            source, scale = node["args"][0], node["args"][1]
            if "const" in source:
                dequantized[node["id"]] = QWeights(constants[source["const"]], np.asarray(constants[scale["const"]]), node["attrs"]["axis"])
            else:
                dequantized[node["id"]] = tensors[source["node"]]

    found = []
    for kernel in kernels(graph):
        if kernel.nodes[0]["op"] in _QDQ:
            continue
        inside = {n["id"] for n in kernel.nodes}
        qkernel = QKernel(kernel.index, kernel.pattern, kernel.nodes, None)
        for node in kernel.nodes:
            for position, arg in enumerate(node["args"]):
                qkernel.operands[(node["id"], position)] = _resolve(arg, inside, dequantized, constants)
        quantize = quantizes_of.get(ref_key({"node": kernel.result["id"], "index": 0}))
        qkernel.output = tensors.get(quantize) if quantize is not None else None
        found.append(qkernel)
    outputs = []
    for ref in graph["outputs"]:
        value = dequantized.get(ref.get("node"))
        if not isinstance(value, QTensor):
            raise ValueError(f"region {graph['symbol']}: output {ref} is not a dequantized int8 tensor")
        outputs.append(value)
    return found, outputs


T = TypeVar("T")


class TensorTable(Generic[T]):
    """Numbers the int8 tensors of a region for a device program, in first-use order, keeping
    the program's own description of each (`make`) and which region input each one is."""

    def __init__(self, make: Callable[[QTensor], T]) -> None:
        self.items: list[T] = []
        self._make = make
        self._index: dict[int, int] = {}
        self._inputs: dict[int, int] = {}

    def __call__(self, tensor: QTensor) -> int:
        if tensor.id not in self._index:
            self._index[tensor.id] = len(self.items)
            self.items.append(self._make(tensor))
            if tensor.input_index is not None:
                self._inputs[tensor.input_index] = self._index[tensor.id]
        return self._index[tensor.id]

    def region_inputs(self) -> list[int]:
        return [self._inputs[i] for i in sorted(self._inputs)]
