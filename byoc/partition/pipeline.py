"""`partition_for`: group, annotate, merge, split and outline, for one or several backends."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import fields

import tvm
from tvm import relax

from byoc.backend.cost import CostRules
from byoc.backend.registry import get_backend
from byoc.backend.spec import Backend
from byoc.errors import PartitionError
from byoc.partition.annotate import annotate_nodes
from byoc.partition.fallback import fallback_reason
from byoc.partition.graph import COMPOSITE, OP, OPAQUE, BlockGraph, build_block_graph, composite_infos
from byoc.partition.group import PlacementPolicy, group_patterns
from byoc.partition.merge import merge_regions
from byoc.partition.outline import BlockPlan, RegionPlan, outline_regions
from byoc.partition.reasons import HostReasons
from byoc.partition.record import PARTITION_ATTR, HostOpRecord, PartitionRecord, RegionRecord
from byoc.partition.regions import region_boundary, summarize

_COST_OPTIONS = frozenset(f.name for f in fields(CostRules))


def resolve_backends(backends: str | Backend | Sequence[str | Backend]) -> list[Backend]:
    """Backends by name or object, in priority order (ties keep the order given)."""
    if isinstance(backends, (str, Backend)):
        backends = [backends]
    resolved = [get_backend(b) for b in backends]
    if not resolved:
        raise PartitionError("no backend given")
    names = [b.name for b in resolved]
    duplicates = sorted(n for n, count in Counter(names).items() if count > 1)
    if duplicates:
        raise PartitionError(f"backend(s) {duplicates} given more than once")
    order = sorted(range(len(resolved)), key=lambda i: (-resolved[i].priority, i))
    return [resolved[i] for i in order]


def partition_for(
    mod: tvm.IRModule,
    backends: str | Backend | Sequence[str | Backend],
    **options,
) -> tvm.IRModule:
    """Partition `mod["main"]` between the host and `backends`.

    Options are cost rules (see `byoc.CostRules`) applied over every backend's own:
    `max_ops_per_region`, `max_macs_per_region`, `max_bytes_per_region`, `min_ops_per_region`,
    `min_macs_per_region`, `fallback_without_macs`, `host_ops` (op names such as
    "relax.nn.softmax" or model node names) and `region_filter` (a callable that receives a
    `RegionSummary` and returns None/True to keep the region, or False/a reason to send it back
    to the host). The result carries a partition record that `byoc.partition.report` reads.
    """
    unknown = sorted(set(options) - _COST_OPTIONS)
    if unknown:
        raise PartitionError(f"unknown partition option(s) {unknown}; known options: {sorted(_COST_OPTIONS)}")
    ordered = resolve_backends(backends)
    _check_main_function(mod)
    rules = [backend.cost.with_options(**options) for backend in ordered]
    host_ops = frozenset().union(*(r.host_ops for r in rules))
    reasons = HostReasons()
    policy = PlacementPolicy(ordered, [b.rules() for b in ordered], host_ops, reasons)

    grouped, composite_names = group_patterns(mod, policy)
    composites = composite_infos(grouped)
    symbols = _SymbolSupply(grouped)
    record = PartitionRecord(backends=[b.name for b in ordered])
    plans: dict[int, BlockPlan] = {}
    for index, block in enumerate(grouped["main"].body.blocks):
        graph = build_block_graph(block, composites, composite_names)
        if isinstance(block, relax.DataflowBlock):
            annotate_nodes(graph.nodes, policy)
            plans[index] = _plan_block(graph, ordered, rules, symbols, record)
        else:
            for node in graph.nodes:
                node.reasons.append("outside a dataflow block (control flow or side effects)")
        _record_host_ops(graph, plans.get(index), reasons, record)
    partitioned = outline_regions(grouped, plans)
    return partitioned.with_attr(PARTITION_ATTR, json.dumps(record.to_dict()))


def _check_main_function(mod: tvm.IRModule) -> None:
    if not isinstance(mod, tvm.IRModule):
        raise PartitionError(f"expected a tvm.IRModule, got {type(mod).__name__}")
    names = [gv.name_hint for gv in mod.functions]
    if "main" not in names or not isinstance(mod["main"], relax.Function):
        raise PartitionError(f"the module has no Relax function 'main' (functions: {names})")


class _SymbolSupply:
    """Region symbols `<backend>_<n>`, skipping names the module already uses."""

    def __init__(self, mod: tvm.IRModule) -> None:
        self.taken = {gv.name_hint for gv in mod.functions}
        self.counters: Counter[str] = Counter()

    def next(self, backend: str) -> str:
        while True:
            symbol = f"{backend}_{self.counters[backend]}"
            self.counters[backend] += 1
            if symbol not in self.taken:
                self.taken.add(symbol)
                return symbol


def _plan_block(
    graph: BlockGraph,
    backends: list[Backend],
    rules: list[CostRules],
    symbols: _SymbolSupply,
    record: PartitionRecord,
) -> BlockPlan:
    plans = []
    for region in merge_regions(graph.nodes, rules):
        backend = backends[region.backend].name
        boundary = region_boundary(region, graph)
        summary = summarize(region, graph, backend, boundary)
        reason = fallback_reason(summary, rules[region.backend])
        if reason is not None:
            for member in region.members:
                graph.nodes[member].reasons.append(f"{backend}: {reason}")
                graph.nodes[member].backend = -1
            continue
        symbol = symbols.next(backend)
        plans.append(RegionPlan(region, boundary, backend, symbol))
        patterns = Counter(graph.nodes[i].op for i in region.members if graph.nodes[i].kind == COMPOSITE)
        record.regions.append(RegionRecord.from_summary(symbol, summary, dict(patterns)))
    return BlockPlan(graph, plans)


def _record_host_ops(graph: BlockGraph, plan: BlockPlan | None, reasons: HostReasons, record: PartitionRecord) -> None:
    offloaded = {m for p in (plan.regions if plan else []) for m in p.region.members}
    for node in graph.nodes:
        if node.kind not in (OP, COMPOSITE, OPAQUE) or not node.op_names:
            continue
        record.total_ops += node.num_ops
        record.total_macs += node.macs
        if node.index in offloaded:
            continue
        why = node.reasons + [r for r in reasons.of(node.name) if r not in node.reasons]
        record.host_ops.append(HostOpRecord(node.name, list(node.op_names), why or ["no backend takes it"], node.macs))
