"""What a vendor's checks and cost rules are handed: a pattern match and a region summary.

These are the partitioner's results as a vendor sees them. They live beside the spec so that the
spec, and every vendor written against it, depends on nothing above it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # read in annotations only: a run needs no compiler (byoc.backend.runtime)
    from tvm import relax


@dataclass
class PatternMatch:
    """What a pattern predicate sees: the matched root call, the named sub-expressions
    (`match["bias"]`), and every op call of the match."""

    backend: str
    pattern: str
    root: relax.Expr
    annotated: dict[str, relax.Expr]
    calls: list[relax.Call] = field(default_factory=list)

    def __getitem__(self, name: str) -> relax.Expr:
        return self.annotated[name]

    def get(self, name: str, default: relax.Expr | None = None) -> relax.Expr | None:
        return self.annotated.get(name, default)

    def ops(self) -> list[str]:
        return [call.op.name for call in self.calls]


@dataclass(frozen=True)
class RegionSummary:
    """The view of a region that cost rules and user cost functions judge."""

    backend: str
    nodes: tuple[str, ...]
    ops: tuple[str, ...]
    macs: int
    constant_bytes: int
    working_bytes: int
    input_bytes: int
    output_bytes: int
    non_tensor_boundary: str = ""  # a value at the boundary that is not a tensor, by name

    @property
    def num_ops(self) -> int:
        return len(self.ops)
