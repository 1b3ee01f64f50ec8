"""Pattern-based grouping (paper section 3.1.1) with TVM's FuseOpsByPattern.

Every backend's patterns go into one FuseOpsByPattern run, ordered by backend priority and then
by declaration, so that where two patterns overlap the higher-priority one wins (FuseOpsByPattern
keeps the first match). Each match is checked against the backend's declared limits, against
ops forced to the host, against higher-priority backends that accept one of its ops on their
own, and finally against the pattern's own predicate, whose reason is recorded when it rejects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import tvm
from tvm import relax
from tvm.relax import dpl
from tvm.relax.transform import FuseOpsByPattern, FusionPattern, PatternCheckContext

from byoc.backend.spec import Backend, OpRule, Pattern
from byoc.backend.verdict import reason_of
from byoc.backend.views import PatternMatch
from byoc.errors import PredicateError
from byoc.ir.types import op_name
from byoc.partition.reasons import HostReasons

COMPOSITE_ATTR = "Composite"
_MOST_REQUIRED = 32  # sets `required_ops` keeps of an alternative: enough to tell the patterns apart
HOST = "host"  # the placement name of the host


@dataclass
class PlacementPolicy:
    """What every check consults: backends in priority order, their op rules, forced host ops,
    and a placement chosen by measured cost (node name -> backend name, or HOST), which
    overrides priority for the nodes it names."""

    backends: Sequence[Backend]
    rules: Sequence[dict[str, OpRule]]
    host_ops: frozenset[str]
    reasons: HostReasons
    placement: Mapping[str, str] = field(default_factory=dict)
    placement_why: Mapping[str, str] = field(default_factory=dict)  # node name -> the measurements behind it
    # (binding position of the root, node name, binding positions of every matched op)
    accepted_roots: list[tuple[int, str, tuple[int, ...]]] = field(default_factory=list)
    claimed: set[int] = field(default_factory=set)  # binding positions inside an accepted match
    positions: dict[int, int] = field(default_factory=dict)  # variable id -> binding position
    # The op calls (by variable id) of a model with dynamic dimensions that depend on its shape
    # alone: the host computes them once per shape (byoc.ir.shape_only), so no vendor takes them.
    shape_only: frozenset[int] = frozenset()

    def forced_to_host(self, node: str, op: str) -> bool:
        return op in self.host_ops or node in self.host_ops or self.placement.get(node) == HOST

    def placed_elsewhere(self, index: int, node: str) -> str | None:
        """Why backend `index` may not take `node` under the measured placement, or None."""
        chosen = self.placement.get(node)
        if chosen is None or chosen == self.backends[index].name:
            return None
        why = self.placement_why.get(node)
        return f"measured placement puts it on {chosen}" + (f" ({why})" if why else "")

    def op_rejection(self, index: int, call: relax.Call, node: str) -> str | None:
        """Why backend `index` does not take single op `call`, or None when it does."""
        backend = self.backends[index]
        elsewhere = self.placed_elsewhere(index, node)
        if elsewhere is not None:
            return elsewhere
        rule = self.rules[index].get(call.op.name)
        if rule is None:
            return f"no pattern or op rule for {call.op.name}"
        limit = backend.limits.violation(call)
        if limit is not None:
            return limit
        if rule.check is None:
            return None
        try:
            verdict = rule.check(call)
        except Exception as error:
            raise PredicateError(
                f"backend {backend.name!r}: the predicate for op {call.op.name} raised at node {node!r}: "
                f"{type(error).__name__}: {error}"
            ) from error
        return reason_of(verdict, f"backend {backend.name!r}: the check of op {call.op.name} at node {node!r}")


class _PatternChecker:
    """The check passed to FuseOpsByPattern for one pattern of one backend.

    An exception inside a check cannot cross FuseOpsByPattern cleanly, so it is stored and
    re-raised, naming backend and pattern, after the pass returns.
    """

    def __init__(self, policy: PlacementPolicy, index: int, pattern: Pattern, errors: list[BaseException]) -> None:
        self.policy = policy
        self.index = index
        self.backend = policy.backends[index]
        self.pattern = pattern
        self.errors = errors

    def __call__(self, ctx: PatternCheckContext) -> bool:
        if self.errors:
            return False
        positions = self.policy.positions
        ordered = sorted(ctx.matched_bindings.items(), key=lambda item: positions[item[0].id_])
        bindings = [(var.name, value) for var, value in ordered]
        names = [name for name, _ in bindings]
        calls = [(name, v) for name, v in bindings if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op)]
        try:
            reason = self._rejection(ctx, calls)
        except PredicateError as error:  # a check that answered neither None nor a reason
            self.errors.append(error)
            return False
        except Exception as error:
            node = names[-1] if names else "?"
            self.errors.append(
                PredicateError(
                    f"backend {self.backend.name!r}: the check of pattern {self.pattern.name!r} raised at node "
                    f"{node!r}: {type(error).__name__}: {error}"
                ).with_traceback(error.__traceback__)
            )
            self.errors[-1].__cause__ = error
            return False
        if reason is not None:
            for name in names:
                self.policy.reasons.add(name, f"{self.backend.name}: pattern {self.pattern.name}: {reason}")
            return False
        # The composite is named after its first op (the conv of conv+bias+relu, say), past the
        # dequantizes a quantized kernel starts with.
        positions = self.policy.positions
        root = ctx.value_to_bound_var[ctx.matched_expr]
        computing = [var for var, value in ctx.matched_bindings.items() if op_name(value) != "relax.dequantize"]
        first = min(computing or ctx.matched_bindings.keys(), key=lambda var: positions[var.id_])
        members = tuple(sorted(positions[var.id_] for var in ctx.matched_bindings.keys()))
        if self.policy.claimed.intersection(members):
            # A match of a later pattern over ops an accepted match holds: FuseOpsByPattern asks
            # the check, then drops the match (GPT-J's parallel attention and MLP: the
            # attention's output product is also the added operand of the MLP's last product).
            return False
        self.policy.claimed.update(members)
        self.policy.accepted_roots.append((positions[root.id_], first.name, members))
        return True

    def _rejection(self, ctx: PatternCheckContext, calls: list[tuple[str, relax.Call]]) -> str | None:
        # FuseOpsByPattern leaves this to the check: a composite returns its root alone, so a
        # value inside the match that something outside reads cannot be fused away.
        root = ctx.value_to_bound_var[ctx.matched_expr]
        inside = {var.id_ for var in ctx.matched_bindings.keys()}
        for var in ctx.matched_bindings.keys():
            if var.id_ != root.id_ and any(user.id_ not in inside for user in ctx.var_usages.get(var, [])):
                return f"{var.name} is also used outside the pattern"
            # A value the dataflow block hands out (a model output, say) has no user here to see.
            if var.id_ != root.id_ and not isinstance(var, relax.DataflowVar):
                return f"{var.name} is also an output of the model"
        for name, call in calls:
            if self.policy.forced_to_host(name, call.op.name):
                return f"{call.op.name} at {name} is forced to the host"
            elsewhere = self.policy.placed_elsewhere(self.index, name)
            if elsewhere is not None:
                return f"{call.op.name} at {name}: {elsewhere}"
            if name in self.policy.placement:
                continue  # placed here by measured cost: priority no longer decides
            limit = self.backend.limits.violation(call, inside=lambda arg: isinstance(arg, relax.Var) and arg.id_ in inside,
                                                  output=call.same_as(ctx.matched_expr))
            if limit is not None:
                return f"{call.op.name}: {limit}"
            for higher in range(self.index):
                if self.policy.op_rejection(higher, call, name) is None:
                    return f"{call.op.name} goes to higher-priority backend {self.policy.backends[higher].name}"
        if self.pattern.check is None:
            return None
        match = PatternMatch(
            self.backend.name,
            self.pattern.name,
            ctx.matched_expr,
            {k: v for k, v in ctx.annotated_expr.items()},
            [call for _, call in calls],
        )
        where = f"backend {self.backend.name!r}: the check of pattern {self.pattern.name!r} at node {calls[0][0]!r}"
        return reason_of(self.pattern.check(match), where)


def group_patterns(mod: tvm.IRModule, policy: PlacementPolicy) -> tuple[tvm.IRModule, dict[int, str]]:
    """Wrap every accepted pattern match in a private function with a `Composite` attribute
    named `<backend>.<pattern>`.

    Also returns the model node name of each composite call (by variable id): FuseOpsByPattern
    names the calls `lv`, and shares one function among identical matches, so the name is
    recovered from the accepted matches instead. FuseOpsByPattern emits each composite call where
    its root binding was, so composite calls and accepted roots come in the same order.
    """
    policy.positions = {
        binding.var.id_: position
        for position, binding in enumerate(b for block in mod["main"].body.blocks for b in block.bindings)
    }
    errors: list[BaseException] = []
    present = {op_name(b.value) for block in mod["main"].body.blocks for b in block.bindings}
    fusion_patterns = [
        FusionPattern(
            f"{backend.name}.{pattern.name}",
            pattern.pattern,
            dict(pattern.annotations),
            _PatternChecker(policy, index, pattern, errors),
        )
        for index, backend in enumerate(policy.backends)
        for pattern in backend.patterns
        if all(ops & present for ops in _required_ops_of(pattern.pattern))
    ]
    if not fusion_patterns:
        return mod, {}
    grouped = FuseOpsByPattern(fusion_patterns, bind_constants=False, annotate_codegen=False)(mod)
    if errors:
        raise errors[0]
    return grouped, _composite_names(grouped, policy.accepted_roots)


_REQUIRED: dict[int, tuple[dpl.DFPattern, list[frozenset[str]]]] = {}


def _required_ops_of(pattern: dpl.DFPattern) -> list[frozenset[str]]:
    """`required_ops`, once per pattern (a backend's patterns live as long as the process; the
    pattern is kept beside its answer so that its id is not reused)."""
    if id(pattern) not in _REQUIRED:
        if len(_REQUIRED) > 4096:  # patterns made per call (a plugin's `configure`) come and go
            _REQUIRED.clear()
        _REQUIRED[id(pattern)] = (pattern, required_ops(pattern))
    return _REQUIRED[id(pattern)][1]


def required_ops(pattern: dpl.DFPattern) -> list[frozenset[str]]:
    """Sets of op names of which a match of `pattern` calls at least one each: a pattern whose
    ops the model lacks is left out of matching, which costs time for every pattern and binding
    (dnnl's int8 convolution patterns on a transformer: half of its partitioning). Any subset of
    these sets would be as true, so the list may be cut short."""
    if isinstance(pattern, dpl.CallPattern):
        callee = required_ops(pattern.op)
        return list(dict.fromkeys(callee + [ops for arg in pattern.args or () for ops in required_ops(arg)]))
    if isinstance(pattern, dpl.ExprPattern) and isinstance(pattern.expr, tvm.ir.Op):  # a callee
        return [frozenset({pattern.expr.name})]
    if isinstance(pattern, dpl.OrPattern):  # a match of either side hits one op of S | T for any S, T
        left, right = required_ops(pattern.left), required_ops(pattern.right)
        return sorted({a | b for a in left for b in right}, key=len)[:_MOST_REQUIRED]
    if isinstance(pattern, dpl.AndPattern):
        return required_ops(pattern.left) + required_ops(pattern.right)
    if isinstance(pattern, dpl.TupleGetItemPattern):
        return required_ops(pattern.tuple)
    if isinstance(pattern, (dpl.AttrPattern, dpl.TypePattern, dpl.DataTypePattern, dpl.ShapePattern)):
        return required_ops(pattern.pattern)
    return []  # anything else may match without a call


def composite_members(mod: tvm.IRModule, policy: PlacementPolicy) -> dict[int, tuple[int, ...]]:
    """The binding positions (in the ungrouped module) of each composite call's ops, by the
    call's variable id, for a module `group_patterns` made with `policy`."""
    calls = _composite_calls(mod)
    return {var_id: members for var_id, (_, _, members) in zip(calls, sorted(policy.accepted_roots))}


def _composite_calls(mod: tvm.IRModule) -> list[int]:
    composite_gvars = {
        gv.name_hint
        for gv, func in mod.functions.items()
        if isinstance(func, relax.Function) and func.attrs is not None and COMPOSITE_ATTR in func.attrs
    }
    return [
        binding.var.id_
        for block in mod["main"].body.blocks
        for binding in block.bindings
        if isinstance(binding.value, relax.Call)
        and isinstance(binding.value.op, relax.GlobalVar)
        and binding.value.op.name_hint in composite_gvars
    ]


def _composite_names(mod: tvm.IRModule, accepted_roots: list[tuple[int, str, tuple[int, ...]]]) -> dict[int, str]:
    calls = _composite_calls(mod)
    if len(calls) != len(accepted_roots):
        raise AssertionError(f"{len(calls)} composite calls for {len(accepted_roots)} accepted pattern matches")
    return {var_id: name for var_id, (_, name, _) in zip(calls, sorted(accepted_roots))}
