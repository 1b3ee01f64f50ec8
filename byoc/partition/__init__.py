"""Graph partitioning: group, annotate, merge, split and outline regions; report the result."""

from byoc.exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "RegionSummary": "byoc.backend.views",
    "partition_graph": "byoc.partition.pipeline",
    "PartitionReport": "byoc.partition.report_table",
    "report": "byoc.partition.module_report",
})

__all__ = ["PartitionReport", "RegionSummary", "partition_graph", "report"]
