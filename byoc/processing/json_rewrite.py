"""Building a new JSON graph from an old one, node by node, for the processing passes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from byoc.codegen_json.references import Ref, ref_key, tensor_refs


class GraphWriter:
    """Copies nodes of `source` into a new graph, remapping references, and adds new nodes and
    constants. `mapping` sends keys of the source graph's tensors to references in the new one."""

    def __init__(self, source: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> None:
        self.source = source
        self.nodes: list[dict[str, Any]] = []
        self.constants: dict[str, np.ndarray] = dict(constants)
        self.constant_specs: dict[str, dict[str, Any]] = dict(source["constants"])
        self.mapping: dict[tuple, Ref] = {}
        self.inputs = [dict(spec) for spec in source["inputs"]]
        self._counter = 0

    def lookup(self, ref: Ref) -> Ref:
        """The new reference for a reference of the source graph (tuples and literals too)."""
        if "tuple" in ref:
            return {"tuple": [self.lookup(item) for item in ref["tuple"]]}
        key = ref_key(ref) if ("input" in ref or "const" in ref or "node" in ref) else None
        if key is None:
            return ref  # a literal: shape, scalar or string
        if key in self.mapping:
            return self.mapping[key]
        if "node" in ref:
            raise KeyError(f"node {ref['node']} has no counterpart in the rewritten graph")
        return ref
    def constant(self, array: np.ndarray, hint: str) -> Ref:
        self._counter += 1
        name = f"{self.source['symbol']}.{hint}{self._counter}"
        self.constants[name] = np.require(array, requirements="C")
        self.constant_specs[name] = {"shape": list(array.shape), "dtype": str(array.dtype)}
        return {"const": name}

    def add(
        self,
        op: str,
        args: Sequence[Ref],
        outputs: Sequence[Mapping[str, Any]],
        name: str,
        attrs: Mapping[str, Any] | None = None,
        attrs_type: str | None = None,
        composite: Mapping[str, Any] | None = None,
    ) -> Ref:
        node: dict[str, Any] = {"id": len(self.nodes), "name": name, "op": op, "args": list(args), "attrs": dict(attrs or {}),
                                "outputs": [dict(o) for o in outputs]}
        if attrs_type is not None:
            node["attrs_type"] = attrs_type
        if composite is not None:
            node["composite"] = dict(composite)
        self.nodes.append(node)
        return {"node": node["id"], "index": 0}

    def copy(self, node: Mapping[str, Any], args: Sequence[Ref] | None = None, **changes) -> list[Ref]:
        """Copy a source node with its arguments remapped; returns refs to its outputs, which also
        become the mapping of the source node's outputs."""
        copied = {key: value for key, value in node.items() if key != "id"}
        copied["args"] = list(args) if args is not None else [self.lookup(a) for a in node["args"]]
        copied.update(changes)
        copied["id"] = len(self.nodes)
        self.nodes.append(copied)
        refs = [{"node": copied["id"], "index": i} for i in range(len(copied["outputs"]))]
        for index, ref in enumerate(refs):
            self.mapping[("node", node["id"], index)] = ref
        return refs

    def graph(self, outputs: Sequence[Ref]) -> dict[str, Any]:
        refs = [r for n in self.nodes for a in n["args"] for r in tensor_refs(a)] + list(outputs)
        used = {r["const"] for r in refs if "const" in r}
        return {
            **{k: v for k, v in self.source.items() if k not in ("nodes", "constants", "outputs", "inputs")},
            "inputs": self.inputs,
            "nodes": self.nodes,
            "outputs": list(outputs),
            "constants": {name: spec for name, spec in self.constant_specs.items() if name in used},
        }

    def used_constants(self, graph: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {name: self.constants[name] for name in graph["constants"]}

