"""byoc: bring your own codegen.

Partition a model between a host and accelerators, generate code for each accelerator region
in the format its vendor chose, and run everything from one artifact.
"""

from byoc import models
from byoc.backend import Backend, CostRules, Limits, Pattern, get_backend, list_backends, register_backend, unregister_backend
from byoc.frontend import cleanup, from_onnx
from byoc.partition import PartitionReport, RegionSummary, partition_for, report
from byoc.runtime_metadata import CompiledModel, Engine, build, load

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "CompiledModel",
    "CostRules",
    "Engine",
    "Limits",
    "Pattern",
    "PartitionReport",
    "RegionSummary",
    "build",
    "cleanup",
    "from_onnx",
    "load",
    "get_backend",
    "list_backends",
    "models",
    "partition_for",
    "register_backend",
    "report",
    "unregister_backend",
]

# Built-in vendors and vendor plugin packages (entry-point group `byoc.vendors`) register now, so
# that they are listed and usable as soon as byoc is imported.
from byoc.backend.registry import discover_backends  # noqa: E402

discover_backends()
