"""Turning regions into functions (paper section 3.1.3, last step).

Each region becomes a global function with the `Codegen` and `global_symbol` attributes, in the
form TVM's MergeCompositeFunctions produces: composite calls bind their composite function
locally. The host function calls the regions in a topological order of the contracted graph,
and composites that stayed on the host are inlined back into plain op calls.
"""

from __future__ import annotations

import contextlib
import heapq
from dataclasses import dataclass

import tvm
from tvm import relax

from byoc.errors import PartitionError
from byoc.ir.dims import defined_dimensions, symbolic_vars
from byoc.ir.rewrite import VarSubstitution
from byoc.partition.dataflow import COMPOSITE, BlockGraph
from byoc.partition.group import COMPOSITE_ATTR
from byoc.partition.merge import Region
from byoc.partition.regions import RegionBoundary

CODEGEN_ATTR = "Codegen"
SYMBOL_ATTR = "global_symbol"
# The hardware configuration a region is compiled for (a DPU size, an Ethos-U variant), read by
# custom formats at code generation.


@dataclass
class RegionPlan:
    region: Region
    boundary: RegionBoundary
    backend: str
    symbol: str


@dataclass
class BlockPlan:
    graph: BlockGraph
    regions: list[RegionPlan]


def outline_regions(mod: tvm.IRModule, plans: dict[int, BlockPlan]) -> tvm.IRModule:
    """A module whose `main` calls one function per planned region."""
    main = mod["main"]
    composites = {gv.name_hint: f for gv, f in mod.functions.items() if _is_composite(f)}
    kept = {gv: f for gv, f in mod.functions.items() if gv.name_hint != "main" and gv.name_hint not in composites}
    builder = relax.BlockBuilder(tvm.IRModule(kept, attrs=mod.attrs))
    emitter = _HostEmitter(builder, composites)
    attrs = dict(main.attrs) if main.attrs else None
    with builder.function("main", params=list(main.params), attrs=attrs, pure=main.is_pure):
        for index, block in enumerate(main.body.blocks):
            dataflow = isinstance(block, relax.DataflowBlock)
            with builder.dataflow() if dataflow else contextlib.nullcontext():
                plan = plans.get(index)
                if plan is None:
                    for binding in block.bindings:
                        emitter.emit_binding(binding)
                else:
                    emitter.emit_block(plan)
        builder.emit_func_output(emitter.substitution.substitute(main.body.body))
    return builder.get()


def _is_composite(func: tvm.ir.BaseFunc) -> bool:
    return isinstance(func, relax.Function) and func.attrs is not None and COMPOSITE_ATTR in func.attrs


