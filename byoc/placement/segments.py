"""Cutting a model into segments that each backend can be timed on, and extracting each as a
model of its own.

A segment is an interval of `main`'s bindings in their (topological) order. Intervals of a
topological order are convex, so any choice of one backend per segment outlines into regions
without cycles: this is Collage's shortest path over covered nodes, restricted to the prefixes of
one order, which makes the search a dynamic programme over segments.

A cut may fall only where every value crossing it is a tensor of static shape (a candidate is
fed real tensors), where it splits no backend's composite (one instruction) and no model node
(placement is by node name). Segments end
where the set of backends that take the ops changes, and long stretches are split further by
MACs and op count so that, say, attention and feed-forward blocks are timed apart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import tvm
from tvm import relax

from byoc.errors import PlacementError
from byoc.ir.macs import op_macs
from byoc.ir.rewrite import VarSubstitution
from byoc.ir.types import has_static_shape
from byoc.partition.coverage import Coverage
from byoc.partition.dataflow import used_vars
from byoc.partition.group import HOST


@dataclass
class Segment:
    index: int
    start: int  # first binding position
    end: int  # one past the last
    nodes: list[str]  # names of the op bindings, in order
    macs: int
    takers: list[str]  # backends that take every op of it, "host" last
    reasons: dict[str, str]  # backend -> why it cannot take the whole segment

    @property
    def label(self) -> str:
        if not self.nodes:
            return f"bindings {self.start}-{self.end - 1}"
        return self.nodes[0] if len(self.nodes) == 1 else f"{self.nodes[0]} .. {self.nodes[-1]}"


def main_block(mod: tvm.IRModule) -> relax.DataflowBlock:
    main = mod["main"]
    blocks = main.body.blocks
    if len(blocks) != 1 or not isinstance(blocks[0], relax.DataflowBlock):
        raise PlacementError("measured placement needs `main` to be one dataflow block (as byoc.from_onnx makes it); "
                             f"this one has {len(blocks)} block(s)")
    return blocks[0]


def cut_segments(mod: tvm.IRModule, coverages: Sequence[Coverage], pieces: int) -> list[Segment]:
    """Segments of `main` (see the module doc); long stretches split into about `pieces`."""
    block = main_block(mod)
    bindings = list(block.bindings)
    count = len(bindings)
    legal = _legal_cuts(mod, bindings, coverages)
    is_op = [_is_op(b.value) for b in bindings]
    macs = [op_macs(b.value) if is_op[p] else 0 for p, b in enumerate(bindings)]
    takers = [frozenset(c.backend for c in coverages if p in c.taken) for p in range(count)]
    mac_step = max(1, sum(macs) // max(1, pieces))
    op_step = max(4, sum(is_op) // max(1, pieces))
    bounds = [0]
    current: frozenset[str] | None = None
    seg_macs = seg_ops = 0
    for p in range(count):
        if is_op[p]:
            if current is not None and takers[p] != current and legal[p]:
                bounds.append(p)
                seg_macs = seg_ops = 0
            elif (seg_macs >= mac_step or seg_ops >= op_step) and legal[p] and seg_ops > 0:
                bounds.append(p)
                seg_macs = seg_ops = 0
            current = takers[p]
            seg_macs += macs[p]
            seg_ops += 1
    bounds.append(count)
    bounds = sorted(set(bounds))
    segments = []
    for start, end in zip(bounds, bounds[1:]):
        ops = [p for p in range(start, end) if is_op[p]]
        common = [c for c in coverages if all(p in c.taken for p in ops)]
        reasons = {}
        for c in coverages:
            if c not in common:
                missing = next(p for p in ops if p not in c.taken)
                reasons[c.backend] = f"{bindings[missing].var.name}: {c.reasons.get(missing, 'not taken')}"
        segments.append(Segment(len(segments), start, end, [bindings[p].var.name for p in ops],
                                sum(macs[p] for p in ops), [c.backend for c in common] + [HOST], reasons))
    return segments


def _is_op(value: relax.Expr) -> bool:
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)


def _legal_cuts(mod: tvm.IRModule, bindings: list[relax.Binding], coverages: Sequence[Coverage]) -> list[bool]:
    """legal[k]: a cut just before binding k is allowed (legal[0] is the model's start)."""
    count = len(bindings)
    position = {b.var.id_: p for p, b in enumerate(bindings)}
    last_use = [-1] * count
    for p, binding in enumerate(bindings):
        for var in used_vars(binding.value):
            if var.id_ in position:
                last_use[position[var.id_]] = p
    for var in relax.analysis.free_vars(mod["main"].body.body):
        if var.id_ in position:
            last_use[position[var.id_]] = count
    blocked = [0] * (count + 1)  # cuts a value that cannot cross, or a composite, spans
    for p, binding in enumerate(bindings):
        if last_use[p] > p and not _static_tensor(binding.var.ty):
            blocked[p + 1] += 1
            blocked[min(last_use[p], count - 1) + 1] -= 1
    for coverage in coverages:
        for members in coverage.composites:
            blocked[min(members) + 1] += 1
            blocked[max(members) + 1] -= 1
    legal, open_spans = [], 0
    for k in range(count):
        open_spans += blocked[k]
        # Placement is by node name, and one model node may lower to several bindings.
        same_node = k > 0 and bindings[k - 1].var.name == bindings[k].var.name
        legal.append(open_spans == 0 and not same_node)
    return legal


def _static_tensor(ty: relax.Type) -> bool:
    return isinstance(ty, relax.TensorType) and ty.dtype != "void" and has_static_shape(ty)


@dataclass
class Extracted:
    mod: tvm.IRModule
    inputs: list[str]  # keys of the values it reads (model inputs or earlier bindings; `value_keys`)
    outputs: list[str]  # keys of the values it makes for later segments or the model's output
    origin: dict[int, int]  # its parameters' and bindings' variable ids -> those of the model's values they stand for


def value_keys(main: relax.Function) -> dict[int, str]:
    """A key per variable of `main` (by id) that names no other: its name, or where one model
    node lowered to several bindings of that name (a split's parts and the reshape reading
    them), the name and the binding's position, `name#12`. Values crossing a cut are fed and
    kept by these keys."""
    bindings = list(main.body.blocks[0].bindings)
    repeated = {name for name, count in Counter(b.var.name for b in bindings).items() if count > 1}
    keys = {p.id_: p.name for p in main.params}
    for position, binding in enumerate(bindings):
        name = binding.var.name
        keys[binding.var.id_] = f"{name}#{position}" if name in repeated else name
    return keys


def extract(mod: tvm.IRModule, segment: Segment) -> Extracted:
    """The segment as a model of its own: its inputs are parameters, its outputs the values
    that later bindings or the model's output read."""
    main = mod["main"]
    keys = value_keys(main)
    bindings = list(main.body.blocks[0].bindings)
    inside = bindings[segment.start:segment.end]
    bound = {b.var.id_ for b in inside}
    inputs: dict[int, relax.Var] = {}  # by variable id, in first-use order
    for binding in inside:
        for var in used_vars(binding.value):
            if var.id_ not in bound and isinstance(var.ty, relax.TensorType):
                inputs.setdefault(var.id_, var)
    later = {v.id_ for b in bindings[segment.end:] for v in used_vars(b.value)}
    later |= {v.id_ for v in relax.analysis.free_vars(main.body.body)}
    outputs = [b.var for b in inside if b.var.id_ in later]
    if not outputs:
        outputs = [inside[-1].var]
    substitution = VarSubstitution()
    params = []
    for var in inputs.values():
        param = relax.Var(keys[var.id_], var.ty)
        substitution.bind(var, param)
        params.append(param)
    builder = relax.BlockBuilder()
    with builder.function("main", params=params):
        with builder.dataflow():
            made = {}
            for binding in inside:
                value = builder.normalize(substitution.substitute(binding.value))
                new = builder.emit(value, binding.var.name)
                substitution.bind(binding.var, new)
                made[binding.var.id_] = new
            results = [builder.emit_output(made[v.id_], f"{v.name}_out") for v in outputs]
        builder.emit_func_output(results[0] if len(results) == 1 else relax.Tuple(results))
    piece = builder.get()
    # By position: the function keeps its parameters, then one binding per binding inside, in order.
    origin = {param.id_: var.id_ for param, var in zip(piece["main"].params, inputs.values())}
    origin.update({new.var.id_: old.var.id_ for new, old in zip(piece["main"].body.blocks[0].bindings, inside)})
    return Extracted(piece, [keys[v.id_] for v in inputs.values()], [keys[v.id_] for v in outputs], origin)
