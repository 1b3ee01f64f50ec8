"""Greedy merging of adjacent supported nodes into regions, without cycles, within the
per-region limits of the cost rules (paper sections 3.1.2 and 3.1.3).

TVM's MergeCompositeFunctions grows faster than linearly (3.6x the time for 2x the ops, 5.7 s at
10,000 ops) and knows neither region limits nor host reasons, so merging is done here in one
pass over the nodes in topological order. Each node carries the set of regions it depends on as
a bit mask; a node may join (and so fuse together) the regions of its inputs when none of its
other inputs depends on them and none of them depends on another, which keeps the region graph
acyclic. Masks are Python integers, so the dependency tests are word-parallel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm import relax

from byoc.backend.cost import CostRules
from byoc.partition.dataflow import GLUE, Node


@dataclass(eq=False)
class Region:
    rid: int
    backend: int
    members: list[int] = field(default_factory=list)
    num_ops: int = 0
    macs: int = 0
    working_bytes: int = 0
    idmask: int = 0
    ext_deps: int = 0

    def add(self, node: Node) -> None:
        self.members.append(node.index)
        self.num_ops += node.num_ops
        self.macs += node.macs
        self.working_bytes += node.const_bytes + node.out_bytes

    def absorb(self, other: Region) -> None:
        self.members.extend(other.members)
        self.num_ops += other.num_ops
        self.macs += other.macs
        self.working_bytes += other.working_bytes
        self.idmask |= other.idmask
        self.ext_deps |= other.ext_deps


def _fits(rules: CostRules, regions: list[Region], node: Node) -> bool:
    ops = node.num_ops + sum(r.num_ops for r in regions)
    macs = node.macs + sum(r.macs for r in regions)
    working = node.const_bytes + node.out_bytes + sum(r.working_bytes for r in regions)
    return not (
        (rules.max_ops_per_region is not None and ops > rules.max_ops_per_region)
        or (rules.max_macs_per_region is not None and macs > rules.max_macs_per_region)
        or (rules.max_bytes_per_region is not None and working > rules.max_bytes_per_region)
    )


class _RegionBuilder:
    def __init__(self, nodes: list[Node], rules: list[CostRules]) -> None:
        self.nodes = nodes
        self.rules = rules
        self.region_of = [-1] * len(nodes)  # raw region id of each node
        self.deps = [0] * len(nodes)  # regions each node depends on, as raw-id bits
        self.parent: list[int] = []  # union-find over raw region ids
        self.regions: dict[int, Region] = {}

    def find(self, rid: int) -> int:
        parent = self.parent
        while parent[rid] != rid:
            parent[rid] = parent[parent[rid]]
            rid = parent[rid]
        return rid

    def _input_deps(self, producer: int) -> int:
        rid = self.region_of[producer]
        return self.deps[producer] | (1 << rid if rid >= 0 else 0)

    def _glue_backend(self, node: Node) -> int:
        # A tuple made of region outputs is built on the host: a region returns tensors only.
        if isinstance(node.binding.value, relax.Tuple):
            return -1
        backends = {self.regions[self.find(self.region_of[p])].backend if self.region_of[p] >= 0 else -1 for p in node.inputs}
        return backends.pop() if len(backends) == 1 else -1

    def place(self, node: Node) -> None:
        deps = 0
        for producer in node.inputs:
            deps |= self._input_deps(producer)
        self.deps[node.index] = deps
        backend = self._glue_backend(node) if node.kind == GLUE else node.backend
        if backend < 0:
            return
        group = self._mergeable_regions(node, backend)
        if group:
            target = group[0]
            for other in group[1:]:
                self.parent[other.rid] = target.rid
                del self.regions[other.rid]
                target.absorb(other)
        elif node.kind == GLUE:
            return  # glue alone is not worth a region
        else:
            rid = len(self.parent)
            self.parent.append(rid)
            target = self.regions[rid] = Region(rid, backend, idmask=1 << rid)
        target.add(node)
        target.ext_deps |= self._external_deps(node, target.idmask)
        self.region_of[node.index] = target.rid

    def _mergeable_regions(self, node: Node, backend: int) -> list[Region]:
        candidates: list[Region] = []
        for producer in node.inputs:
            rid = self.region_of[producer]
            if rid >= 0:
                region = self.regions[self.find(rid)]
                if region.backend == backend and region not in candidates:
                    candidates.append(region)
        group: list[Region] = []
        group_mask = 0
        for region in candidates:
            if not _fits(self.rules[backend], [*group, region], node):
                continue
            if region.ext_deps & group_mask or any(member.ext_deps & region.idmask for member in group):
                continue
            trial_mask = group_mask | region.idmask
            if self._external_deps(node, trial_mask) & trial_mask:
                continue
            group.append(region)
            group_mask = trial_mask
        return group

    def _external_deps(self, node: Node, inside_mask: int) -> int:
        """Regions that node's inputs from outside `inside_mask` depend on (or belong to)."""
        deps = 0
        for producer in node.inputs:
            rid = self.region_of[producer]
            if rid >= 0 and (1 << rid) & inside_mask:
                continue
            deps |= self._input_deps(producer)
        return deps


def merge_regions(nodes: list[Node], rules: list[CostRules]) -> list[Region]:
    """Regions of nodes, each with one backend, members in binding order. `rules[b]` are the
    cost rules of backend b."""
    builder = _RegionBuilder(nodes, rules)
    for node in nodes:
        builder.place(node)
    regions = sorted(builder.regions.values(), key=lambda r: min(r.members))
    for region in regions:
        region.members.sort()
    return regions
