"""Cost-based fallback (paper section 3.1.3): regions not worth offloading return to the host.

A region falls back when it is smaller than the minimum op count, has no MACs while the rules
ask for MACs, has fewer MACs than the threshold, still exceeds a per-region limit (one node
alone can be too big for the chip), or is refused by the user's region filter.
"""

from __future__ import annotations

from byoc.backend.cost import CostRules
from byoc.backend.verdict import rejection
from byoc.backend.views import RegionSummary
from byoc.errors import PredicateError


def fallback_reason(summary: RegionSummary, rules: CostRules) -> str | None:
    if summary.non_tensor_boundary:
        return f"a tuple value crosses the region boundary at {summary.non_tensor_boundary}"
    if summary.num_ops < rules.min_ops_per_region:
        return f"region too small: {summary.num_ops} op(s), the minimum is {rules.min_ops_per_region}"
    if rules.fallback_without_macs and summary.macs == 0:
        return "region has no MACs"
    if summary.macs < rules.min_macs_per_region:
        return f"region has {summary.macs:,} MACs, under the threshold of {rules.min_macs_per_region:,}"
    limits = [
        ("ops", summary.num_ops, rules.max_ops_per_region),
        ("MACs", summary.macs, rules.max_macs_per_region),
        ("working bytes", summary.working_bytes, rules.max_bytes_per_region),
    ]
    for what, value, limit in limits:
        if limit is not None and value > limit:
            return f"node {summary.nodes[0]!r} alone has {value:,} {what}, over the limit of {limit:,}"
    if rules.region_filter is not None:
        try:
            verdict = rules.region_filter(summary)
        except Exception as error:
            raise PredicateError(
                f"backend {summary.backend!r}: the region filter raised on the region starting at node "
                f"{summary.nodes[0]!r}: {type(error).__name__}: {error}"
            ) from error
        return rejection(verdict, "refused by the region filter")
    return None
