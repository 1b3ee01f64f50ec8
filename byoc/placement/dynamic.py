"""Measured placement for a model with dynamic dimensions: timed at one shape, kept for all.

Candidates are built and timed at static shapes, so the search runs on the model with each
dimension at its representative value (the range's `opt`). Its choice, which vendor or the host
runs each node, then partitions the model itself, dimensions kept, as priority placement would
with those choices (`partition_graph(placement=...)`); the placement report says at which
shape it was timed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tvm
from tvm import relax

from byoc.backend.spec import Backend
from byoc.ir.dims import DIMS_ATTR, DIMS_ORIGIN_ATTR, dims_of
from byoc.partition.pipeline import partition_graph
from byoc.partition.record import PARTITION_ATTR, PartitionRecord
from byoc.placement.report import PLACEMENT_ATTR, PlacementReport


def representative_shapes(mod: tvm.IRModule) -> dict[str, int]:
    """The value each dimension is timed at: its range's `opt`."""
    return {name: r.opt for name, r in dims_of(mod).items()}


def at_shapes(mod: tvm.IRModule, values: Mapping[str, int]) -> tvm.IRModule:
    """`mod` with each named dimension at `values[name]`: a static model of the same nodes."""
    static = relax.transform.BindSymbolicVars(dict(values))(mod)
    for attr in (DIMS_ATTR, DIMS_ORIGIN_ATTR):
        if static.attrs is not None and attr in static.attrs:
            static = static.without_attr(attr)
    return static


def placed_at_shapes(mod: tvm.IRModule, backends: Sequence[Backend], place: Callable[[tvm.IRModule], tvm.IRModule],
                     cost_options: Mapping[str, Any]) -> tvm.IRModule:
    """`mod` (with dynamic dimensions) partitioned as `place` chose for it at its representative
    shapes."""
    values = representative_shapes(mod)
    placed = place(at_shapes(mod, values))
    record = PartitionRecord.from_dict(json.loads(str(placed.attrs[PARTITION_ATTR])))
    at = ", ".join(f"{name}={value}" for name, value in values.items())
    placement: dict[str, str] = {h.node: "host" for h in record.host_ops}
    why: dict[str, str] = {h.node: f"measured placement at {at} keeps it on the host" for h in record.host_ops}
    for region in record.regions:
        for node in region.nodes:
            placement[node], why[node] = region.backend, f"measured placement at {at} puts it on {region.backend}"
    partitioned = partition_graph(mod, list(backends), placement, why, **cost_options)
    report = PlacementReport.from_dict(json.loads(str(placed.attrs[PLACEMENT_ATTR])))
    report.timed_at = values
    return partitioned.with_attr(PLACEMENT_ATTR, report.to_json())
