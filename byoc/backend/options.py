"""How an option is shown and read from text: the command line (`--option`, `--backend-option`,
`--target`), `byoc vendors` and the data sheet. A vendor's options are the fields of its
settings dataclass (byoc.backend.settings); byoc's own (calibration) are declared here as such.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from byoc.errors import ByocError, PartitionError


def parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


@dataclass(frozen=True)
class Option:
    """One option: its name, what it does, its default, how the command line reads it (`parse`),
    the values it takes (`choices`, when it is a closed set), and whether it names the hardware
    configuration (`--target` on the command line)."""

    name: str
    help: str
    default: Any = None
    parse: Callable[[str], Any] = str
    choices: tuple[str, ...] = ()
    hardware: bool = False

    def check(self, backend: str, value: Any, error: type[ByocError] = PartitionError) -> Any:
        if self.choices and str(value) not in self.choices:  # choices as the command line writes them
            raise error(f"backend {backend!r}: option {self.name}={value!r} is not one of {', '.join(self.choices)}")
        return value

    def from_text(self, backend: str, text: str, error: type[ByocError] = PartitionError) -> Any:
        try:
            value = self.parse(text)
        except (TypeError, ValueError) as failure:
            raise error(f"backend {backend!r}: option {self.name}={text!r}: {failure}") from failure
        return self.check(backend, value, error)
