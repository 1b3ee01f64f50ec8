"""Einsum as the ops every backend knows: transposes, sums and one batched matrix product.

TVM's converter writes an Einsum as a kernel of its own (`call_tir`), which no backend can take
and whose multiply-adds no report counts: MaxViT's 44 Einsums stayed on the host between 23
regions, and the report still said every MAC was offloaded. Here an Einsum of one or two operands
without repeated letters in an operand (no diagonals) and without `...` becomes:

- the sum of each operand over the letters only it has and the result lacks;
- each operand transposed to (batch letters, its own letters, the contracted letters) and the
  last two groups each made one axis;
- one `matmul` of the two, its result's axes split back and transposed to the result's order.

Every other Einsum is left to TVM's converter.
"""

from __future__ import annotations

import math

import tvm
from tvm import relax

from byoc.ir.types import shape_dims


def _parse(equation: str, operands: int) -> tuple[list[str], str] | None:
    """The letters of each operand and of the result, or None for a form left to TVM."""
    equation = equation.replace(" ", "")
    if "." in equation:
        return None
    inputs, arrow, result = equation.partition("->")
    terms = inputs.split(",")
    if len(terms) != operands or any(len(set(term)) != len(term) for term in terms):
        return None
    if not arrow:  # implicit: the letters met once, in alphabetical order
        letters = "".join(terms)
        result = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    if len(set(result)) != len(result) or not set(result) <= set("".join(terms)):
        return None
    return terms, result


def _summed(expr: relax.Expr, term: str, keep: set[str]) -> tuple[relax.Expr, str]:
    """`expr` summed over the letters of `term` not in `keep`."""
    axes = [i for i, letter in enumerate(term) if letter not in keep]
    if not axes:
        return expr, term
    return relax.op.sum(expr, axes), "".join(letter for letter in term if letter in keep)


def _arranged(expr: relax.Expr, term: str, order: str) -> relax.Expr:
    """`expr` (letters `term`) transposed to the letters' `order`."""
    permutation = [term.index(letter) for letter in order]
    return expr if permutation == sorted(permutation) else relax.op.permute_dims(expr, permutation)


def _product(sizes: list):
    return math.prod(sizes) if all(isinstance(s, int) for s in sizes) else _fold(sizes)


def _fold(sizes: list):
    total = tvm.tirx.const(1, "int64")
    for size in sizes:
        total = total * size
    return total


def einsum(bb, inputs, attrs, opset, tvm_converter) -> relax.Expr | None:
    equation = attrs.get("equation", b"")
    parsed = _parse(equation.decode() if isinstance(equation, bytes) else str(equation), len(inputs))
    shapes = [shape_dims(x.ty) for x in inputs]
    if parsed is None or len(inputs) not in (1, 2) or any(s is None for s in shapes):
        return None
    terms, result = parsed
    if len(inputs) == 1:
        summed, term = _summed(inputs[0], terms[0], set(result))
        return _arranged(summed, term, result)
    (a, term_a), (b, term_b) = (_summed(x, t, set(result) | set(terms[1 - i])) for i, (x, t) in enumerate(zip(inputs, terms)))
    size = {}
    for term, shape in zip(terms, shapes):
        size.update({letter: dim for letter, dim in zip(term, shape)})
    size = {letter: int(dim) if isinstance(dim, tvm.ir.prim.expr.IntImm) else dim for letter, dim in size.items()}
    batch = "".join(c for c in result if c in term_a and c in term_b)
    left = "".join(c for c in term_a if c in result and c not in term_b)
    right = "".join(c for c in term_b if c in result and c not in term_a)
    contracted = "".join(c for c in term_a if c in term_b and c not in result)
    batch_sizes = [size[c] for c in batch]

    def grouped(expr: relax.Expr, term: str, first: str, second: str) -> relax.Expr:
        arranged = _arranged(expr, term, batch + first + second)
        if len(first) == 1 and len(second) == 1:
            return arranged
        return bb.normalize(relax.op.reshape(arranged, [*batch_sizes, _product([size[c] for c in first]),
                                                        _product([size[c] for c in second])]))

    product = relax.op.matmul(bb.normalize(grouped(a, term_a, left, contracted)), bb.normalize(grouped(b, term_b, contracted, right)))
    if len(left) != 1 or len(right) != 1:
        product = relax.op.reshape(bb.normalize(product), [*batch_sizes, *(size[c] for c in left + right)])
    return _arranged(product, batch + left + right, result)
