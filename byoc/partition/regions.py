"""What is known about a region once merging is done: its boundary, ops and costs."""

from __future__ import annotations

from dataclasses import dataclass

from tvm import relax

from byoc.backend.views import RegionSummary
from byoc.ir.types import nbytes
from byoc.partition.dataflow import BlockGraph, used_vars
from byoc.partition.merge import Region


@dataclass(frozen=True)
class RegionBoundary:
    inputs: list[relax.Var]  # variables read from outside the region, in first-use order
    outputs: list[int]  # member nodes whose value is used outside the region


def region_boundary(region: Region, graph: BlockGraph) -> RegionBoundary:
    members = set(region.members)
    inputs: list[relax.Var] = []
    seen: set[int] = set()
    for index in region.members:
        for var in used_vars(graph.nodes[index].binding.value):
            if graph.producer(var) not in members and var.id_ not in seen:
                seen.add(var.id_)
                inputs.append(var)
    # A non-dataflow variable bound in a dataflow block is visible after the block.
    outputs = [
        index
        for index in region.members
        if any(user not in members for user in graph.users[index])
        or not isinstance(graph.nodes[index].binding.var, relax.DataflowVar)
    ]
    return RegionBoundary(inputs, outputs)


def summarize(region: Region, graph: BlockGraph, backend: str, boundary: RegionBoundary) -> RegionSummary:
    members = [graph.nodes[i] for i in region.members]
    boundary_vars = [*boundary.inputs, *(graph.nodes[i].binding.var for i in boundary.outputs)]
    return RegionSummary(
        backend=backend,
        nodes=tuple(dict.fromkeys(node.name for node in members if node.op_names)),
        ops=tuple(op for node in members for op in node.op_names),
        macs=region.macs,
        constant_bytes=sum(node.const_bytes for node in members),
        working_bytes=region.working_bytes,
        input_bytes=sum(nbytes(var.ty) for var in boundary.inputs),
        output_bytes=sum(nbytes(graph.nodes[i].binding.var.ty) for i in boundary.outputs),
        non_tensor_boundary=next((v.name for v in boundary_vars if not isinstance(v.ty, relax.TensorType)), ""),
    )
