"""Dimensions of a region written with symbolic shapes, as the C generator and its emitters
compute with them.

A region of a model with dynamic dimensions comes as a JSON graph whose dimensions are integers
or expression texts over the model's named dimensions (byoc.codegen_json.symbolic_dims). The generator
reads each text into a `SymbolicDim`: a polynomial over the names with integer coefficients,
in a canonical form, so that two dimensions that are the same expression compare equal however
they were written (TVM's expressions compare by identity: `n * 2 == n * 2` is false there).

Emitters compute shapes, sizes and offsets with these as with integers, and write them into C
with `str()`: each name is the C variable `byoc_dim_<name>`, which the generated code sets from
the region's inputs before it creates its primitives. What has no exact value without the
names (a comparison, a division that does not divide, an array size at file scope) raises
`SymbolicShapeError`, and the region is generated per shape instead.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping

from byoc.codegen_json.symbolic_dims import Dim, fold

Monomial = tuple[str, ...]  # sorted names, with repeats; () is the constant term


class SymbolicShapeError(ValueError):
    """A computation on symbolic dimensions that has no exact form without their values."""


def c_variable(name: str) -> str:
    return f"byoc_dim_{name}"


class SymbolicDim:
    """sum(coefficient * product of names): `batch * 12`, `past + sequence`."""

    __slots__ = ("terms",)

    def __init__(self, terms: Mapping[Monomial, int]) -> None:
        self.terms = {m: c for m, c in sorted(terms.items()) if c}

    @classmethod
    def name(cls, name: str) -> SymbolicDim:
        return cls({(name,): 1})

    @staticmethod
    def of(value: int | SymbolicDim) -> int | SymbolicDim:
        """`value` as an integer where it is constant."""
        if isinstance(value, SymbolicDim) and set(value.terms) <= {()}:
            return value.terms.get((), 0)
        return value

    @staticmethod
    def _terms(value: object) -> dict[Monomial, int]:
        if isinstance(value, SymbolicDim):
            return dict(value.terms)
        if isinstance(value, bool) or not isinstance(value, int) and not hasattr(value, "__index__"):
            raise SymbolicShapeError(f"{value!r} is no dimension")
        return {(): int(value)}

    @property
    def names(self) -> set[str]:
        return {name for monomial in self.terms for name in monomial}

    # --------------------------------------------------------------- arithmetic
    def __add__(self, other: object) -> int | SymbolicDim:
        terms = self._terms(self)
        for monomial, coefficient in self._terms(other).items():
            terms[monomial] = terms.get(monomial, 0) + coefficient
        return SymbolicDim.of(SymbolicDim(terms))

    __radd__ = __add__

    def __neg__(self) -> int | SymbolicDim:
        return SymbolicDim.of(SymbolicDim({m: -c for m, c in self.terms.items()}))

    def __sub__(self, other: object) -> int | SymbolicDim:
        return self + -SymbolicDim(self._terms(other))

    def __rsub__(self, other: object) -> int | SymbolicDim:
        return SymbolicDim(self._terms(other)) + -self

    def __mul__(self, other: object) -> int | SymbolicDim:
        terms: dict[Monomial, int] = {}
        for m1, c1 in self.terms.items():
            for m2, c2 in self._terms(other).items():
                monomial = tuple(sorted(m1 + m2))
                terms[monomial] = terms.get(monomial, 0) + c1 * c2
        return SymbolicDim.of(SymbolicDim(terms))

    __rmul__ = __mul__

    def __floordiv__(self, other: object) -> int | SymbolicDim:
        """Exact divisions only: by an integer dividing every coefficient, or by a dimension this
        one is a monomial multiple of (`batch * 12 // 12`, `batch * heads // heads`,
        `heads * (past + sequence) // (past + sequence)`)."""
        divisor = SymbolicDim.of(SymbolicDim(self._terms(other)))
        if isinstance(divisor, int):
            if divisor != 0 and all(c % divisor == 0 for c in self.terms.values()):
                return SymbolicDim.of(SymbolicDim({m: c // divisor for m, c in self.terms.items()}))
        else:
            (lead, lead_coefficient), *_ = divisor.terms.items()
            for monomial, coefficient in self.terms.items():  # the quotient is one of these over `lead`
                rest = list(monomial)
                if coefficient % lead_coefficient or any(rest.count(name) < lead.count(name) for name in set(lead)):
                    continue
                for name in lead:
                    rest.remove(name)
                quotient = SymbolicDim({tuple(rest): coefficient // lead_coefficient})
                if quotient * divisor == self:
                    return SymbolicDim.of(quotient)
        raise SymbolicShapeError(f"{self!r} // {other!r} is not exact without the dimensions' values")

    def __rfloordiv__(self, other: object) -> int | SymbolicDim:
        return SymbolicDim(self._terms(other)) // self

    def __rmod__(self, other: object) -> int:
        raise SymbolicShapeError(f"{other!r} % {self!r} has no value without the dimensions' values")

    def __mod__(self, other: object) -> int:
        quotient = self // other  # exact, or raises
        del quotient
        return 0

    # ------------------------------------------------------------- comparison
    def __eq__(self, other: object) -> bool:
        try:
            return self.terms == self._terms(other)
        except SymbolicShapeError:
            return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self.terms.items()))

    def _unordered(self, other: object) -> bool:
        raise SymbolicShapeError(f"{self!r} and {other!r} have no order without the dimensions' values")

    __lt__ = __le__ = __gt__ = __ge__ = _unordered

    def __bool__(self) -> bool:
        return True  # a dimension is at least 1

    def __index__(self) -> int:
        raise SymbolicShapeError(f"{self!r} has no value at code generation (a size fixed in the C source)")

    __int__ = __index__

    # ------------------------------------------------------------------- text
    def at(self, values: Mapping[str, int]) -> int:
        return sum(c * math.prod(values[name] for name in m) for m, c in self.terms.items())

    def __str__(self) -> str:
        """The C expression, in int64_t: `(3 * byoc_dim_n + 1)`."""
        parts = []
        for monomial, coefficient in self.terms.items():
            factors = [c_variable(name) for name in monomial]
            if coefficient != 1 or not factors:
                factors.insert(0, f"{coefficient}" if factors else f"(int64_t){coefficient}")
            parts.append(" * ".join(factors))
        return "(" + " + ".join(parts) + ")"

    def __repr__(self) -> str:
        """As a message writes it: `3*n + 1`."""
        return " + ".join("*".join([*([str(c)] if c != 1 or not m else []), *m]) for m, c in self.terms.items())


_OPERATIONS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
               ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b}


def read_dim(dim: Dim) -> int | SymbolicDim:
    """A JSON graph's dimension (an integer or an expression text) as the generator computes
    with it."""
    if isinstance(dim, int):
        return dim

    def binary(op: type, a, b):
        if isinstance(a, int) and isinstance(b, int) and op in (ast.FloorDiv, ast.Mod):
            return a // b if op is ast.FloorDiv else a % b
        return _OPERATIONS[op](a if isinstance(a, SymbolicDim) else SymbolicDim({(): a}), b)

    return SymbolicDim.of(fold(dim, SymbolicDim.name, int, binary))


def read_shape(shape) -> tuple:
    """A JSON graph's shape as the generator computes with it."""
    return tuple(read_dim(d) for d in shape)


def names_of(shape) -> set[str]:
    """The dimension names a shape's dimensions read."""
    return {name for d in shape if isinstance(d, SymbolicDim) for name in d.names}


def array_storage(shape) -> str:
    """The storage of a block-scope C array of `shape`'s dimensions: static where each is a
    number, else computed where it stands (the region is made again for each shape)."""
    return "const" if names_of(shape) else "static const"


def value_at(dim: int | SymbolicDim, values: Mapping[str, int]) -> int:
    return dim.at(values) if isinstance(dim, SymbolicDim) else int(dim)
