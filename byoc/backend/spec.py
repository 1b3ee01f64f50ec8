"""The backend specification: what a vendor writes to describe its hardware.

A backend names the op patterns it executes as one instruction (paper section 3.1.1), the single
ops it accepts and under which conditions (3.1.2), its hardware-wide limits, its cost rules for
splitting regions (3.1.3), a priority for when several backends accept an op, and how its
regions are handed over: a JSON graph, C source, or a custom binary format (3.3).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm.relax import dpl
from tvm.relax.dpl import DFPattern

from byoc.backend.codegen import Codegen
from byoc.backend.cost import CostRules
from byoc.backend.limits import Limits
from byoc.backend.op_rules import OpCheck, OpRule
from byoc.backend.options import Option
from byoc.backend.region_pass import RegionPass
from byoc.backend.runtime import VendorRuntime
from byoc.backend.settings import BUILD, PARTITION, VendorSettings
from byoc.backend.tolerance import FP32, Tolerance
from byoc.backend.verdict import Verdict
from byoc.backend.views import PatternMatch
from byoc.errors import BackendRegistrationError, PartitionError

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
    # How regions are handed over (see byoc.backend.codegen): a JsonRuntime, CLibrary or
    # CustomFormat. It may be set after the backend is made, before it is registered.
    codegen: Codegen | None = None
    priority: int = 0
    limits: Limits = field(default_factory=Limits)
    cost: CostRules = field(default_factory=CostRules)
    description: str = ""
    patterns: list[Pattern] = field(default_factory=list)
    op_rules: dict[str, OpRule] = field(default_factory=dict)
    # Accelerator-specific processing of each region's graph before code generation
    # (quantization, layout transformation, casting): see byoc.processing.
    processing: list[RegionPass] = field(default_factory=list)
    # The vendor's settings (a `VendorSettings` dataclass, byoc.backend.settings): the values this
    # backend is made for, its defaults as registered. Partitioning makes the backend for the
    # values a user gives (`configured`) and records them on each region; build makes it again
    # from that record, so the backend that partitioned a region generates its code.
    settings: VendorSettings = field(default_factory=VendorSettings)
    # Where the backend's own parts (limits, op rules, cost rules) depend on its settings, the
    # function that makes it for given settings; without one, settings only reach its code
    # generation and engines.
    configure: Callable[[Any], Backend] | None = None
    # How close its results are to float32 onnxruntime's (see byoc.backend.tolerance).
    tolerance: Tolerance = FP32
    # Whether its engines take a region's shapes symbolically (a JSON graph whose dimensions are
    # expressions over the model's named ones, see byoc.codegen_json.symbolic_dims): a model with dynamic
    # dimensions then gets one engine per region for every shape in range, rather than one per
    # shape. A region the vendor cannot take so is generated per shape, as for other backends.
    symbolic_shapes: bool = False
    # Why the vendor's library or device is missing on this machine, or None when it is here.
    # Partitioning and reports work without it; building a region for it, or loading an artifact
    # with such regions, is refused with the reason.
    unavailable: Callable[[], str | None] | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise BackendRegistrationError(
                f"backend name {self.name!r} must be lower-case letters, digits and '_', starting with a letter"
            )
        if self.codegen is not None:
            self._check_codegen()
        if not isinstance(self.settings, VendorSettings):
            raise BackendRegistrationError(f"backend {self.name!r}: settings must be a byoc.VendorSettings dataclass, "
                                           f"not {type(self.settings).__name__}")
        try:
            self.settings.declared()
        except TypeError as error:
            raise BackendRegistrationError(f"backend {self.name!r}: {error}") from None

    @property
    def runtime(self) -> VendorRuntime:
        """What running this backend's regions needs of it (see byoc.backend.runtime)."""
        return VendorRuntime(self.name, self.codegen, self.settings, self.unavailable)

    def missing_part(self) -> str | None:
        """Why this vendor cannot build regions on this machine, or None when it can."""
        return self.runtime.missing_part()

    def library_version(self) -> str:
        """The version of what generates and runs this backend's code (its runtime library, C
        kernel library or binary format): engine caches, artifacts and timings depend on it."""
        return self.codegen.library_version

    def configured(self, values: Mapping[str, Any]) -> Backend:
        """This backend made for the partition settings `values` (others keep this backend's);
        without values, the backend itself. A value of the wrong type or outside what it takes
        is a PartitionError naming the vendor, the setting and what it takes."""
        return self.with_settings(self.settings.replaced(self.name, values, PARTITION, PartitionError)) if values else self

    def with_settings(self, settings: VendorSettings) -> Backend:
        """This backend made for `settings` (of its own settings type)."""
        if settings == self.settings:
            return self
        if type(settings) is not type(self.settings):
            raise BackendRegistrationError(f"backend {self.name!r} takes {type(self.settings).__name__}, not {type(settings).__name__}")
        if self.configure is None:
            return dataclasses.replace(self, settings=settings)
        # `configure` may complete the settings it is given (TensorRT records the version it resolved)
        backend = self.configure(settings)
        if not isinstance(backend, Backend) or backend.name != self.name or type(backend.settings) is not type(settings):
            raise BackendRegistrationError(f"backend {self.name!r}: configure() must return a Backend named {self.name!r} "
                                           f"with its {type(settings).__name__}")
        return backend

    def build_settings(self, values: Mapping[str, Any]) -> VendorSettings:
        """Its settings with the build and load settings `values` (checked: an unknown name or a
        value it does not take is an OptionError naming the vendor and what it takes)."""
        return self.settings.replaced(self.name, values, BUILD)

    def checked_build_options(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """`values` checked as build and load settings, as `build_settings` checks them."""
        return self.runtime.checked_build_options(values)

    def build_option(self, name: str) -> Option:
        """The build and load setting `name` as the command line reads it; an unknown one is an
        OptionError, as above."""
        options = {o.name: o for o in self.settings.options(BUILD)}
        if name not in options:
            type(self.settings).checked(self.name, {name: None}, BUILD)  # raises, naming what it takes
        return options[name]

    # --------------------------------------------------------------- patterns
    def pattern(
        self,
        name: str,
        pattern: DFPattern,
        annotations: Mapping[str, DFPattern] | None = None,
        check: PatternCheck | None = None,
        emit: Callable | None = None,
    ) -> Pattern:
        """Declare a composite; patterns declared first are tried first. `emit` is the C
        emitter of the composite (backends whose codegen is a CLibrary)."""
        if any(p.name == name for p in self.patterns):
            raise BackendRegistrationError(f"backend {self.name!r} declares pattern {name!r} twice")
        declared = Pattern(name, pattern, dict(annotations or {}), check)
        self.patterns.append(declared)
        if emit is not None:
            self._bind(name, emit)
        return declared

    # -------------------------------------------------------------- op rules
    def supports(self, *ops: str, check: OpCheck | None = None, emit: Callable | None = None) -> None:
        """Declare single ops this backend accepts, all under one optional predicate, and (for
        a CLibrary codegen) the C emitter that writes them."""
        for op in ops:
            self.op_rules[op] = OpRule(op, check)
            if emit is not None:
                self._bind(op, emit)

    def op(self, *ops: str, emit: Callable | None = None) -> Callable[[OpCheck], OpCheck]:
        """Decorator form of `supports`: the decorated function is the ops' predicate."""

        def register(check: OpCheck) -> OpCheck:
            self.supports(*ops, check=check, emit=emit)
            return check

        return register

    def _bind(self, name: str, emit: Callable) -> None:
        bind = getattr(self.codegen, "bind", None)
        if bind is None:
            raise BackendRegistrationError(f"backend {self.name!r}: {name!r} is given an emitter, but emitters are for a "
                                           f"CLibrary codegen (this backend's is {type(self.codegen).__name__})")
        bind(name, emit)

    def rules(self) -> dict[str, OpRule]:
        """The single ops this backend accepts, by op name."""
        return dict(self.op_rules)

    # -------------------------------------------------------------- codegen
    def validate_codegen(self) -> None:
        """Raise unless this backend has a code format and, where the format writes each kernel
        with an emitter (a CLibrary), an emitter for every pattern and op it claims: a claim
        without one would fail only when a model first reaches it, at code generation."""
        if self.codegen is None:
            raise BackendRegistrationError(f"backend {self.name!r} sets no codegen: give it a JsonRuntime, CLibrary or CustomFormat")
        self._check_codegen()
        emitter_for = getattr(self.codegen, "emitter_for", None)
        if emitter_for is None:
            return
        # A composite without an emitter of its own is written by the emitter of the op it starts
        # with (`CLibrary.emitter_for`), where that op is one.
        missing = [f"pattern {p.name!r}" for p in self.patterns
                   if emitter_for(p.name, "") is None and not _one_first_op(p.pattern, lambda op: emitter_for(None, op) is not None)]
        missing += [f"op {op}" for op in self.op_rules if emitter_for(None, op) is None]
        if missing:
            raise BackendRegistrationError(f"backend {self.name!r} claims {', '.join(missing)} with no C emitter to write it: give "
                                           "each its emitter where it is declared (`emit=`), or in its CLibrary's `emitters`")

    def _check_codegen(self) -> None:
        if not isinstance(self.codegen, Codegen):
            raise BackendRegistrationError(
                f"backend {self.name!r}: codegen must be a code format object (JsonRuntime, CLibrary or CustomFormat from "
                f"byoc.codegen_json, byoc.codegen_c, byoc.custom_formats), not {self.codegen!r}")


def _first_ops(pattern: DFPattern) -> set[str]:
    """The ops a match of `pattern` can start with: those of its calls whose operands hold no
    call (wildcards, constants)."""
    if isinstance(pattern, dpl.CallPattern):
        inner = set().union(*(_first_ops(arg) for arg in pattern.args)) if pattern.args else set()
        if inner:
            return inner
        op = pattern.op.expr if isinstance(pattern.op, dpl.ExprPattern) else None
        return {op.name} if isinstance(op, tvm.ir.Op) else set()
    if isinstance(pattern, (dpl.OrPattern, dpl.AndPattern)):
        return _first_ops(pattern.left) | _first_ops(pattern.right)
    if isinstance(pattern, dpl.TuplePattern):
        return set().union(*(_first_ops(field) for field in pattern.fields)) if pattern.fields else set()
    if isinstance(pattern, dpl.TupleGetItemPattern):
        return _first_ops(pattern.tuple)
    inner = getattr(pattern, "pattern", None)  # attribute, type, shape and dtype constraints
    return _first_ops(inner) if isinstance(inner, DFPattern) else set()


def _one_first_op(pattern: DFPattern, emitted: Callable[[str], bool]) -> bool:
    """Whether every match of `pattern` starts with one op, and that op has an emitter."""
    ops = _first_ops(pattern)
    return len(ops) == 1 and emitted(next(iter(ops)))
