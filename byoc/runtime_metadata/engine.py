"""The engine interface: what a vendor runtime gives byoc for one region."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Engine(Protocol):
    """Runs one region. `inputs` and `outputs` are numpy views of the host's buffers (no copy):
    the engine reads the inputs and writes every output in place. An engine that keeps
    per-call state must guard it: several threads may call `run` at once."""

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None: ...
