"""Per-op annotation in the style of the paper (section 3.1.2):

    @register_op_attr("relax.nn.conv2d", "target.myaccel")
    def conv2d(call):
        return None if call.attrs.groups == 1 else "groups must be 1"

registers a predicate for one op and one backend, before or after the backend itself is
registered. The predicate returns None/True to accept, or False/a reason string to reject.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from byoc.backend.spec import OpCheck, OpRule

_TARGET_PREFIX = "target."
_rules: dict[str, dict[str, OpRule]] = {}
_lock = threading.Lock()


def register_op_attr(op_name: str, target: str) -> Callable[[OpCheck], OpCheck]:
    backend = target[len(_TARGET_PREFIX) :] if target.startswith(_TARGET_PREFIX) else target

    def register(check: OpCheck) -> OpCheck:
        with _lock:
            _rules.setdefault(backend, {})[op_name] = OpRule(op_name, check)
        return check

    return register


def registered_op_rules(backend: str) -> dict[str, OpRule]:
    with _lock:
        return dict(_rules.get(backend, {}))


def clear_op_attrs(backend: str) -> None:
    with _lock:
        _rules.pop(backend, None)
