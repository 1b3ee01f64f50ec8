"""Cost rules: how big or heavy a region may be, and which regions are not worth offloading."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace

from byoc.backend.verdict import FilterVerdict
from byoc.backend.views import RegionSummary
from byoc.errors import PartitionError

RegionFilter = Callable[[RegionSummary], FilterVerdict]


@dataclass(frozen=True)
class CostRules:
    """Splitting limits (paper section 3.1.3) and fallback rules for offloaded regions.

    `max_bytes_per_region` bounds the region's working set: the bytes of its constants plus the
    bytes of every tensor its ops produce, a stand-in for on-chip memory.
    """

    max_ops_per_region: int | None = None
    max_macs_per_region: int | None = None
    max_bytes_per_region: int | None = None
    # Integrations that hand the accelerator one subgraph (the paper's Vitis AI) keep only
    # the regions with the most MACs.
    max_regions: int | None = None
    min_ops_per_region: int = 1
    min_macs_per_region: int = 0
    fallback_without_macs: bool = False
    host_ops: frozenset[str] = field(default_factory=frozenset)
    region_filter: RegionFilter | None = None

    def with_options(self, **options) -> CostRules:
        """These rules with user options laid over them; unknown names are an error."""
        names = {f.name for f in fields(self)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise PartitionError(f"unknown partition option(s) {unknown}; cost options are {sorted(names)}")
        if "host_ops" in options:
            options["host_ops"] = frozenset(_as_names(options["host_ops"]))
        least = {"max_ops_per_region": 1, "max_macs_per_region": 1, "max_bytes_per_region": 1, "max_regions": 1,
                 "min_ops_per_region": 0, "min_macs_per_region": 0}
        for name, low in least.items():
            value = options.get(name)
            if value is not None and value < low:
                raise PartitionError(f"{name} must be at least {low}, not {value}")
        return replace(self, **options)


# The names a user gives cost rules by (`partition_for(mod, vendor, max_regions=1)`).
COST_OPTIONS = frozenset(f.name for f in fields(CostRules))


def _as_names(value: str | Iterable[str]) -> Iterable[str]:
    return [value] if isinstance(value, str) else value
