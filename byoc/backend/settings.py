"""A vendor's settings: one frozen dataclass, declared once, read typed wherever it applies.

A vendor subclasses `VendorSettings` and declares each setting with `setting(...)`: its type (the
annotation), default, doc, when it applies, and the values it takes:

    @dataclass(frozen=True)
    class NpuSettings(VendorSettings):
        lanes: int = setting(4, "vector lanes", minimum=1, hardware=True)

When it applies:
- `PARTITION`: given to `partition_for(mod, vendor, name=value)` (`--option` on the command line).
  The backend is made for the values (`Backend.configure`), and each region records them as one
  versioned attribute, so build generates its code with the settings that partitioned it.
- `BUILD`: given to `build` and `load` (`backend_options={vendor: {...}}`, `--backend-option`):
  how regions are generated and engines made on the machine that runs them.

Code generation, processing and engines get the settings object (`region.settings`,
`context.settings`, the `settings` argument of `build_engine`, `serialize`, `deserialize`) and
read attributes. A field marked `hardware` names the configuration the code is bound to
(`--target` on the command line): a custom format's blob records `hardware()`, and loading it
where a different one is given is refused.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from byoc.backend.options import Option, parse_bool
from byoc.errors import ByocError, OptionError

PARTITION = "partition"
BUILD = "build"
WHEN = {PARTITION: "partition", BUILD: "build and load"}
_KEY = "byoc"  # of a field's metadata

S = TypeVar("S", bound="VendorSettings")


@dataclass(frozen=True)
class SettingSpec:
    doc: str
    applies: tuple[str, ...]
    choices: tuple[Any, ...] = ()
    parse: Callable[[str], Any] | None = None
    minimum: float | None = None
    hardware: bool = False


def setting(default: Any, doc: str, *, applies: str | tuple[str, ...] = PARTITION, choices: tuple[Any, ...] = (),
            parse: Callable[[str], Any] | None = None, minimum: float | None = None, hardware: bool = False) -> Any:
    """One setting of a `VendorSettings` dataclass. `parse` reads it from the command line's text
    (by default, by its type); `choices` and `minimum` bound its values."""
    applies = (applies,) if isinstance(applies, str) else tuple(applies)
    unknown = set(applies) - set(WHEN)
    if unknown or not applies:
        raise ValueError(f"a setting applies at {PARTITION!r}, {BUILD!r} or both, not {sorted(unknown) or 'nowhere'}")
    return dataclasses.field(default=default, metadata={_KEY: SettingSpec(doc, applies, tuple(choices), parse, minimum, hardware)})


_PARSERS: dict[type, Callable[[str], Any]] = {bool: parse_bool, int: int, float: float, str: str}


@dataclass(frozen=True)
class Declared:
    """One setting as its dataclass declares it."""

    name: str
    types: tuple[type, ...]  # the values it takes (NoneType among them when it may be None)
    default: Any
    spec: SettingSpec

    def check(self, vendor: str, value: Any, error: type[ByocError]) -> Any:
        """`value`, converted where exact (an int for a float), or an `error` naming the vendor,
        the setting, the value and what it takes."""
        if float in self.types and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not any(isinstance(value, t) and not (t is int and isinstance(value, bool)) for t in self.types):
            raise error(f"vendor {vendor!r}: setting {self.name}={value!r} must be {self.takes()}")
        if self.spec.choices and value not in self.spec.choices:
            raise error(f"vendor {vendor!r}: setting {self.name}={value!r} is not one of {', '.join(map(str, self.spec.choices))}")
        if self.spec.minimum is not None and value is not None and value < self.spec.minimum:
            raise error(f"vendor {vendor!r}: setting {self.name}={value!r} must be at least {self.spec.minimum}")
        return value

    def takes(self) -> str:
        return " or ".join("None" if t is type(None) else t.__name__ for t in self.types)

    def option(self) -> Option:
        """How the command line, `byoc vendors` and the data sheet show it."""
        named = [t for t in self.types if t is not type(None)]
        by_type = _PARSERS.get(named[0], str) if len(named) == 1 else str  # a union of types is read as text
        return Option(self.name, self.spec.doc, self.default, self.spec.parse or by_type, tuple(map(str, self.spec.choices)),
                      self.spec.hardware)


@dataclass(frozen=True)
class VendorSettings:
    """The settings of a vendor with none; vendors subclass it (see the module's doc)."""

    # Raised when the dataclass changes incompatibly: a region recorded with a later version is
    # refused with a message, not read wrongly.
    settings_version: ClassVar[int] = 1

    @classmethod
    def declared(cls, applies: str | None = None) -> list[Declared]:
        hints = typing.get_type_hints(cls)
        found = []
        for f in dataclasses.fields(cls):
            spec = f.metadata.get(_KEY)
            if spec is None:
                raise TypeError(f"{cls.__name__}.{f.name} is not declared with byoc.setting(...)")
            if applies is None or applies in spec.applies:
                found.append(Declared(f.name, _types(hints[f.name]), f.default, spec))
        return found

    @classmethod
    def options(cls, applies: str) -> list[Option]:
        return [d.option() for d in cls.declared(applies)]

    def replaced(self: S, vendor: str, values: Mapping[str, Any], applies: str, error: type[ByocError] = OptionError) -> S:
        """These settings with `values` (settings that apply at `applies`), each checked."""
        return dataclasses.replace(self, **self.checked(vendor, values, applies, error)) if values else self

    @classmethod
    def checked(cls, vendor: str, values: Mapping[str, Any], applies: str, error: type[ByocError] = OptionError) -> dict[str, Any]:
        known = {d.name: d for d in cls.declared(applies)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            takes = f"it takes {', '.join(sorted(known))}" if known else "it takes none"
            what = "build option" if applies == BUILD else "partition option"
            raise error(f"vendor {vendor!r} has no {what} {', '.join(map(repr, unknown))}; {takes} (see `byoc vendors`)")
        return {name: known[name].check(vendor, value, error) for name, value in values.items()}

    def values(self, applies: str | None = None) -> dict[str, Any]:
        return {d.name: getattr(self, d.name) for d in self.declared(applies)}

    def changed(self) -> dict[str, Any]:
        """The values that differ from the dataclass's defaults (what a cache key must cover)."""
        return {d.name: getattr(self, d.name) for d in self.declared() if getattr(self, d.name) != d.default}

    def hardware(self) -> str:
        """The configuration code made with these settings is bound to ("" when none): the
        values of the settings marked `hardware`. A vendor may name it otherwise (a family
        resolved to its largest size)."""
        return "-".join(str(getattr(self, d.name)) for d in self.declared() if d.spec.hardware and getattr(self, d.name) is not None)

    def record(self, vendor: str) -> dict[str, Any]:
        """What a region records of these settings (its attribute, the artifact's manifest)."""
        return {"vendor": vendor, "version": self.settings_version, "values": self.values()}

    def to_json(self, vendor: str) -> str:
        return json.dumps(self.record(vendor), sort_keys=True)

    @classmethod
    def from_json(cls: type[S], vendor: str, text: str, error: type[ByocError] = OptionError) -> S:
        try:
            record = json.loads(text)
        except ValueError as failure:
            raise error(f"vendor {vendor!r}: the region's recorded settings are unreadable ({failure}): partition the model again") from None
        return cls.from_record(vendor, record, error)

    @classmethod
    def from_record(cls: type[S], vendor: str, record: Any, error: type[ByocError] = OptionError) -> S:
        """The settings a region recorded; a record of another vendor or a later version, or a
        value the dataclass no longer takes, is an `error` that says how to recover."""
        try:
            recorded_vendor, version, values = record["vendor"], record["version"], dict(record["values"])
        except (KeyError, TypeError, ValueError) as failure:
            raise error(f"vendor {vendor!r}: the region's recorded settings are unreadable ({failure!r}): partition the model again") from None
        if recorded_vendor != vendor:
            raise error(f"vendor {vendor!r}: the region records the settings of {recorded_vendor!r}")
        if version > cls.settings_version:
            raise error(f"vendor {vendor!r}: the region was partitioned with settings of version {version}, and this "
                        f"{vendor} reads version {cls.settings_version} and earlier: upgrade it, or partition the model again")
        known = {d.name for d in cls.declared()}
        return cls().replaced(vendor, {k: v for k, v in values.items() if k in known}, None, error)


def _types(hint: Any) -> tuple[type, ...]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return tuple(_types(arg)[0] for arg in typing.get_args(hint))
    if typing.get_origin(hint) is not None:
        return (typing.get_origin(hint),)
    return (hint,)


__all__ = ["BUILD", "PARTITION", "Declared", "VendorSettings", "parse_bool", "setting"]
