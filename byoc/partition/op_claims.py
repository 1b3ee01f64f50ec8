"""Per-op annotation (paper section 3.1.2): decide, for each node, which backend may take it.

Composites already carry their backend in their name. A single op goes to the first backend,
in priority order, whose op rule and limits accept it; every rejection is kept as a reason.
Glue nodes are placed later, with the region of what they read.
"""

from __future__ import annotations

from byoc.partition.dataflow import COMPOSITE, OP, OPAQUE, Node
from byoc.partition.group import HOST, PlacementPolicy
from byoc.partition.reasons import SHAPE_ONLY


def annotate_nodes(nodes: list[Node], policy: PlacementPolicy) -> None:
    index_of = {backend.name: i for i, backend in enumerate(policy.backends)}
    for node in nodes:
        if node.kind == COMPOSITE:
            node.backend = index_of[node.op.split(".", 1)[0]]
        elif node.kind == OP:
            _annotate_op(node, policy)
        elif node.kind == OPAQUE:
            node.reasons.append(f"{node.op} cannot be offloaded by any backend")


def _annotate_op(node: Node, policy: PlacementPolicy) -> None:
    if policy.placement.get(node.name) == HOST:
        why = policy.placement_why.get(node.name)
        node.reasons.append("measured placement keeps it on the host" + (f" ({why})" if why else ""))
        return
    if policy.forced_to_host(node.name, node.op):
        node.reasons.append("forced to the host by the host_ops option")
        return
    if node.binding.var.id_ in policy.shape_only:
        node.reasons.append(SHAPE_ONLY)
        return
    call = node.binding.value
    for index, backend in enumerate(policy.backends):
        reason = policy.op_rejection(index, call, node.name)
        if reason is None:
            node.backend = index
            return
        node.reasons.append(f"{backend.name}: {reason}")
