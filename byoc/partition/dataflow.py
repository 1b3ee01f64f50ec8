"""The dataflow graph of one Relax binding block, as the partitioner sees it.

Each binding is a node: an op call, a composite call (a pattern match), glue (tuple
construction, tuple access, variable aliases) or something opaque that no backend may take
(packed calls, control flow, match-casts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax

from byoc.ir.dims import is_dimension
from byoc.ir.macs import op_macs
from byoc.ir.types import constant_array, is_tensor_constant, nbytes
from byoc.partition.group import COMPOSITE_ATTR

OP, COMPOSITE, GLUE, OPAQUE = "op", "composite", "glue", "opaque"
_OPAQUE_OPS = frozenset({"relax.call_tir", "relax.call_dps_packed", "relax.call_pure_packed", "relax.call_inplace_packed"})


@dataclass(slots=True, eq=False)
class Node:
    index: int
    name: str
    binding: relax.Binding
    kind: str
    op: str
    inputs: list[int]
    op_names: list[str]
    macs: int
    const_bytes: int
    out_bytes: int
    backend: int = -1
    reasons: list[str] = field(default_factory=list)

    @property
    def num_ops(self) -> int:
        return len(self.op_names)


@dataclass(frozen=True)
class CompositeInfo:
    name: str
    op_names: list[str]
    macs: int
    const_bytes: int


def composite_infos(mod: tvm.IRModule) -> dict[str, CompositeInfo]:
    """Per composite function (by global name): its pattern name, inner ops and costs."""
    infos = {}
    for gvar, func in mod.functions.items():
        if not isinstance(func, relax.Function) or func.attrs is None or COMPOSITE_ATTR not in func.attrs:
            continue
        calls = [b.value for block in func.body.blocks for b in block.bindings if _is_op_call(b.value)]
        infos[gvar.name_hint] = CompositeInfo(
            str(func.attrs[COMPOSITE_ATTR]),
            [call.op.name for call in calls],
            sum(op_macs(call) for call in calls),
            sum(_constant_bytes(call.args) for call in calls),
        )
    return infos


def _is_op_call(expr: relax.Expr) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)


def _constant_bytes(args) -> int:
    return sum(constant_array(a).nbytes for a in args if is_tensor_constant(a))


def used_vars(expr: relax.Expr) -> list[relax.Var]:
    """Variables an expression reads, for the expression forms bindings hold. A model's named
    dimension (`sequence` in a slice's end) is no value: TVM 0.27 gives it the Var type too."""
    if isinstance(expr, relax.Var):
        return [] if is_dimension(expr) else [expr]
    if isinstance(expr, relax.Call):
        found = [expr.op] if isinstance(expr.op, relax.Var) else []
        for arg in expr.args:
            if isinstance(arg, relax.Var) and not is_dimension(arg):
                found.append(arg)
            elif isinstance(arg, relax.Tuple):
                found.extend(used_vars(arg))
        return found
    if isinstance(expr, relax.Tuple):
        return [v for f in expr.fields for v in used_vars(f)]
    if isinstance(expr, relax.TupleGetItem):
        return used_vars(expr.tuple_value)
    if isinstance(expr, (relax.ShapeExpr, tvm.ir.Constant)):
        return []
    return list(relax.analysis.free_vars(expr))


@dataclass
class BlockGraph:
    nodes: list[Node]
    index_of: dict[int, int]  # variable id -> index of the node that binds it
    users: list[list[int]]  # node index -> indices of the nodes that read it

    def producer(self, var: relax.Var) -> int | None:
        return self.index_of.get(var.id_)


def build_block_graph(block: relax.BindingBlock, composites: dict[str, CompositeInfo], names: dict[int, str]) -> BlockGraph:
    """`names` overrides the node name of some variables (composite calls), by variable id."""
    nodes: list[Node] = []
    index_of: dict[int, int] = {}
    users: list[list[int]] = []
    for index, binding in enumerate(block.bindings):
        value = binding.value
        inputs = sorted({index_of[v.id_] for v in used_vars(value) if v.id_ in index_of})
        kind, op, op_names, macs, const_bytes = _classify(binding, composites)
        name = names.get(binding.var.id_, binding.var.name)
        # Glue (aliases, tuple access) makes no new tensor: it adds nothing to a working set.
        out_bytes = 0 if kind == GLUE else nbytes(binding.var.ty)
        nodes.append(Node(index, name, binding, kind, op, inputs, op_names, macs, const_bytes, out_bytes))
        users.append([])
        for producer in inputs:
            users[producer].append(index)
        index_of[binding.var.id_] = index
    return BlockGraph(nodes, index_of, users)


def _classify(binding: relax.Binding, composites: dict[str, CompositeInfo]):
    value = binding.value
    if isinstance(binding, relax.MatchCast):
        return OPAQUE, "match_cast", [], 0, 0
    if isinstance(value, relax.Call):
        if isinstance(value.op, tvm.ir.Op):
            name = value.op.name
            if name in _OPAQUE_OPS:
                return OPAQUE, name, [name], 0, 0
            return OP, name, [name], op_macs(value), _constant_bytes(value.args)
        if isinstance(value.op, relax.GlobalVar) and value.op.name_hint in composites:
            info = composites[value.op.name_hint]
            return COMPOSITE, info.name, list(info.op_names), info.macs, info.const_bytes + _constant_bytes(value.args)
        return OPAQUE, type(value.op).__name__, [], 0, 0
    if isinstance(value, (relax.Tuple, relax.TupleGetItem, relax.Var)):
        return GLUE, type(value).__name__, [], 0, 0
    return OPAQUE, type(value).__name__, [], 0, 0
