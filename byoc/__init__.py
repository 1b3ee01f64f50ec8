"""byoc: bring your own codegen.

Partition a model between a host and accelerators, generate code for each accelerator region
in the format its vendor chose, and run everything from one artifact.
"""

from byoc import models
from byoc.backend import (
    BUILD,
    PARTITION,
    Backend,
    CostRules,
    Limits,
    Pattern,
    Tolerance,
    VendorSettings,
    get_backend,
    list_backends,
    register_backend,
    setting,
    unregister_backend,
)
from byoc.backend.registry import BUILTIN_VENDORS
from byoc.compile_settings import Settings
from byoc.flow import partition_for
from byoc.frontend import cleanup, from_onnx, from_torch
from byoc.partition import PartitionReport, RegionSummary, report
from byoc.placement.precision import PrecisionReport, precision_report
from byoc.placement.report import PlacementReport, placement_report
from byoc.runtime_metadata import CompiledModel, Engine, build, load

__version__ = "0.1.0"

__all__ = [
    "BUILD",
    "PARTITION",
    "Backend",
    "CompiledModel",
    "CostRules",
    "Engine",
    "Limits",
    "Pattern",
    "PartitionReport",
    "PlacementReport",
    "PrecisionReport",
    "RegionSummary",
    "Settings",
    "Tolerance",
    "VendorSettings",
    "build",
    "cleanup",
    "from_onnx",
    "from_torch",
    "get_backend",
    "list_backends",
    "load",
    "models",
    "partition_for",
    "partition_for_dnnl",
    "partition_for_ethos_u",
    "partition_for_onnxruntime",
    "partition_for_reference",
    "partition_for_tensorrt",
    "partition_for_vitis_ai",
    "placement_report",
    "precision_report",
    "register_backend",
    "report",
    "setting",
    "unregister_backend",
]


def __getattr__(name: str):
    """`byoc.partition_for_<vendor>`, importing that vendor alone on first use: `import byoc`
    needs no vendor's dependencies (see byoc.backend.registry)."""
    vendor = name.removeprefix("partition_for_")
    if name.startswith("partition_for_") and vendor in BUILTIN_VENDORS:
        import importlib

        return getattr(importlib.import_module(BUILTIN_VENDORS[vendor][0]), name)
    raise AttributeError(f"module 'byoc' has no attribute {name!r}")
