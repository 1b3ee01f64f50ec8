"""`byoc.Settings`: how one model is partitioned and built, whatever the vendor.

`partition_for(mod, vendors, settings)` and `build(mod, settings)` each read the fields of their
step, so one object can be made once and given to both; keyword arguments make one (`partition_for(
mod, "dnnl", precision="int8", calibration=...)`), laid over `settings` where both are given.
Keywords that name no field are cost rules (`byoc.CostRules`: over every vendor's own) or a
vendor's own partition settings (`byoc.VendorSettings`, routed to the vendors that declare them).
A value out of range is an error at the call that received it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from byoc.backend.cost import COST_OPTIONS, CostRules
from byoc.errors import ByocError, PartitionError
from byoc.runtime_metadata.shape_memory import check_shape_memory

PLACEMENTS = ("priority", "auto")
PRECISIONS = ("fp32", "int8", "auto")
ENGINES = ("lazy", "eager", "embed")
# The fields `build` reads; `partition_for` reads the others.
BUILD_FIELDS = ("target", "strict", "engines", "backend_options", "cache_dir", "shape_buckets", "max_shapes", "shape_memory")


@dataclass(frozen=True)
class Settings:
    # -- partitioning (`partition_for`)
    # Which vendor runs each part: the first that takes it ("priority"), or by measured cost
    # ("auto", see byoc.placement), within `budget_s` seconds, on `placement_inputs` (model inputs
    # by name; default seeded random), timings cached under `placement_cache_dir`, measured on this
    # machine or on the devices under `rpc_key` at the TVM RPC tracker `rpc_tracker`.
    placement: str = "priority"
    budget_s: float | None = None
    placement_inputs: Mapping[str, Any] | None = None
    placement_cache_dir: str | os.PathLike | None = None
    rpc_tracker: str | None = None
    rpc_key: str | None = None
    rpc_fallback_local: bool = False
    # "fp32", "int8" (the model quantized first, as onnxruntime's tool would), or "auto" (each
    # segment in int8 or fp32 by measurement, within `max_rel_l2` relative L2; a `max_rel_l2`
    # alone asks for it): see byoc.placement.precision.
    precision: str = "fp32"
    max_rel_l2: float | None = None
    # Model inputs int8 scales are calibrated on (dicts by input name or lists by position), at
    # most `num_calibration_samples` of them, by `calibration_method` (by default the vendor's).
    calibration: Sequence[Any] | None = None
    num_calibration_samples: int | None = None
    calibration_method: str | None = None
    # Cost rules laid over every vendor's own (names of byoc.CostRules' fields).
    cost: Mapping[str, Any] = field(default_factory=dict)
    # The vendors' own partition settings by name, given to those that declare them.
    vendor_options: Mapping[str, Any] = field(default_factory=dict)
    # -- building (`build`)
    # The host's TVM target; whether a region that fails to generate or make its engine fails
    # the build (else it falls back to the host with a warning); when engines are made ("eager":
    # now, checked by a trial run; "lazy": on first use; "embed": now, and kept in the artifact);
    # each vendor's build and load settings by vendor name; where saved engines are cached.
    target: str = "llvm"
    strict: bool = False
    engines: str = "eager"
    backend_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    cache_dir: str | os.PathLike | None = None
    # A model with dynamic dimensions: the shapes regions are generated for ahead (a list of
    # {dimension: value}, or one {dimension: [values]} for every combination; by default each
    # range's opt), how many per region are kept in memory (by default, build's), and the bytes
    # of everything kept per shape met, together (byoc.runtime_metadata.shape_memory; load may
    # set it again where the model runs).
    shape_buckets: object = None
    max_shapes: int | None = None
    shape_memory: int | None = None

    def __post_init__(self) -> None:
        for name in ("cost", "vendor_options", "backend_options"):  # None given for "none"
            if getattr(self, name) is None:
                object.__setattr__(self, name, {})
        if self.placement not in PLACEMENTS:
            raise PartitionError(f"placement must be one of {PLACEMENTS}, not {self.placement!r}")
        remote = self.rpc_tracker or self.rpc_key
        if self.placement != "auto" and (self.budget_s is not None or self.placement_inputs is not None or remote):
            raise PartitionError("budget_s, placement_inputs and the rpc_* options apply to placement='auto' only")
        if self.budget_s is not None and not self.budget_s >= 0:
            raise PartitionError(f"budget_s is the time allowed for measuring, in seconds: it must be at least 0, not {self.budget_s}")
        if self.precision not in PRECISIONS:
            raise PartitionError(f"precision must be one of {PRECISIONS}, not {self.precision!r}")
        if self.max_rel_l2 is not None and self.precision == "fp32":
            object.__setattr__(self, "precision", "auto")  # an error budget is what precision by measurement spends
        if self.max_rel_l2 is not None and self.precision != "auto":
            raise PartitionError("max_rel_l2 is the error budget of precision='auto'")
        if self.num_calibration_samples is not None and self.num_calibration_samples < 1:
            raise PartitionError(f"num_calibration_samples must be at least 1, not {self.num_calibration_samples}")
        CostRules().with_options(**self.cost)  # names and ranges checked here, at the call
        if self.engines not in ENGINES:
            raise ByocError(f"engines must be 'lazy', 'eager' or 'embed', not {self.engines!r}")
        if self.max_shapes is not None and self.max_shapes < 1:
            raise ByocError(f"max_shapes must be at least 1, not {self.max_shapes}")
        check_shape_memory(self.shape_memory)

    @classmethod
    def of(cls, settings: Settings | None, options: Mapping[str, Any], step: str = "partition_for") -> Settings:
        """`settings` (or the defaults) with the keyword `options` of `step` ("partition_for" or
        "build") laid over them: fields by name, and for partitioning, cost rules into `cost` and
        anything else into `vendor_options`. A keyword of the other step is an error."""
        if settings is not None and not isinstance(settings, Settings):
            raise ByocError(f"settings must be a byoc.Settings, not {type(settings).__name__}")
        if step == "build":
            wrong = sorted(set(options) - set(BUILD_FIELDS))
            if wrong:
                raise ByocError(f"build takes {', '.join(BUILD_FIELDS)}, not {', '.join(wrong)} (settings of partition_for)")
        else:
            wrong = sorted(set(options) & set(BUILD_FIELDS))
            if wrong:
                raise PartitionError(f"{', '.join(wrong)}: settings of build, not of partition_for")
        base = settings or cls()
        own = {f.name for f in fields(cls)}
        given = {name: value for name, value in options.items() if name in own}
        cost = {**base.cost, **(given.pop("cost", None) or {}), **{n: v for n, v in options.items() if n in COST_OPTIONS}}
        vendor = {**base.vendor_options, **(given.pop("vendor_options", None) or {}),
                  **{n: v for n, v in options.items() if n not in own and n not in COST_OPTIONS}}
        if not given and cost == base.cost and vendor == base.vendor_options:
            return base
        return dataclasses.replace(base, **given, cost=cost, vendor_options=vendor)

    def calibration_samples(self) -> list[Any]:
        return list(self.calibration or [])[:self.num_calibration_samples]


__all__ = ["BUILD_FIELDS", "ENGINES", "PLACEMENTS", "PRECISIONS", "Settings", "check_shape_memory"]
