"""The named dimensions of the model's current run, for a region whose tensors do not give all
of its dimensions plainly (a region that only sees `batch * 4`): the runner sets them around each
call of the host (byoc.runtime_metadata.runners), a shape-specialised region reads them."""

from __future__ import annotations

import contextvars
from collections.abc import Mapping

_CURRENT: contextvars.ContextVar[Mapping[str, int] | None] = contextvars.ContextVar("byoc_current_dims", default=None)


def set_current_dims(values: Mapping[str, int]) -> contextvars.Token:
    return _CURRENT.set(dict(values))


def reset_current_dims(token: contextvars.Token) -> None:
    _CURRENT.reset(token)


def current_dims() -> Mapping[str, int] | None:
    return _CURRENT.get()
