"""Partition options a backend declares: hardware configurations, integration choices.

`byoc.partition_for(mod, name, **options)` routes every option to the backends that declare it
and refuses one that none declares, listing those they do; the command line sets them with
`--option NAME=VALUE`. A backend that declares options also gives a `configure` function,
which returns the backend as those values configure it.
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
    """One declared option: its name, what it does, its default, how the command line reads it
    (`parse`), the values it takes (`choices`, when it is a closed set), and whether it names
    the hardware configuration (`--target` on the command line)."""

    name: str
    help: str
    default: Any = None
    parse: Callable[[str], Any] = str
    choices: tuple[str, ...] = ()
    target: bool = False

    def check(self, backend: str, value: Any, error: type[ByocError] = PartitionError) -> Any:
        if self.choices and value not in self.choices:
            raise error(f"backend {backend!r}: option {self.name}={value!r} is not one of {', '.join(self.choices)}")
        return value

    def from_text(self, backend: str, text: str, error: type[ByocError] = PartitionError) -> Any:
        try:
            value = self.parse(text)
        except (TypeError, ValueError) as failure:
            raise error(f"backend {backend!r}: option {self.name}={text!r}: {failure}") from failure
        return self.check(backend, value, error)
