"""Reading a JSON graph: what a reference points at."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Ref = Mapping[str, Any]


def value_spec(graph: Mapping[str, Any], ref: Ref) -> Mapping[str, Any]:
    """Shape and dtype ({"shape", "dtype"}) of the tensor a reference points at."""
    if "input" in ref:
        return graph["inputs"][ref["input"]]
    if "const" in ref:
        return graph["constants"][ref["const"]]
    return graph["nodes"][ref["node"]]["outputs"][ref.get("index", 0)]


def tensor_refs(ref: Ref) -> list[Ref]:
    """The tensor references inside an argument (a tuple argument holds several)."""
    if "tuple" in ref:
        return [r for item in ref["tuple"] for r in tensor_refs(item)]
    if "input" in ref or "const" in ref or "node" in ref:
        return [ref]
    return []
