"""Single-op rules (paper section 3.1.2): an op a backend accepts, under an optional predicate.

Rules are declared on the backend (`Backend.supports`, `Backend.op`) or in the paper's style,
before or after the backend itself is registered:

    @register_op_attr("relax.nn.conv2d", "target.myaccel")
    def conv2d(call):
        return None if call.attrs.groups == 1 else "groups must be 1"

A predicate returns None/True to accept, or False/a reason string to reject.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from tvm import relax

from byoc.backend.verdict import Verdict

OpCheck = Callable[[relax.Call], Verdict]

_TARGET_PREFIX = "target."
_registered: dict[str, dict[str, OpRule]] = {}
_lock = threading.Lock()


@dataclass(frozen=True)
class OpRule:
    """A single op the hardware accepts, when `check` (if any) does not reject it."""

    op: str
    check: OpCheck | None = None


def register_op_attr(op_name: str, target: str) -> Callable[[OpCheck], OpCheck]:
    backend = target.removeprefix(_TARGET_PREFIX)

    def register(check: OpCheck) -> OpCheck:
        with _lock:
            _registered.setdefault(backend, {})[op_name] = OpRule(op_name, check)
        return check

    return register


def registered_op_rules(backend: str) -> dict[str, OpRule]:
    with _lock:
        return dict(_registered.get(backend, {}))


def clear_op_attrs(backend: str) -> None:
    with _lock:
        _registered.pop(backend, None)
