"""Pattern builders for the shapes vendors declare again and again."""

from __future__ import annotations

from tvm.relax.dpl import DFPattern, is_const, is_op, wildcard


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
        act = is_op(names[0])(out)
        for name in names[1:]:
            act = act | is_op(name)(out)
        out = act
        annotations["activation"] = act
    return out, annotations


def elementwise_chain(*ops: str) -> DFPattern:
    """A chain of single-input ops applied one after another."""
    out = wildcard()
    for op in ops:
        out = is_op(op)(out)
    return out
