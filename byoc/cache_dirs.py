"""Where byoc keeps what it makes once per machine and reuses, each under `~/.cache/byoc` unless
its variable says otherwise: engines (`BYOC_CACHE_DIR`), and beside them the libraries it
compiles (`libraries/`); placement's timings (`BYOC_PLACEMENT_CACHE_DIR`)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "BYOC_CACHE_DIR"
PLACEMENT_CACHE_ENV = "BYOC_PLACEMENT_CACHE_DIR"


def _configured(variable: str, default: str) -> Path:
    configured = os.environ.get(variable)
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "byoc" / default


def default_cache_dir() -> Path:
    """The engine cache's directory."""
    return _configured(CACHE_ENV, "engines")


def library_cache_dir() -> Path:
    """Compiled libraries (host code, kernel-library helpers), beside the engine cache."""
    return default_cache_dir().parent / "libraries"


def default_placement_cache_dir() -> Path:
    """Placement's timings."""
    return _configured(PLACEMENT_CACHE_ENV, "placement")
