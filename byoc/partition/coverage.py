"""What one backend would take of a model on its own, by binding position of `main`.

Measured placement (`byoc.placement`) cuts the model into segments and asks, per segment, which
backends can run all of it; it needs each backend's grouping and annotation alone, mapped back
to the ungrouped bindings: the positions it takes, and the composites (one instruction each)
that a cut must not split.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import tvm
from tvm import relax

from byoc.backend.spec import Backend
from byoc.partition.dataflow import COMPOSITE, OP, build_block_graph, composite_infos
from byoc.partition.group import PlacementPolicy, composite_members, group_patterns
from byoc.partition.op_claims import annotate_nodes
from byoc.partition.reasons import HostReasons


@dataclass(frozen=True)
class Coverage:
    backend: str
    taken: frozenset[int]  # binding positions of the ops the backend takes
    composites: tuple[tuple[int, ...], ...]  # positions of each composite's ops
    reasons: Mapping[int, str]  # position -> why the backend does not take that op


def backend_coverage(mod: tvm.IRModule, backend: Backend, host_ops: frozenset[str] = frozenset()) -> Coverage:
    policy = PlacementPolicy([backend], [backend.rules()], host_ops, HostReasons())
    grouped, names = group_patterns(mod, policy)
    members = composite_members(grouped, policy)
    infos = composite_infos(grouped)
    taken: set[int] = set()
    reasons: dict[int, str] = {}
    for block in grouped["main"].body.blocks:
        graph = build_block_graph(block, infos, names)
        dataflow = isinstance(block, relax.DataflowBlock)
        if dataflow:
            annotate_nodes(graph.nodes, policy)
        for node in graph.nodes:
            if node.kind == COMPOSITE:
                taken.update(members[node.binding.var.id_])
            elif node.kind == OP and node.binding.var.id_ in policy.positions:
                position = policy.positions[node.binding.var.id_]
                if dataflow and node.backend == 0:
                    taken.add(position)
                else:
                    found = node.reasons or policy.reasons.of(node.name) or ["outside a dataflow block"]
                    reasons[position] = found[-1]
    return Coverage(backend.name, frozenset(taken), tuple(members.values()), reasons)
