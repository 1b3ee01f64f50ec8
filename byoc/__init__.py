"""byoc: bring your own codegen.

Partition a model between a host and accelerators, generate code for each accelerator region
in the format its vendor chose, and run everything from one artifact.
"""

import importlib

from byoc.backend.builtin import BUILTIN_VENDORS, data_sheet
from byoc.exports import lazy_exports

# Where each public name lives: imported on first use (see byoc.exports), so that `byoc.load`
# works where TVM's compiler is not installed.
_WHERE = {
    **dict.fromkeys(["BUILD", "PARTITION", "VendorSettings", "setting"], "byoc.backend.settings"),
    **dict.fromkeys(["Backend", "Pattern"], "byoc.backend.spec"),
    "CostRules": "byoc.backend.cost",
    "Limits": "byoc.backend.limits",
    "Tolerance": "byoc.backend.tolerance",
    **dict.fromkeys(["get_backend", "list_backends", "register_backend", "unregister_backend"], "byoc.backend.registry"),
    "Engine": "byoc.backend.engine",
    "Settings": "byoc.compile_settings",
    "partition_for": "byoc.flow",
    **dict.fromkeys(["cleanup", "from_onnx", "from_torch"], "byoc.frontend"),
    "PartitionReport": "byoc.partition.report_table",
    "report": "byoc.partition.module_report",
    "RegionSummary": "byoc.backend.views",
    **dict.fromkeys(["PrecisionReport", "precision_report"], "byoc.placement.precision"),
    **dict.fromkeys(["PlacementReport", "placement_report"], "byoc.placement.report"),
    "build": "byoc.runtime_metadata.build",
    "CompiledModel": "byoc.runtime_metadata.model",
    "load": "byoc.runtime_metadata.model",
}
_exported, __dir__ = lazy_exports(__name__, _WHERE)
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
    """A public name, or `byoc.partition_for_<vendor>`, importing that vendor alone on first use:
    `import byoc` needs no vendor's dependencies (see byoc.backend.registry)."""
    vendor = name.removeprefix("partition_for_")
    if name.startswith("partition_for_") and vendor in BUILTIN_VENDORS:
        return getattr(importlib.import_module(data_sheet(vendor)), name)
    if name == "models":  # a submodule: the exports' getattr would ask this function again
        return importlib.import_module("byoc.models")
    return _exported(name)
