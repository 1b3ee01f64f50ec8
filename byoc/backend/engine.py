"""The engine interface: what a vendor runtime gives byoc for one region, and what byoc tells
it about the model around the region while it is created."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Engine(Protocol):
    """Runs one region. `inputs` and `outputs` are numpy views of the host's buffers (no copy):
    the engine reads the inputs and writes every output in place. An engine that keeps
    per-call state must guard it: several threads may call `run` at once."""

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None: ...


# An engine may also offer `run_new(inputs) -> list[np.ndarray]`: the region run on `inputs`, its
# outputs new arrays the engine allocated (C-contiguous; 64-byte aligned where it can). byoc
# calls it for a model that is this region alone, at a shape met for the first time, where the
# outputs are handed to the caller anyway: onnxruntime's own `run` then costs less than binding
# buffers made for that one call (a decoding step's shape is new at every step).


@dataclass(frozen=True)
class EngineContext:
    """What the runtime knows about the model around a region while its engine is created
    (read with `engine_context()` inside `build_engine`, `load_engine` or `deserialize`).

    `sole_work`: the region is all the model computes; the host only hands it the inputs and
    returns its outputs. An engine whose threads would otherwise compete with the host's, or
    with other engines, between its runs may then keep them ready after each run (onnxruntime
    keeps its threads spinning).
    """

    symbol: str
    sole_work: bool


_CONTEXT: ContextVar[EngineContext | None] = ContextVar("byoc_engine_context", default=None)


def engine_context() -> EngineContext | None:
    """The context of the engine being created, or None outside engine creation (an engine
    built by hand, a calibration probe)."""
    return _CONTEXT.get()


@contextmanager
def creating_engine(context: EngineContext) -> Iterator[None]:
    token = _CONTEXT.set(context)
    try:
        yield
    finally:
        _CONTEXT.reset(token)