def _schedule(plan: BlockPlan) -> list[tuple[str, int]]:
    """Host nodes and regions in a topological order of the contracted graph, staying close to
    the original binding order (ties go to the item whose first node came first)."""
    nodes = plan.graph.nodes
    item_of: list[tuple[str, int]] = [("node", i) for i in range(len(nodes))]
    for position, region_plan in enumerate(plan.regions):
        for member in region_plan.region.members:
            item_of[member] = ("region", position)
    first_index: dict[tuple[str, int], int] = {}
    for index, item in enumerate(item_of):
        first_index.setdefault(item, index)
    successors: dict[tuple[str, int], set[tuple[str, int]]] = {item: set() for item in first_index}
    pending = dict.fromkeys(first_index, 0)
    for node in nodes:
        consumer = item_of[node.index]
        for producer in node.inputs:
            source = item_of[producer]
            if source != consumer and consumer not in successors[source]:
                successors[source].add(consumer)
                pending[consumer] += 1
    ready = [(first_index[item], item) for item, count in pending.items() if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, item = heapq.heappop(ready)
        order.append(item)
        for successor in successors[item]:
            pending[successor] -= 1
            if pending[successor] == 0:
                heapq.heappush(ready, (first_index[successor], successor))
    if len(order) != len(pending):
        raise AssertionError("the region graph has a cycle; merging should have prevented it")
    return order


class _HostEmitter:
    def __init__(self, builder: relax.BlockBuilder, composites: dict[str, relax.Function]) -> None:
        self.builder = builder
        self.composites = composites
        self.substitution = VarSubstitution()

    def _bind(self, old: relax.Var, value: relax.Expr, name: str) -> None:
        """Emit `value` under a variable typed (dataflow or not) like `old` and called `name`."""
        value = self.builder.normalize(value)
        new = type(old)(name, value.ty)
        self.builder.emit_normalized(relax.VarBinding(new, value))
        self.substitution.bind(old, new)

    def emit_binding(self, binding: relax.Binding, name: str | None = None) -> None:
        name = name or binding.var.name
        value = self.substitution.substitute(binding.value)
        if isinstance(binding, relax.MatchCast):
            new = type(binding.var)(name, binding.ty)
            self.builder.emit_normalized(relax.MatchCast(new, self.builder.normalize(value), binding.ty))
            self.substitution.bind(binding.var, new)
        elif isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar) and value.op.name_hint in self.composites:
            self._bind(binding.var, self._inline(self.composites[value.op.name_hint], list(value.args), name), name)
        else:
            self._bind(binding.var, value, name)

    def _inline(self, func: relax.Function, args: list[relax.Expr], name: str) -> relax.Expr:
        """Emit a composite's body with its parameters replaced by `args`; return its result.
        The ops get the composite's node name: the function may be shared by several matches."""
        inner = VarSubstitution()
        for param, arg in zip(func.params, args):
            inner.bind_argument(param, arg, self.builder)
        for block in func.body.blocks:
            for binding in block.bindings:
                value = self.builder.normalize(inner.substitute(binding.value))
                var = type(binding.var)(name, value.ty)
                self.builder.emit_normalized(relax.VarBinding(var, value))
                inner.bind(binding.var, var)
        return inner.substitute(func.body.body)

    def emit_block(self, plan: BlockPlan) -> None:
        nodes = plan.graph.nodes
        for kind, index in _schedule(plan):
            if kind == "node":
                self.emit_binding(nodes[index].binding, nodes[index].name)
            else:
                self._emit_region(plan.regions[index], plan.graph)

    def _emit_region(self, plan: RegionPlan, graph: BlockGraph) -> None:
        func = _region_function(plan, graph, self.composites)
        gvar = self.builder.add_func(func, plan.symbol)
        if gvar.name_hint != plan.symbol:
            raise PartitionError(f"region {plan.symbol}: the module already names a function so (it became {gvar.name_hint})")
        extra = [relax.ShapeExpr(list(func.params[-1].ty.values))] if _takes_dimensions(func) else []
        call = relax.Call(gvar, [*(self.substitution.substitute(v) for v in plan.boundary.inputs), *extra])
        outputs = [graph.nodes[i] for i in plan.boundary.outputs]
        if len(outputs) == 1:
            self._bind(outputs[0].binding.var, call, outputs[0].name)
            return
        # Not under the symbol itself: variables and functions share one name supply, which would
        # take `<symbol>1` for this variable, the very symbol of region 11 when this is region 1.
        result = self.builder.emit(call, f"{plan.symbol}_outputs")
        for position, node in enumerate(outputs):
            self._bind(node.binding.var, relax.TupleGetItem(result, position), node.name)


# A region whose tensors' shapes use dimensions that no input gives plainly (inputs of
# `batch * sequence` rows, outputs of `batch` x `sequence`) takes them as a last parameter of
# shape type, as TVM's own fused functions do: without it, its outputs' shapes are unknown.
DIMENSIONS_PARAM = "tir_vars"


def _takes_dimensions(func: relax.Function) -> bool:
    return bool(func.params) and func.params[-1].name == DIMENSIONS_PARAM and isinstance(func.params[-1].ty, relax.ShapeType)


def _undefined_dimensions(params: list[relax.Var], outputs: list[relax.Var]) -> list:
    """The symbolic variables the region's shapes use that no parameter's shape defines."""
    defined = defined_dimensions(tensor.ty for tensor in params)
    used: dict[str, object] = {}
    for var in [*params, *outputs]:
        for name, symbol in symbolic_vars(var.ty).items():
            used.setdefault(name, symbol)
    return [symbol for name, symbol in sorted(used.items()) if name not in defined]


def _region_function(plan: RegionPlan, graph: BlockGraph, composites: dict[str, relax.Function]) -> relax.Function:
    builder = relax.BlockBuilder()
    substitution = VarSubstitution()
    params = []
    for var in plan.boundary.inputs:
        param = relax.Var(var.name, var.ty)
        substitution.bind(var, param)
        params.append(param)
    dimensions = _undefined_dimensions(params, [graph.nodes[i].binding.var for i in plan.boundary.outputs])
    if dimensions:
        params.append(relax.Var(DIMENSIONS_PARAM, relax.ShapeType(dimensions)))
    attrs = {CODEGEN_ATTR: plan.backend, SYMBOL_ATTR: plan.symbol}
    with builder.function(plan.symbol, params=params, attrs=attrs):
        for index in plan.region.members:
            node = graph.nodes[index]
            value = substitution.substitute(node.binding.value)
            if node.kind == COMPOSITE:
                local = relax.utils.copy_with_new_vars(composites[value.op.name_hint]).without_attr("Primitive")
                callee = builder.emit(local, value.op.name_hint)
                value = relax.Call(callee, list(value.args))
            value = builder.normalize(value)
            var = relax.Var(node.name, value.ty)
            builder.emit_normalized(relax.VarBinding(var, value))
            substitution.bind(node.binding.var, var)
        results = [substitution.substitute(graph.nodes[i].binding.var) for i in plan.boundary.outputs]
        builder.emit_func_output(results[0] if len(results) == 1 else relax.Tuple(results))
    return builder.get()[plan.symbol]
