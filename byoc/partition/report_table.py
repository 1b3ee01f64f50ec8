"""The partition report: regions per backend, offload ratios by nodes and by MACs (the columns
of the paper's tables), and every op left on the host with the reasons it stayed there."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from byoc.ir.dim_range import DimRange
from byoc.partition.record import HostOpRecord, PartitionRecord, RegionRecord


def _ratio(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def _bytes(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError


@dataclass
class PartitionReport:
    backends: list[str]
    regions: list[RegionRecord]
    host_ops: list[HostOpRecord]
    total_ops: int
    total_macs: int
    # From a build: what vendors estimated per region (cycles, memory), and regions whose code
    # generation failed so that they run on the host.
    estimates: dict[str, dict] = field(default_factory=dict)
    build_fallbacks: dict[str, str] = field(default_factory=dict)
    # A model with dynamic dimensions: their ranges, and the regions generated per shape (see
    # docs/shapes.md); MACs and bytes are then those at each range's opt.
    dims: dict[str, str] = field(default_factory=dict)
    shape_specialised: list[str] = field(default_factory=list)
    symbolic_shapes: list[str] = field(default_factory=list)
    # Ops of a float16 model computed in float32 (see byoc.frontend.float16).
    float16_in_float32: int = 0
    # What runs in onnxruntime after the compiled model, where shapes depend on the data (see
    # byoc.ir.tail); the counts above are then the compiled part's.
    tail: str | None = None

    @classmethod
    def from_record(cls, record: PartitionRecord, estimates=None, build_fallbacks=None) -> PartitionReport:
        """The report of a partition record; regions that fell back to the host when the model
        was built (`build_fallbacks`, symbol -> reason) are reported as host ops, so that the
        report says what really runs where."""
        fallbacks = dict(build_fallbacks or {})
        regions = [r for r in record.regions if r.symbol not in fallbacks]
        returned = [op for r in record.regions if r.symbol in fallbacks
                    for op in r.as_host_ops(f"{r.backend}: region {r.symbol} fell back at build time: {fallbacks[r.symbol]}")]
        return cls(record.backends, regions, [*record.host_ops, *returned], record.total_ops, record.total_macs,
                   dict(estimates or {}), fallbacks, float16_in_float32=record.float16_in_float32)

    @property
    def offloaded_ops(self) -> int:
        return sum(r.num_ops for r in self.regions)

    @property
    def offloaded_macs(self) -> int:
        return sum(r.macs for r in self.regions)

    @property
    def offload_ratio_nodes(self) -> float:
        """Fraction of ops (composites counted by their ops) that run on a backend."""
        return _ratio(self.offloaded_ops, self.total_ops)

    @property
    def offload_ratio_macs(self) -> float:
        """Fraction of multiply-accumulates that run on a backend."""
        return _ratio(self.offloaded_macs, self.total_macs)

    def region(self, symbol: str) -> RegionRecord:
        for region in self.regions:
            if region.symbol == symbol:
                return region
        raise KeyError(f"no region {symbol!r}; regions: {[r.symbol for r in self.regions]}")

    def host_reasons(self) -> dict[str, list[str]]:
        """Reasons by host node name (a model node may have become several ops)."""
        reasons: dict[str, list[str]] = {}
        for host in self.host_ops:
            merged = reasons.setdefault(host.node, [])
            merged += [r for r in host.reasons if r not in merged]
        return reasons

    def to_dict(self) -> dict:
        return {
            "backends": self.backends,
            "offload_ratio_nodes": self.offload_ratio_nodes,
            "offload_ratio_macs": self.offload_ratio_macs,
            "total_ops": self.total_ops,
            "total_macs": self.total_macs,
            "regions": [{**vars(r), "num_ops": r.num_ops, **({"estimate": self.estimates[r.symbol]} if r.symbol in self.estimates else {})}
                        for r in self.regions],
            "host_ops": [vars(h) for h in self.host_ops],
            "build_fallbacks": self.build_fallbacks,
            "float16_in_float32": self.float16_in_float32,
            **({"tail": self.tail} if self.tail is not None else {}),
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def note_dims(self, dims: Mapping[str, DimRange], shape_specialised: Iterable[str], symbolic: Iterable[str] = (),
                  origin: Mapping[str, str] | None = None) -> None:
        """Record a model's dynamic dimensions and where each range comes from, its regions
        generated per shape and those generated once for every shape (symbolic shapes)."""
        origin = origin or {}
        self.dims = {name: f"{r} (opt {r.opt}; {origin.get(name, 'open' if r.open else 'given')})" for name, r in dims.items()}
        self.shape_specialised = sorted(shape_specialised)
        self.symbolic_shapes = sorted(symbolic)

    def _shape_lines(self) -> list[str]:
        if not self.dims:
            return []
        ranges = ", ".join(f"{name} {text}" for name, text in self.dims.items())
        specialised = ", ".join(s for s in self.shape_specialised if s not in self.build_fallbacks) or "none"
        symbolic = ", ".join(s for s in self.symbolic_shapes if s not in self.build_fallbacks)
        return [f"dynamic dimensions: {ranges} (MACs and bytes at each opt); generated per shape: {specialised}"
                + (f"; one build for every shape: {symbolic}" if symbolic else "")]

    def to_table(self, max_host_ops: int | None = 40) -> str:
        lines = [
            f"backends: {', '.join(self.backends)}",
            f"offload ratio: {self.offload_ratio_nodes:.1%} of {self.total_ops} ops, "
            f"{self.offload_ratio_macs:.1%} of {self.total_macs:,} MACs, in {len(self.regions)} region(s)"
            + (" of the compiled part" if self.tail is not None else ""),
            *([f"after it: {self.tail}"] if self.tail is not None else []),
            *self._shape_lines(),
            *([f"float16 computed in float32 ({self.float16_in_float32} ops that no backend here runs in float16 or "
               "bfloat16, as onnxruntime's CPU provider computes them); the model's float16 and bfloat16 inputs and "
               "outputs are cast where they are read and made"] if self.float16_in_float32 else []),
            "",
        ]
        header = ("region", "backend", "ops", "MACs", "inputs", "outputs", "constants", "first node")
        rows = [
            (
                r.symbol,
                r.backend,
                str(r.num_ops),
                f"{r.macs:,}",
                _bytes(r.input_bytes),
                _bytes(r.output_bytes),
                _bytes(r.constant_bytes),
                r.nodes[0],
            )
            for r in self.regions
        ]
        if any("cycles" in e for e in self.estimates.values()):
            header += ("est. cycles", "est. ms", "target")
            rows = [row + _estimate_cells(self.estimates.get(row[0], {}), self.build_fallbacks.get(row[0])) for row in rows]
        lines += _format_table(header, rows)
        for symbol, reason in self.build_fallbacks.items():
            lines.append(f"{symbol} runs on the host: {reason}")
        if self.host_ops:
            lines += ["", f"on the host ({len(self.host_ops)} node(s)):"]
            shown = self.host_ops if max_host_ops is None else self.host_ops[:max_host_ops]
            host_rows = [(h.node, "+".join(o.removeprefix("relax.") for o in h.ops), "; ".join(h.reasons)) for h in shown]
            lines += _format_table(("node", "op", "why"), host_rows)
            if len(shown) < len(self.host_ops):
                hidden = Counter(o for h in self.host_ops[len(shown) :] for o in h.ops)
                summary = ", ".join(f"{op} x{n}" for op, n in hidden.most_common())
                lines.append(f"... and {len(self.host_ops) - len(shown)} more: {summary}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_table()


def _estimate_cells(estimate: dict, fallback: str | None) -> tuple[str, str, str]:
    if fallback is not None or "cycles" not in estimate:
        return ("-", "-", "host" if fallback is not None else "-")
    target = estimate.get("target") or estimate.get("accelerator", "")
    return (f"{estimate['cycles']:,}", f"{estimate['ms_at_clock']:.3f}", str(target))


def _format_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*header), fmt.format(*("-" * w for w in widths)), *(fmt.format(*row) for row in rows)]
