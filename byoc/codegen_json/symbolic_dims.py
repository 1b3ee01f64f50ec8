"""Symbolic dimensions in a JSON graph.

A region of a model with dynamic dimensions is written with symbolic shapes for a backend that
declares `symbolic_shapes` (see byoc.backend.spec): one graph, and one engine, for every shape in
range. A dimension is then an integer or the text of an expression over the model's named
dimensions: a name (`"batch"`), or names and integers joined by `+`, `-`, `*`, `//` and `%`,
with parentheses (`"batch * 12"`, `"(sequence - 1) // 2"`). The graph's `dims` gives each name's
range ({"low", "high", "opt"}), for engines that plan for them (TensorRT's optimization
profiles).

This module writes those texts from Relax's shape expressions and reads them back: as values
for given dimensions, and as TVM expressions.
"""

from __future__ import annotations

import ast
import functools
import operator
import re
from collections.abc import Callable, Mapping, Sequence

import tvm

Dim = int | str

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_BINARY: dict[type, str] = {tvm.tirx.Add: "+", tvm.tirx.Sub: "-", tvm.tirx.Mul: "*", tvm.tirx.FloorDiv: "//",
                            tvm.tirx.FloorMod: "%"}
_OPERATORS: dict[type, Callable[[int, int], int]] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                                                      ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}


class SymbolicDimError(ValueError):
    """A dimension that has no text form, or a text that is no dimension expression."""


def dim_text(dim) -> Dim:
    """A shape's dimension (a TVM PrimExpr) as a JSON graph writes it: its value where it is
    constant, else the text of its expression."""
    if isinstance(dim, int):
        return dim
    if isinstance(dim, tvm.ir.prim.expr.IntImm):
        return int(dim)
    return _text(dim)


def _text(expr) -> str:
    if isinstance(expr, tvm.ir.prim.expr.IntImm):
        return str(int(expr))
    if isinstance(expr, tvm.tirx.Var):
        return expr.name
    symbol = _BINARY.get(type(expr))
    if symbol is None:
        raise SymbolicDimError(f"dimension {expr} has no symbolic form in a JSON graph (names, integers, + - * // %)")
    return f"{_side(expr.a)} {symbol} {_side(expr.b)}"


def _side(expr) -> str:
    """An operand's text, in parentheses where it is an operation itself."""
    return f"({_text(expr)})" if type(expr) in _BINARY else _text(expr)


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> ast.expr:
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        raise SymbolicDimError(f"dimension {text!r} is no expression") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and type(node.op) not in _OPERATORS:
            raise SymbolicDimError(f"dimension {text!r}: only + - * // % join names and integers")
        if isinstance(node, ast.Constant) and (isinstance(node.value, bool) or not isinstance(node.value, int)):
            raise SymbolicDimError(f"dimension {text!r}: {node.value!r} is not an integer")
        if not isinstance(node, (ast.BinOp, ast.Name, ast.Constant, ast.Load, *_OPERATORS)):
            raise SymbolicDimError(f"dimension {text!r}: {type(node).__name__} is not allowed in a dimension")
    return tree


def names_in(dim: Dim) -> set[str]:
    """The dimension names a dimension's expression reads (none for an integer)."""
    if isinstance(dim, int):
        return set()
    return {node.id for node in ast.walk(_parsed(dim)) if isinstance(node, ast.Name)}


def fold(dim: Dim, name: Callable[[str], object], constant: Callable[[int], object],
         binary: Callable[[type, object, object], object]) -> object:
    """A dimension's expression evaluated bottom-up: `name` gives each name's value,
    `constant` each integer's, `binary(op, a, b)` each operation's (op: ast.Add, ast.Sub, ...)."""
    if isinstance(dim, int):
        return constant(dim)

    def walk(node: ast.expr) -> object:
        if isinstance(node, ast.Name):
            return name(node.id)
        if isinstance(node, ast.Constant):
            return constant(node.value)
        return binary(type(node.op), walk(node.left), walk(node.right))

    return walk(_parsed(dim))


@functools.lru_cache(maxsize=1024)
def _evaluator(text: str) -> Callable[[Mapping[str, int]], int]:
    """A dimension's text as a function of the named dimensions' values, made once per text: a
    decoding step computes its shapes at every new length (folding the parsed text each time
    took 10 us a shape)."""

    def name(key: str) -> Callable[[Mapping[str, int]], int]:
        return lambda values: int(values[key])

    def binary(op: type, a, b) -> Callable[[Mapping[str, int]], int]:
        apply = _OPERATORS[op]
        return lambda values: apply(a(values), b(values))

    return fold(text, name, lambda value: lambda values: value, binary)


def dim_value(dim: Dim, values: Mapping[str, int]) -> int:
    """A dimension at the named dimensions' `values`."""
    if isinstance(dim, int):
        return dim
    try:
        return _evaluator(dim)(values)
    except KeyError as missing:
        raise SymbolicDimError(f"dimension {dim!r} reads {missing.args[0]!r}, which has no value here ({sorted(values)})") from None


def shape_at(shape: Sequence[Dim], values: Mapping[str, int]) -> tuple[int, ...]:
    """A shape (ints and dimension texts) at the named dimensions' `values`."""
    return tuple(dim_value(d, values) for d in shape)


def is_symbolic(shape: Sequence[Dim]) -> bool:
    return any(isinstance(d, str) for d in shape)


_TVM_OPERATORS: dict[type, Callable] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                                        ast.FloorDiv: tvm.tirx.floordiv, ast.Mod: tvm.tirx.floormod}


def dim_expr(dim: Dim, variables: dict[str, tvm.tirx.Var]):
    """A dimension as a TVM expression; a name new to `variables` becomes an int64 variable
    there, so one graph's shapes share their variables."""

    def name(key: str):
        if key not in variables:
            if not _NAME.match(key):
                raise SymbolicDimError(f"{key!r} is not a dimension name")
            variables[key] = tvm.tirx.Var(key, "int64")
        return variables[key]

    return fold(dim, name, lambda value: tvm.tirx.IntImm("int64", value), lambda op, a, b: _TVM_OPERATORS[op](a, b))
