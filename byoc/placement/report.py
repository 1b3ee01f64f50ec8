"""The placement report: per segment, the backend chosen, its measured time and what the
alternatives would have cost; the switch costs; the whole model's predicted and measured
latency. It travels with the partitioned module as JSON in the attribute `byoc.placement`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import tvm

PLACEMENT_ATTR = "byoc.placement"
INT8 = ":int8"  # an option's suffix: the segment quantized by byoc, on the backend named before it


@dataclass
class SegmentRow:
    index: int
    label: str  # first .. last model node
    ops: int
    macs: int
    chosen: str
    costs: dict[str, float]  # backend -> measured ms of the segment alone (invocation removed)
    notes: dict[str, str] = field(default_factory=dict)  # backend -> why it has no cost here
    errors: dict[str, float] = field(default_factory=dict)  # int8 option -> the model's error with this segment alone on it


@dataclass
class PlacementReport:
    backends: list[str]
    where: str  # the machine that timed the candidates
    rows: list[SegmentRow]
    switch_ms: dict[str, float]  # cost of entering a region of each backend
    base_ms: float  # a model run's own overhead
    segments_ms: float  # what the search minimised: the chosen segments' costs and switches
    predicted_ms: float | None  # the final placement's stretches of one backend, each timed as one region, and switches
    measured_ms: float | None
    single_backend_ms: dict[str, float]  # predicted latency with one backend (and the host)
    decision: str  # what the end-to-end check decided
    search_s: float
    measured: int  # candidates timed in this search
    cached: int  # candidates whose time came from the cache
    budget: float | None = None  # the error budget precision was chosen under (max_rel_l2), if any
    rel_l2: float | None = None  # the kept placement's measured error against fp32
    samples: int = 0  # calibration inputs the errors were measured on
    # A model with dynamic dimensions: the value each was timed at (the placement holds for all)
    timed_at: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_dict(cls, data: dict) -> PlacementReport:
        return cls(**{**data, "rows": [SegmentRow(**r) for r in data["rows"]]})

    def to_table(self) -> str:
        int8 = sorted({o for row in self.rows for o in (*row.costs, *row.notes) if o.endswith(INT8)})
        columns = [*self.backends, *int8, "host"]
        errors = self.budget is not None
        lines = [
            f"measured placement over {', '.join(columns)} on {self.where}: {len(self.rows)} segments, "
            f"{self.measured} candidate(s) measured, {self.cached} from the cache, {self.search_s:.1f} s",
        ]
        if self.timed_at:
            at = ", ".join(f"{name}={value}" for name, value in self.timed_at.items())
            lines.append(f"timed at {at} (each dynamic dimension at its range's opt); the placement holds for every shape in range")
        if errors:
            chosen = [row for row in self.rows if row.chosen in row.errors or row.chosen.endswith(INT8)]
            measured = "-" if self.rel_l2 is None else f"{self.rel_l2:.2%}"
            lines.append(f"precision under an error budget of {self.budget:.2%} (relative L2 against fp32 on {self.samples} "
                         f"calibration input(s)): {len(chosen)} of {len(self.rows)} segments in int8, error {measured}")
        widths = [max(13, len(c) + 2) for c in columns]
        lines.append(f"{'seg':>4}  {'nodes':<44}{'ops':>5}{'MMACs':>8}  {'chosen':<17}"
                     + "".join(f"{c:>{w}}" for c, w in zip(columns, widths)) + (f"{'error':>9}" if errors else ""))
        lines.append("-" * len(lines[-1]))
        notes = []
        for row in self.rows:
            cells = []
            for backend, width in zip(columns, widths):
                if backend in row.costs:
                    mark = "*" if backend == row.chosen else " "
                    cells.append(f"{row.costs[backend]:>{width - 1}.3f}{mark}")
                else:
                    cells.append(f"{'-':>{width}}")
                    if backend in row.notes:
                        notes.append(f"  segment {row.index}, {backend}: {row.notes[backend]}")
            label = row.label if len(row.label) <= 42 else row.label[:39] + "..."
            error = row.errors.get(row.chosen)
            lines.append(f"{row.index:>4}  {label:<44}{row.ops:>5}{row.macs / 1e6:>8.0f}  {row.chosen:<17}" + "".join(cells)
                         + ((f"{error:>9.2%}" if error is not None else f"{'-':>9}") if errors else ""))
        lines.append("times in ms, each segment alone without its invocation; * chosen"
                     + ("; error: the model's with that segment alone in int8 as chosen" if errors else ""))
        if errors and self.rel_l2 and not any(row.errors for row in self.rows):
            lines.append("(the fastest placement is within the error budget: segments were not measured alone)")
        if notes:
            lines.append("no time for:")
            lines.extend(notes)
        switch = ", ".join(f"{b} {ms:.3f} ms" for b, ms in self.switch_ms.items())
        lines.append(f"entering a region (measured): {switch or 'none'}; a model run's own overhead {self.base_ms:.3f} ms")
        singles = ", ".join(f"{b} {ms:.3f} ms" for b, ms in self.single_backend_ms.items())
        measured = f"{self.measured_ms:.3f} ms" if self.measured_ms is not None else "not timed end to end"
        if self.predicted_ms is None:
            predicted = "not predicted (a stretch of it has no time)"
        else:
            error = f" ({(self.predicted_ms / self.measured_ms - 1) * 100:+.1f}%)" if self.measured_ms else ""
            predicted = f"predicted {self.predicted_ms:.3f} ms{error}"
        lines.append(f"whole model: {predicted}, measured {measured} (the search's sum over "
                     f"segments: {self.segments_ms:.3f} ms); one backend with the host, summed over segments: {singles}")
        lines.append(self.decision)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_table()


def placement_report(mod: tvm.IRModule) -> PlacementReport | None:
    """The placement report a measured placement attached to `mod`, or None."""
    data = mod.attrs.get(PLACEMENT_ATTR) if mod.attrs is not None else None
    return PlacementReport.from_dict(json.loads(str(data))) if data is not None else None
