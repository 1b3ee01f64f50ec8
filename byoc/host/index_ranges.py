"""What the index operand of take, gather_elements, gather_nd, scatter_elements and scatter_nd
may hold, and the error that names the node, the op, the index and the valid range when it holds
something else: raised by the host's checked kernels (`indices`) and made from an engine's report
(onnxruntime's words) by the runtime.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import tvm_ffi

from byoc.errors import IndexOutOfRangeError

RAISE = "byoc.host.index_out_of_range"
# The ONNX op each Relax op comes from, for the message (the binding names the node).
ONNX_OPS = {"relax.take": "Gather", "relax.gather_elements": "GatherElements", "relax.gather_nd": "GatherND",
            "relax.scatter_nd": "ScatterND", "relax.scatter_elements": "ScatterElements"}
COORDINATES = frozenset({"relax.gather_nd", "relax.scatter_nd"})  # the last index axis holds coordinates

_raised = threading.local()


def index_axes(op: str, attrs: Mapping[str, Any], rank: int, index_shape: Sequence[int]) -> tuple[int, ...]:
    """The data axes the index operand of `op` addresses: one, or one per coordinate slot."""
    if op in COORDINATES:
        start = int(attrs.get("batch_dims", 0)) if op == "relax.gather_nd" else 0
        return tuple(range(start, start + int(index_shape[-1])))
    return (int(attrs.get("axis") or 0) % rank,)


def describe(what: str, value: int | None, ranges: Sequence[tuple[int, int, int]]) -> str:
    """`what` (the node and op) with index `value` outside `ranges` ((axis, low, high) each)."""
    index = f"index {value}" if value is not None else "an index"
    if len(ranges) == 1:
        axis, low, high = ranges[0]
        return f"{what}: {index} is out of range for axis {axis} of size {high + 1}; valid indices are {low} to {high}"
    listed = ", ".join(f"{low} to {high} on axis {axis}" for axis, low, high in ranges)
    return f"{what}: {index} is out of range; valid indices are {listed}"


@tvm_ffi.register_global_func(RAISE)
def _index_out_of_range(node: str, op: str, value: int, low: int, high: int, axis: int) -> None:
    error = IndexOutOfRangeError(describe(f"node {node!r} ({op})", value, [(axis, low, high)]))
    # The VM hands the caller a RuntimeError with this text; `take_index_error` gives the original.
    _raised.error = error
    raise error


def take_index_error() -> IndexOutOfRangeError | None:
    """The error this thread's last run raised for an index out of range, once."""
    error = getattr(_raised, "error", None)
    _raised.error = None
    return error


# onnxruntime's report of a failed node, its words for an index out of range, and the index.
_ORT_NODE = re.compile(r"while running (\w+) node\. Name:'([^']*)' Status Message: (.*)", re.S)
_ORT_OUT_OF_RANGE = re.compile(r"out of (data )?bounds|out of range|invalid ind", re.I)
_ORT_INDEX = re.compile(r"(?:idx=|ind(?:ex|ice) = )(-?\d+)")


def engine_index_error(text: str, graph_json: bytes, where: str) -> IndexOutOfRangeError | None:
    """An engine's failure `text` on an index out of range as the host reports it, for a JSON
    region `graph_json`: onnxruntime names the node (byoc's name, with a `__<n>` suffix) and,
    for most ops, the index; the valid range comes from the region's graph."""
    found = _ORT_NODE.search(text)
    if found is None or not _ORT_OUT_OF_RANGE.search(found.group(3)):
        return None
    op, node = found.group(1), re.sub(r"__\d+$", "", found.group(2))
    index = _ORT_INDEX.search(found.group(3))
    what = f"node {node!r} ({op}) {where}" if node else f"{op} {where}"
    try:
        ranges = _ranges(json.loads(graph_json), node)
    except (ValueError, KeyError, IndexError, TypeError):  # a graph of another shape: the report says less
        ranges = []
    if not ranges:
        return IndexOutOfRangeError(f"{what}: {found.group(3).strip().splitlines()[0]}")
    return IndexOutOfRangeError(describe(what, int(index.group(1)) if index else None, ranges))


def _ranges(graph: Mapping[str, Any], node_name: str) -> list[tuple[int, int, int]]:
    node = next((n for n in graph.get("nodes", []) if n.get("name") == node_name and n.get("op") in ONNX_OPS), None)
    if node is None:
        return []
    data, indices = (_shape(graph, ref) for ref in node["args"][:2])
    return [(axis, -data[axis], data[axis] - 1) for axis in index_axes(node["op"], node["attrs"], len(data), indices)]


def _shape(graph: Mapping[str, Any], ref: Mapping[str, Any]) -> list[int]:
    if "input" in ref:
        return graph["inputs"][ref["input"]]["shape"]
    if "node" in ref:
        return graph["nodes"][ref["node"]]["outputs"][ref.get("index", 0)]["shape"]
    return graph["constants"][ref["const"]]["shape"]
