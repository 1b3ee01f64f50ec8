"""Graph partitioning: group, annotate, merge, split and outline regions; report the result."""

from byoc.partition.pipeline import partition_for
from byoc.partition.regions import RegionSummary
from byoc.partition.report import PartitionReport, report

__all__ = ["PartitionReport", "RegionSummary", "partition_for", "report"]
