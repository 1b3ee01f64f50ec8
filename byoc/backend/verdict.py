"""What a predicate answers: accept, or reject with a reason a user can read."""

from __future__ import annotations

from typing import Union

# None or True accepts; False rejects without saying why; a string rejects with that reason.
Verdict = Union[bool, str, None]


def rejection(verdict: Verdict, default_reason: str) -> str | None:
    """The reason a verdict rejects, or None when it accepts."""
    if verdict is None or verdict is True:
        return None
    if verdict is False:
        return default_reason
    if isinstance(verdict, str):
        return verdict or default_reason
    raise TypeError(f"a predicate must return None, a bool or a reason string, not {type(verdict).__name__}")
