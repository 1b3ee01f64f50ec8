"""A package's public names, imported on first use (PEP 562).

`import byoc` must not import the compiler: an artifact loads where TVM's runtime library is
alone (see byoc.deploy), and TVM's Relax IR, which partitioning and building are written in,
cannot be imported there. So a package that exports both sides names where each export lives,
and the module is imported when the name is first read.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, where: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose names `where` maps to their modules."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)  # read once: later reads find it directly
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *where})

    return __getattr__, __dir__
