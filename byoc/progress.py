"""Progress of long runs (the vendor matrix, conformance runs) on standard error: a bar that
redraws in place on a terminal, one line per step elsewhere (logs, CI)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, label: str, stream: TextIO | None = None, width: int = 24) -> None:
        self.total = max(total, 1)
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.done = 0
        self.start = time.perf_counter()
        self.interactive = bool(getattr(self.stream, "isatty", lambda: False)())

    def step(self, what: str) -> None:
        """Announce the step about to run."""
        self._draw(what)

    def advance(self, what: str = "") -> None:
        """One step finished."""
        self.done += 1
        self._draw(what)
        if self.done >= self.total and self.interactive:
            self.stream.write("\n")
            self.stream.flush()

    def _draw(self, what: str) -> None:
        filled = int(self.width * self.done / self.total)
        elapsed = time.perf_counter() - self.start
        line = f"{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {elapsed:6.0f} s  {what}"
        if self.interactive:
            self.stream.write("\r" + line[:160].ljust(160))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
