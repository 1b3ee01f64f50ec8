"""The cheapest cover of the segments: a dynamic programme over segments in order, whose state
is the backend of the segment before, so that a measured cost is paid each time a new region is
entered (Collage summed candidate costs and never modelled the switch)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from byoc.errors import PlacementError
from byoc.partition.group import HOST


def cheapest_cover(costs: Sequence[Mapping[str, float]], switch: Mapping[tuple[str, str], float],
                   labels: Sequence[str] | None = None, start: str = HOST) -> tuple[list[str], float]:
    """(a backend per segment, total cost). `costs[s]` maps each backend that can run segment s
    to its cost; `switch[a, b]` is paid when a segment on b follows one on a (the model's inputs
    come from `start`, the host). Ties keep the order of `costs[s]`."""
    best: dict[str, float] = {}
    back: list[dict[str, str | None]] = []
    for index, options in enumerate(costs):
        if not options:
            label = labels[index] if labels is not None else str(index)
            raise PlacementError(f"segment {label}: no backend has a cost for it")
        current: dict[str, float] = {}
        came_from: dict[str, str | None] = {}
        for backend, cost in options.items():
            def entering(previous: str, backend: str = backend) -> float:
                return 0.0 if previous == backend else switch.get((previous, backend), 0.0)

            previous, total = None, entering(start)
            if best:
                previous = min(best, key=lambda b: best[b] + entering(b))
                total = best[previous] + entering(previous)
            current[backend] = total + cost
            came_from[backend] = previous
        best = current
        back.append(came_from)
    last = min(best, key=best.get)
    total = best[last]
    chosen = [last]
    for came_from in reversed(back[1:]):
        chosen.append(came_from[chosen[-1]])
    return list(reversed(chosen)), total
