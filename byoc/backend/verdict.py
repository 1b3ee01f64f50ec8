"""What a check answers: None to accept, or the reason a user reads for refusing."""

from __future__ import annotations

from typing import Union

from byoc.errors import PredicateError

# A vendor's op or pattern check: None accepts; a non-empty string refuses, with that reason.
Verdict = Union[str, None]
# A user's region filter (a cost rule) may also answer True to keep and False to refuse.
FilterVerdict = Union[bool, str, None]


def reason_of(answer: object, where: str) -> str | None:
    """The reason a check's `answer` refuses with, or None when it accepts; any other answer is
    a PredicateError naming the check (`where`), as the vendor's to fix."""
    if answer is None:
        return None
    if isinstance(answer, str) and answer:
        return answer
    raise PredicateError(f"{where} returned {answer!r}: a check returns None to accept, or the reason it refuses as a "
                         "non-empty string")


def rejection(verdict: FilterVerdict, default_reason: str) -> str | None:
    """The reason a region filter's verdict rejects, or None when it accepts."""
    if verdict is None or verdict is True:
        return None
    if verdict is False:
        return default_reason
    if isinstance(verdict, str):
        return verdict or default_reason
    raise TypeError(f"a region filter must return None, a bool or a reason string, not {type(verdict).__name__}")
