"""Why ops stay on the host: reasons collected while partitioning, keyed by model node name."""

from __future__ import annotations

from collections import defaultdict

# Why an op of a model with dynamic dimensions that depends on its shape alone stays on the host.
SHAPE_ONLY = "depends on the model's shape alone: the host computes it once per shape and keeps it"


class HostReasons:
    """Rejection reasons per node name, kept in the order they were found, without repeats."""

    def __init__(self) -> None:
        self._reasons: dict[str, dict[str, None]] = defaultdict(dict)

    def add(self, node: str, reason: str) -> None:
        self._reasons[node][reason] = None

    def of(self, node: str) -> list[str]:
        return list(self._reasons.get(node, ()))
