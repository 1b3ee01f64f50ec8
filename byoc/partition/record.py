"""The partition record: what went where and why, stored on the partitioned module.

It travels as a JSON string in the module attribute `byoc.partition`, so that a report can be
made from the module alone, later or in another process.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from byoc.backend.views import RegionSummary

PARTITION_ATTR = "byoc.partition"
RECORD_VERSION = 2


@dataclass
class RegionRecord:
    symbol: str
    backend: str
    nodes: list[str]
    ops: list[str]
    macs: int
    constant_bytes: int
    working_bytes: int
    input_bytes: int
    output_bytes: int
    patterns: dict[str, int]
    # [node, ops, MACs] per member node: what goes back to the host if the region's code
    # generation fails at build time.
    members: list[list] = field(default_factory=list)

    @property
    def num_ops(self) -> int:
        return len(self.ops)

    @classmethod
    def from_summary(cls, symbol: str, summary: RegionSummary, patterns: dict[str, int], members: list[list]) -> RegionRecord:
        return cls(
            symbol,
            summary.backend,
            list(summary.nodes),
            list(summary.ops),
            summary.macs,
            summary.constant_bytes,
            summary.working_bytes,
            summary.input_bytes,
            summary.output_bytes,
            patterns,
            members,
        )

    def as_host_ops(self, reason: str) -> list[HostOpRecord]:
        """The region's nodes as host ops, each with `reason`."""
        members = self.members or [[node, [], 0] for node in self.nodes]
        if not self.members and members:  # a version-1 record: the ops and MACs go with the first node
            members[0] = [self.nodes[0], list(self.ops), self.macs]
        return [HostOpRecord(node, list(ops), [reason], macs) for node, ops, macs in members]


@dataclass
class HostOpRecord:
    node: str
    ops: list[str]
    reasons: list[str]
    macs: int


@dataclass
class PartitionRecord:
    backends: list[str]
    regions: list[RegionRecord] = field(default_factory=list)
    host_ops: list[HostOpRecord] = field(default_factory=list)
    total_ops: int = 0
    total_macs: int = 0
    # Ops of a float16 model computed in float32 where no backend runs them in float16
    # (byoc.frontend.float16).
    float16_in_float32: int = 0

    def to_dict(self) -> dict:
        return {"version": RECORD_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> PartitionRecord:
        return cls(
            backends=list(data["backends"]),
            regions=[RegionRecord(**r) for r in data["regions"]],
            host_ops=[HostOpRecord(**h) for h in data["host_ops"]],
            total_ops=data["total_ops"],
            total_macs=data["total_macs"],
            float16_in_float32=data.get("float16_in_float32", 0),
        )
