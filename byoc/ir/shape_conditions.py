"""Conditions on a model's named dimensions that its ops need to hold, checked on every new
input shape before anything runs.

An op whose validity depends on run-time sizes (an Expand from `a` to `b`, a MatMul of `k`
columns by `j` rows, a Reshape of `a` elements to `b`) is compiled on the assumption that they
fit: TVM's kernels, and a vendor's, read as far as the shapes they were given say. A call where
they do not fit read past its input (an Expand of 2x3 to 2x5 returned 2x5 without a word). The
compile writes each such condition down (`byoc.ir.shape_checks`) in the small form below,
stored in the artifact, and the runtime evaluates it with the call's dimension values: a shape
that breaks one is an InputError naming the node, as onnxruntime names it, on every vendor.

An expression is an int, a dimension's name, or `[operator, operand, ...]`. This module is plain
Python: loading an artifact needs no compiler for it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Union

from byoc.errors import ShapeConstraintError

Expression = Union[int, str, list]


def _floordiv(a: int, b: int) -> int:
    return a // b if b else 0


def _truncdiv(a: int, b: int) -> int:
    return int(a / b) if b else 0


def _floormod(a: int, b: int) -> int:
    return a % b if b else 0


OPERATORS: dict[str, Callable[..., int]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "//": _floordiv, "/": _truncdiv, "%": _floormod,
    "min": min, "max": max, "==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
    ">": operator.gt, ">=": operator.ge, "and": lambda a, b: bool(a and b), "or": lambda a, b: bool(a or b),
    "not": operator.not_, "select": lambda c, a, b: a if c else b,
}


def evaluate(expression: Expression, values: Mapping[str, int]) -> int:
    """The value of `expression` with each dimension at its value in `values`."""
    if isinstance(expression, bool):
        return int(expression)
    if isinstance(expression, int):
        return expression
    if isinstance(expression, str):
        return values[expression]
    op, *operands = expression
    return int(OPERATORS[op](*(evaluate(o, values) for o in operands)))


def names_in(expression: Expression) -> set[str]:
    """The dimensions `expression` reads."""
    if isinstance(expression, str):
        return {expression}
    if isinstance(expression, list):
        return set().union(*(names_in(o) for o in expression[1:]))
    return set()


def check_expression(expression: object) -> Expression:
    """`expression` as an artifact gives it, checked to be of the form above."""
    if isinstance(expression, (int, str)) and not isinstance(expression, bool):
        return expression
    if isinstance(expression, list) and expression and expression[0] in OPERATORS:
        return [expression[0], *(check_expression(o) for o in expression[1:])]
    raise ValueError(f"not a shape expression: {expression!r}")


@dataclass(frozen=True)
class ShapeCheck:
    """One op's condition: the node (the binding's name, after the model's node), the op as
    the model names it, what it requires in words, the condition, and the sizes an error shows
    (a label and an expression each)."""

    node: str
    op: str
    requires: str
    condition: Expression
    shown: tuple[tuple[str, Expression], ...]

    def holds(self, values: Mapping[str, int]) -> bool:
        return bool(evaluate(self.condition, values))

    def error(self, values: Mapping[str, int]) -> ShapeConstraintError:
        sizes = ", ".join(f"{label} is {evaluate(expression, values)}" for label, expression in self.shown)
        return ShapeConstraintError(f"node {self.node!r} ({self.op}): {self.requires}; here {sizes} "
                                    f"(dimensions: {', '.join(f'{k}={v}' for k, v in sorted(values.items()))})")

    def to_dict(self) -> dict:
        return {"node": self.node, "op": self.op, "requires": self.requires, "condition": self.condition,
                "shown": [[label, expression] for label, expression in self.shown]}

    @classmethod
    def from_dict(cls, entry: Mapping) -> ShapeCheck:
        return cls(str(entry["node"]), str(entry["op"]), str(entry["requires"]), check_expression(entry["condition"]),
                   tuple((str(label), check_expression(expression)) for label, expression in entry["shown"]))


def check_all(checks: Sequence[ShapeCheck], values: Mapping[str, int]) -> None:
    """Raise the error of the first check these dimension values break."""
    for check in checks:
        if not check.holds(values):
            raise check.error(values)
