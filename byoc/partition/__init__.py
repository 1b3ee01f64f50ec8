"""Graph partitioning: group, annotate, merge, split and outline regions; report the result."""

from byoc.backend.views import RegionSummary
from byoc.partition.pipeline import partition_graph
from byoc.partition.report import PartitionReport, report

__all__ = ["PartitionReport", "RegionSummary", "partition_graph", "report"]
