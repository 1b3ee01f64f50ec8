"""A named dynamic dimension's range, as a module records it and an artifact carries it (the
reading and writing of modules is in `dims`, which needs the compiler; this needs nothing)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DIMS_ATTR = "byoc.dims"
# Where each dimension's range comes from, as the report says it ("given", "open", or the table
# that bounds it).
DIMS_ORIGIN_ATTR = "byoc.dims_origin"
# The high end of a range the model and the user leave open: a file's named dimension with no
# `dims=` entry and nothing in the model that bounds it. Any size a tensor can have is in range.
OPEN = 2**31 - 1
# The conditions the model's ops need of its dimensions (see byoc.ir.shape_checks).
SHAPE_CHECKS_ATTR = "byoc.shape_checks"


@dataclass(frozen=True)
class DimRange:
    """The values a named dimension may take, `low` to `high` inclusive, and the one that
    partitioning and cost decisions assume (`opt`)."""

    low: int
    high: int
    opt: int

    def __contains__(self, value: int) -> bool:
        return self.low <= value <= self.high

    @property
    def open(self) -> bool:
        """Whether nothing bounds it above (see OPEN)."""
        return self.high >= OPEN

    def __str__(self) -> str:
        return f"{self.low}.." if self.open else f"{self.low}..{self.high}"

    def to_list(self) -> list[int]:
        return [self.low, self.high, self.opt]


def dim_range(name: str, given: object) -> DimRange:
    """`dims[name]` as the user gives it: `(low, high)`, `(low, opt, high)` or one `high`
    (from 1), checked."""
    values = list(given) if isinstance(given, (list, tuple)) else [1, given]
    try:
        numbers = [int(v) for v in values]
    except (TypeError, ValueError):
        numbers = []
    if len(numbers) not in (2, 3) or any(isinstance(v, bool) or float(v) != n for v, n in zip(values, numbers)):
        raise ValueError(f"dims[{name!r}] = {given!r}: expected (low, high), (low, opt, high) or a maximum, as integers")
    low, high = numbers[0], numbers[-1]
    opt = numbers[1] if len(numbers) == 3 else high
    if low < 1 or not low <= opt <= high:
        raise ValueError(f"dims[{name!r}] = {given!r}: expected 1 <= low <= opt <= high")
    return DimRange(low, high, opt)


def at_opt(shape: Iterable[int | str], dims: Mapping[str, DimRange]) -> tuple[int, ...]:
    """An input's shape as recorded (a size, or a dimension's name) with each named dimension at
    its `opt`: the shape an example input takes."""
    return tuple(dims[d].opt if isinstance(d, str) else d for d in shape)
