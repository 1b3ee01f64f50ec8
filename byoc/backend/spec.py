"""The backend specification: what a vendor writes to describe its hardware.

A backend names the op patterns it executes as one instruction (paper section 3.1.1), the single
ops it accepts and under which conditions (3.1.2), its hardware-wide limits, its cost rules for
splitting regions (3.1.3), a priority for when several backends accept an op, and how its
regions are handed over: a JSON graph, C source, or a custom binary format (3.3).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tvm.relax.dpl import DFPattern

from byoc.backend.cost import CostRules
from byoc.backend.limits import Limits
from byoc.backend.op_rules import OpCheck, OpRule, registered_op_rules
from byoc.backend.options import Option
from byoc.backend.tolerance import FP32, Tolerance
from byoc.backend.verdict import Verdict
from byoc.backend.views import PatternMatch
from byoc.errors import BackendRegistrationError

if TYPE_CHECKING:
    from byoc.codegen_c.library import CLibrary
    from byoc.codegen_json.runtime import JsonRuntime
    from byoc.custom_formats.format import CustomFormat
    from byoc.processing.passes import RegionPass

CODEGEN_KINDS = ("json", "c", "custom")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

PatternCheck = Callable[[PatternMatch], Verdict]


@dataclass(frozen=True)
class Pattern:
    """A sequence of ops the hardware runs as one composite instruction."""

    name: str
    pattern: DFPattern
    annotations: Mapping[str, DFPattern] = field(default_factory=dict)
    check: PatternCheck | None = None


@dataclass
class Backend:
    name: str
    codegen: str
    priority: int = 0
    limits: Limits = field(default_factory=Limits)
    cost: CostRules = field(default_factory=CostRules)
    description: str = ""
    patterns: list[Pattern] = field(default_factory=list)
    op_rules: dict[str, OpRule] = field(default_factory=dict)
    json_runtime: JsonRuntime | None = None
    c_library: CLibrary | None = None
    custom_format: CustomFormat | None = None
    # Accelerator-specific processing of each region's graph before code generation
    # (quantization, layout transformation, casting): see byoc.processing.
    processing: list[RegionPass] = field(default_factory=list)
    # Partition options the vendor declares (hardware configuration, integration choices), and
    # `configure(**values)`, which returns the backend those values configure: its limits may
    # differ per configuration (DPU sizes, NPU variants). `target` names the configuration a
    # backend object stands for; its regions carry it to code generation.
    options: list[Option] = field(default_factory=list)
    configure: Callable[..., Backend] | None = None
    target: str = ""
    # How close its results are to float32 onnxruntime's (see byoc.backend.tolerance).
    tolerance: Tolerance = FP32
    # Why the vendor's library or device is missing on this machine, or None when it is here.
    # Partitioning and reports work without it; building a region for it is refused with the reason.
    unavailable: Callable[[], str | None] | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise BackendRegistrationError(
                f"backend name {self.name!r} must be lower-case letters, digits and '_', starting with a letter"
            )
        if self.codegen not in CODEGEN_KINDS:
            raise BackendRegistrationError(f"backend {self.name!r}: codegen {self.codegen!r} is not one of {CODEGEN_KINDS}")
        if self.options and self.configure is None:
            raise BackendRegistrationError(f"backend {self.name!r} declares options but no configure function to apply them")
        names = [option.name for option in self.options]
        if len(set(names)) != len(names):
            raise BackendRegistrationError(f"backend {self.name!r} declares an option twice: {names}")

    def missing_part(self) -> str | None:
        """Why this vendor cannot build regions on this machine, or None when it can."""
        return self.unavailable() if self.unavailable is not None else None

    def library_version(self) -> str:
        """The version of what generates and runs this backend's code (its runtime library, C
        kernel library or binary format): engine caches, artifacts and timings depend on it."""
        if self.codegen == "json":
            return self.json_runtime.version
        if self.codegen == "c":
            return self.c_library.version
        return f"{self.custom_format.name}-{self.custom_format.version}"

    def option(self, name: str) -> Option | None:
        return next((option for option in self.options if option.name == name), None)

    def configured(self, values: Mapping[str, Any]) -> Backend:
        """This backend configured by `values` (declared options only; others keep their
        defaults). Without values, the backend itself."""
        if not values:
            return self
        settings = {option.name: option.default for option in self.options}
        settings.update({name: self.option(name).check(self.name, value) for name, value in values.items()})
        backend = self.configure(**settings)
        if not isinstance(backend, Backend) or backend.name != self.name:
            raise BackendRegistrationError(f"backend {self.name!r}: configure() must return a Backend named {self.name!r}")
        return backend

    # --------------------------------------------------------------- patterns
    def pattern(
        self,
        name: str,
        pattern: DFPattern,
        annotations: Mapping[str, DFPattern] | None = None,
        check: PatternCheck | None = None,
    ) -> Pattern:
        """Declare a composite; patterns declared first are tried first."""
        if any(p.name == name for p in self.patterns):
            raise BackendRegistrationError(f"backend {self.name!r} declares pattern {name!r} twice")
        declared = Pattern(name, pattern, dict(annotations or {}), check)
        self.patterns.append(declared)
        return declared

    # -------------------------------------------------------------- op rules
    def supports(self, *ops: str, check: OpCheck | None = None) -> None:
        """Declare single ops this backend accepts, all under one optional predicate."""
        for op in ops:
            self.op_rules[op] = OpRule(op, check)

    def op(self, *ops: str) -> Callable[[OpCheck], OpCheck]:
        """Decorator form of `supports`: the decorated function is the ops' predicate."""

        def register(check: OpCheck) -> OpCheck:
            self.supports(*ops, check=check)
            return check

        return register

    def rules(self) -> dict[str, OpRule]:
        """Own op rules plus those registered for this backend with `register_op_attr`."""
        return {**registered_op_rules(self.name), **self.op_rules}

    # -------------------------------------------------------------- codegen
    def validate_codegen(self) -> None:
        """Raise unless the hook for this backend's codegen kind is present."""
        hook = {"json": self.json_runtime, "c": self.c_library, "custom": self.custom_format}[self.codegen]
        if hook is None:
            attr = {"json": "json_runtime", "c": "c_library", "custom": "custom_format"}[self.codegen]
            raise BackendRegistrationError(f"backend {self.name!r} uses {self.codegen!r} codegen but sets no {attr}")
