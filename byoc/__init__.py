"""byoc: bring your own codegen.

Partition a model between a host and accelerators, generate code for each accelerator region
in the format its vendor chose, and run everything from one artifact.
"""

from byoc import models
from byoc.backend import Backend, CostRules, Limits, Option, Pattern, Tolerance, get_backend, list_backends, register_backend, unregister_backend
from byoc.backend.registry import discover_backends
from byoc.flow import partition_for
from byoc.frontend import cleanup, from_onnx
from byoc.partition import PartitionReport, RegionSummary, report
from byoc.placement.report import PlacementReport, placement_report
from byoc.runtime_metadata import CompiledModel, Engine, build, load
from byoc.vendors.dnnl import partition_for_dnnl
from byoc.vendors.ethos_u import partition_for_ethos_u
from byoc.vendors.onnxruntime import partition_for_onnxruntime
from byoc.vendors.reference import partition_for_reference
from byoc.vendors.tensorrt import partition_for_tensorrt
from byoc.vendors.vitis_ai import partition_for_vitis_ai

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "CompiledModel",
    "CostRules",
    "Engine",
    "Limits",
    "Option",
    "Pattern",
    "PartitionReport",
    "PlacementReport",
    "RegionSummary",
    "Tolerance",
    "build",
    "cleanup",
    "from_onnx",
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
    "register_backend",
    "report",
    "unregister_backend",
]

# Vendor plugin packages (entry-point group `byoc.vendors`) register now, so that they are
# listed and usable as soon as byoc is imported.
discover_backends()
