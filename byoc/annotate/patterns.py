"""Pattern builders for the shapes vendors declare again and again."""

from __future__ import annotations

from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard

# Operands after the first of ops that patterns use as activations (clip's bounds).
_EXTRA_OPERANDS = {"relax.clip": 2, "relax.nn.leakyrelu": 0}


def unary(op: str, operand: DFPattern) -> DFPattern:
    """`op` applied to `operand`, with wildcards for its other operands (clip's bounds)."""
    return is_op(op)(operand, *(wildcard() for _ in range(_EXTRA_OPERANDS.get(op, 0))))


def fused_pattern(
    op: str,
    bias: bool = False,
    activation: str | tuple[str, ...] | None = None,
    num_inputs: int = 2,
    constant_weight: bool = False,
) -> tuple[DFPattern, dict[str, DFPattern]]:
    """`op`, then `add` of a bias when `bias`, then one of `activation` when given.

    Returns the pattern and its named parts ("root", "bias", "activation") for predicates.
    """
    inputs = [wildcard() for _ in range(num_inputs)]
    if constant_weight and num_inputs > 1:
        inputs[1] = is_const()
    root = is_op(op)(*inputs)
    annotations: dict[str, DFPattern] = {"root": root}
    out = root
    if bias:
        bias_value = wildcard()
        out = is_op("relax.add")(root, bias_value)
        annotations["bias"] = bias_value
    if activation is not None:
        names = (activation,) if isinstance(activation, str) else activation
        act = unary(names[0], out)
        for name in names[1:]:
            act = act | unary(name, out)
        out = act
        annotations["activation"] = act
    return out, annotations


def elementwise_chain(*ops: str) -> DFPattern:
    """A chain of single-input ops applied one after another."""
    out = wildcard()
    for op in ops:
        out = unary(op, out)
    return out
