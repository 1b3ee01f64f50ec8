"""Where a deployment keeps its vendors' shared libraries (byoc deploy copies them there):
`BYOC_LIBRARY_PATH`, directories separated by `os.pathsep`. A vendor that finds its library
through its pip package (oneDNN's, OpenBLAS's) looks here where the package is not installed: a
deployment carries the 100 MB of libraries a run loads rather than the 385 MB of packages that
hold them."""

from __future__ import annotations

import os
from pathlib import Path

VARIABLE = "BYOC_LIBRARY_PATH"


def find(name: str) -> Path | None:
    """The file `name` in the first directory of `BYOC_LIBRARY_PATH` that has it, or None."""
    for directory in filter(None, os.environ.get(VARIABLE, "").split(os.pathsep)):
        path = Path(directory) / name
        if path.is_file():
            return path.resolve()
    return None
