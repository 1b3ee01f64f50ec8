"""Reading a JSON graph: what a reference points at."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

Ref = Mapping[str, Any]


def value_spec(graph: Mapping[str, Any], ref: Ref) -> Mapping[str, Any]:
    """Shape and dtype ({"shape", "dtype"}) of the tensor a reference points at."""
    if "input" in ref:
        return graph["inputs"][ref["input"]]
    if "const" in ref:
        return graph["constants"][ref["const"]]
    return graph["nodes"][ref["node"]]["outputs"][ref.get("index", 0)]


def dimension_uses(graph: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """Every size the graph's input and node shapes hold, and every value its nodes are given
    (where a symbolic graph's dimensions may appear, see byoc.codegen_json.symbolic_dims), each with where
    it is: `input 'x'` or `node 'n'`."""

    def in_ref(ref: Ref) -> Iterator[Any]:
        yield from ref.get("shape", ())
        if "prim" in ref:
            yield ref["prim"]
        for item in ref.get("tuple", ()):
            yield from in_ref(item)

    for spec in graph["inputs"]:
        for dim in spec["shape"]:
            yield f"input {spec['name']!r}", dim
    for node in graph["nodes"]:
        where = f"node {node['name']!r}"
        for spec in node["outputs"]:
            for dim in spec["shape"]:
                yield where, dim
        for arg in node["args"]:
            for dim in in_ref(arg):
                yield where, dim


def tensor_refs(ref: Ref) -> list[Ref]:
    """The tensor references inside an argument (a tuple argument holds several)."""
    if "tuple" in ref:
        return [r for item in ref["tuple"] for r in tensor_refs(item)]
    if "input" in ref or "const" in ref or "node" in ref:
        return [ref]
    return []


@dataclass
class GraphKernel:
    """What one accelerator instruction covers: the nodes of one composite, or a single node."""

    index: int
    nodes: list[dict[str, Any]]
    pattern: str | None  # the composite's pattern name without the backend prefix

    @property
    def result(self) -> dict[str, Any]:
        """The node whose outputs are the kernel's outputs (a composite returns its last op)."""
        return self.nodes[-1]

    def output_refs(self) -> list[dict[str, int]]:
        return [{"node": self.result["id"], "index": i} for i in range(len(self.result["outputs"]))]


def kernels(graph: Mapping[str, Any]) -> list[GraphKernel]:
    """Consecutive nodes of one composite form a kernel; any other node is a kernel alone."""
    found: list[GraphKernel] = []
    current_id = None
    for node in graph["nodes"]:
        composite = node.get("composite")
        if composite is not None and composite["id"] == current_id:
            found[-1].nodes.append(node)
            continue
        current_id = composite["id"] if composite else None
        pattern = composite["pattern"].split(".", 1)[1] if composite else None
        found.append(GraphKernel(len(found), [node], pattern))
    return found


def ref_key(ref: Ref) -> tuple:
    """A hashable identity of the tensor a reference points at."""
    if "input" in ref:
        return ("input", ref["input"])
    if "const" in ref:
        return ("const", ref["const"])
    return ("node", ref["node"], ref.get("index", 0))
