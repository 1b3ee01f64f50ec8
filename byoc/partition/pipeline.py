"""Partitioning: group, annotate, merge, split and outline, for one or several backends."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import tvm
from tvm import relax

from byoc.backend.codegen import SETTINGS_ATTR
from byoc.backend.cost import COST_OPTIONS, CostRules
from byoc.backend.registry import get_backend
from byoc.backend.spec import Backend
from byoc.backend.views import RegionSummary
from byoc.errors import PartitionError, did_you_mean
from byoc.frontend.float16 import float16_in_float32, narrow_types
from byoc.frontend.int8_weights import for_partitioning
from byoc.ir.dims import copy_dims, dims_of, representative
from byoc.ir.shape_only import shape_only_calls
from byoc.partition.dataflow import COMPOSITE, OP, OPAQUE, BlockGraph, build_block_graph, composite_infos
from byoc.partition.fallback import fallback_reason
from byoc.partition.group import PlacementPolicy, group_patterns
from byoc.partition.merge import Region, merge_regions
from byoc.partition.op_claims import annotate_nodes
from byoc.partition.outline import CODEGEN_ATTR, BlockPlan, RegionPlan, outline_regions
from byoc.partition.reasons import HostReasons
from byoc.partition.record import PARTITION_ATTR, HostOpRecord, PartitionRecord, RegionRecord
from byoc.partition.regions import RegionBoundary, region_boundary, summarize


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


def partition_graph(
    mod: tvm.IRModule,
    backends: str | Backend | Sequence[str | Backend],
    placement: Mapping[str, str] | None = None,
    placement_why: Mapping[str, str] | None = None,
    **options,
) -> tvm.IRModule:
    """Partition `mod["main"]` between the host and `backends` (the core of
    `byoc.partition_for`, which also routes vendor options and calibrates).

    Options are cost rules (see `byoc.CostRules`) applied over every backend's own:
    `max_ops_per_region`, `max_macs_per_region`, `max_bytes_per_region`, `max_regions`,
    `min_ops_per_region`, `min_macs_per_region`, `fallback_without_macs`, `host_ops` (op names
    such as "relax.nn.softmax" or model node names) and `region_filter` (a callable that
    receives a `RegionSummary` and returns None/True to keep the region, or False/a reason to
    send it back to the host). `placement` (node name -> backend name or "host") overrides
    priority for the nodes it names, `placement_why` says why per node; measured placement
    (`byoc.placement`) makes both. The result carries a partition record that `byoc.report` reads.
    """
    unknown = sorted(set(options) - COST_OPTIONS)
    if unknown:
        raise PartitionError(f"unknown partition option(s) {unknown}; cost options are {sorted(COST_OPTIONS)}")
    # A model with dynamic dimensions is partitioned once for every shape: decisions see each
    # dimension at its representative value (see byoc.ir.dims), and the result keeps the ranges.
    dims = dims_of(mod)
    with representative({name: r.opt for name, r in dims.items()}):
        return copy_dims(mod, _partition(mod, backends, placement, placement_why, options))


def _partition(mod: tvm.IRModule, backends, placement: Mapping[str, str] | None, placement_why: Mapping[str, str] | None,
               options: dict) -> tvm.IRModule:
    ordered = resolve_backends(backends)
    _check_main_function(mod)
    quantized = [b for b in ordered if b.limits.quantized]
    mod = for_partitioning(mod, takes_quantized=bool(quantized), int8_weights=any(b.limits.int8_weights for b in quantized),
                           as_written=bool(quantized) and all(b.limits.quantized_as_written for b in quantized))
    # A float16 (or bfloat16) model computes in float32 unless its first backend takes its narrow
    # types; what such a backend leaves to the host computes in float32 after outlining
    # (byoc.frontend.float16).
    widened = 0
    takes_float16 = ordered[0].limits.dtypes is None or narrow_types(mod["main"]) <= set(ordered[0].limits.dtypes)
    if not takes_float16:
        mod, widened = float16_in_float32(mod)
    rules = [backend.cost.with_options(**options) for backend in ordered]
    host_ops = frozenset().union(*(r.host_ops for r in rules))
    reasons = HostReasons()
    policy = PlacementPolicy(ordered, [b.rules() for b in ordered], host_ops, reasons, dict(placement or {}), dict(placement_why or {}))

    grouped, composite_names = group_patterns(mod, policy)
    policy.shape_only = shape_only_calls(grouped["main"])
    composites = composite_infos(grouped)
    graphs: dict[int, BlockGraph] = {}
    candidates: list[_Candidate] = []
    for index, block in enumerate(grouped["main"].body.blocks):
        graph = graphs[index] = build_block_graph(block, composites, composite_names)
        if isinstance(block, relax.DataflowBlock):
            annotate_nodes(graph.nodes, policy)
            candidates += _candidates(index, graph, ordered, rules)
        else:
            for node in graph.nodes:
                node.reasons.append("outside a dataflow block (control flow or side effects)")
    _warn_of_unmatched(host_ops, graphs.values())
    _keep_heaviest(candidates, rules)
    symbols = _SymbolSupply(grouped)
    record = PartitionRecord(backends=[b.name for b in ordered], float16_in_float32=widened)
    plans = {index: BlockPlan(graph, []) for index, graph in graphs.items() if isinstance(grouped["main"].body.blocks[index], relax.DataflowBlock)}
    for candidate in candidates:
        graph = graphs[candidate.block]
        backend = ordered[candidate.region.backend]
        if candidate.fallback is not None:
            for member in candidate.region.members:
                graph.nodes[member].reasons.append(f"{backend.name}: {candidate.fallback}")
                graph.nodes[member].backend = -1
            continue
        symbol = symbols.next(backend.name)
        plans[candidate.block].regions.append(RegionPlan(candidate.region, candidate.boundary, backend.name, symbol))
        members = [graph.nodes[i] for i in candidate.region.members]
        patterns = Counter(node.op for node in members if node.kind == COMPOSITE)
        record.regions.append(RegionRecord.from_summary(symbol, candidate.summary, dict(patterns), _member_ops(members)))
    for index, graph in graphs.items():
        _record_host_ops(graph, plans.get(index), reasons, record)
    partitioned = outline_regions(grouped, plans)
    if takes_float16:
        partitioned, record.float16_in_float32 = float16_in_float32(partitioned)
    partitioned = _tag_settings(partitioned, ordered)
    return partitioned.with_attr(PARTITION_ATTR, json.dumps(record.to_dict()))


@dataclass
class _Candidate:
    """A merged region before the cost rules that look at every region have run."""

    block: int
    region: Region
    boundary: RegionBoundary
    summary: RegionSummary
    fallback: str | None


def _candidates(block: int, graph: BlockGraph, backends: list[Backend], rules: list[CostRules]) -> list[_Candidate]:
    found = []
    for region in merge_regions(graph.nodes, rules):
        boundary = region_boundary(region, graph)
        summary = summarize(region, graph, backends[region.backend].name, boundary)
        found.append(_Candidate(block, region, boundary, summary, fallback_reason(summary, rules[region.backend])))
    return found


def _keep_heaviest(candidates: list[_Candidate], rules: list[CostRules]) -> None:
    """Send back to the host every region of a backend past its `max_regions` heaviest."""
    for index, backend_rules in enumerate(rules):
        limit = backend_rules.max_regions
        kept = [c for c in candidates if c.region.backend == index and c.fallback is None]
        if limit is None or len(kept) <= limit:
            continue
        heaviest = sorted(kept, key=lambda c: -c.summary.macs)[:limit]
        for candidate in kept:
            if not any(candidate is h for h in heaviest):
                candidate.fallback = f"only the {limit} region(s) with the most MACs are kept (max_regions={limit})"


def _member_ops(members) -> list[list]:
    """[node, ops, MACs] for every member with ops: what the report needs if the region returns
    to the host at build time."""
    return [[node.name, list(node.op_names), node.macs] for node in members if node.op_names]


def _tag_settings(mod: tvm.IRModule, backends: list[Backend]) -> tvm.IRModule:
    """Regions carry to code generation the settings their backend was made for (build makes
    it from them again); a vendor without settings records none."""
    tags: dict[str, dict[str, str]] = {b.name: {} for b in backends}
    for b in backends:
        if b.settings.declared():
            try:
                tags[b.name][SETTINGS_ATTR] = b.settings.to_json(b.name)
            except TypeError as error:
                raise PartitionError(f"backend {b.name!r}: its settings are recorded on its regions as JSON, and "
                                     f"{b.settings!r} is not JSON ({error})") from error
    if not any(tags.values()):
        return mod
    tagged = mod.clone()
    for gvar, func in mod.functions.items():
        backend = func.attrs.get(CODEGEN_ATTR) if isinstance(func, relax.Function) and func.attrs is not None else None
        for name, value in tags.get(str(backend), {}).items() if backend is not None else ():
            func = func.with_attr(name, value)
        tagged[gvar] = func
    return tagged


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


def _warn_of_unmatched(host_ops: frozenset[str], graphs) -> None:
    """Warn of `host_ops` names that are no op and no node of the model (a misspelt name keeps
    nothing on the host). A warning, not an error: one list of ops may serve several models."""
    known = {name for graph in graphs for node in graph.nodes for name in (node.name, *node.op_names)}
    unmatched = sorted(host_ops - known)
    if unmatched:
        warnings.warn(f"host_ops {unmatched} match no op or node of the model{did_you_mean(unmatched[0], known)}: ops are "
                      "named as Relax names them (relax.nn.conv2d), nodes as the model names them (see the partition report)",
                      UserWarning, stacklevel=6)  # the caller of partition_for


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
