"""Single-op rules (paper section 3.1.2): an op a backend accepts, under an optional check.

Rules are declared on the backend, the one place a vendor's rules live:

    npu.supports("relax.nn.relu", "relax.add")

    @npu.op("relax.nn.conv2d")
    def conv2d(call):
        return None if call.attrs.groups == 1 else "groups must be 1"

A check returns None to accept, or the reason it refuses as a string.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tvm import relax

from byoc.backend.verdict import Verdict

OpCheck = Callable[[relax.Call], Verdict]


@dataclass(frozen=True)
class OpRule:
    """A single op the hardware accepts, when `check` (if any) does not refuse it."""

    op: str
    check: OpCheck | None = None
