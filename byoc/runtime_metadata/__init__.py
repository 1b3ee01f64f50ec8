"""The metadata-module runtime: build a partitioned module, run it, export and load one artifact."""

from byoc.backend.engine import Engine
from byoc.runtime_metadata.build import build
from byoc.runtime_metadata.model import CompiledModel, load

__all__ = ["CompiledModel", "Engine", "build", "load"]
