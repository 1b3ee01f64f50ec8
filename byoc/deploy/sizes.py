"""The pip packages a deployment needs, and what it and a full install take on disk."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement as Specifier

from byoc.backend.builtin import BUILTIN_VENDORS
from byoc.deploy.probe import Probe

# Distributions a deployment never lists: TVM's runtime is in the folder, byoc's runtime modules
# too, and pip's own tools are only on the path because they install a site hook.
_NOT_LISTED = {"apache-tvm", "byoc", "setuptools", "pip", "wheel"}


@dataclass(frozen=True)
class Requirement:
    name: str
    version: str
    bytes: int  # as installed here


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-")


@functools.cache
def _files() -> dict[str, str]:
    """Every installed file (resolved) -> the distribution that installed it."""
    owner = {}
    for dist in metadata.distributions():
        for file in dist.files or []:
            owner[str(Path(file.locate()).resolve())] = dist.metadata["Name"]
    return owner


def _bytes(name: str) -> int:
    total = 0
    for file in metadata.distribution(name).files or []:
        path = Path(file.locate())
        if path.is_file():
            total += path.stat().st_size
    return total


def installed(name: str) -> bool:
    try:
        metadata.distribution(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def owner(path: str) -> str | None:
    """The distribution that installed the file at `path` (resolved), or None."""
    return _files().get(path)


def requirements_of(found: Probe, carried: set[str]) -> list[Requirement]:
    """The distributions whose modules or shared libraries the probe's process used, but those
    whose libraries the deployment carries, pinned to the versions here (the artifact was built
    and checked with them)."""
    by_module = metadata.packages_distributions()
    names = {dist for module in found.modules for dist in by_module.get(module, [])}
    names |= {owner(library) for library in found.libraries if owner(library) is not None}
    skipped = _NOT_LISTED | {_canonical(name) for name in carried}
    kept = {_canonical(n): n for n in names if _canonical(n) not in skipped}
    return [Requirement(name, metadata.version(name), _bytes(name)) for _, name in sorted(kept.items())]


def full_install(vendors: list[str]) -> int:
    """What byoc takes installed with its compiler and the dependencies of `vendors` (their
    extras), as installed here."""
    extras = {BUILTIN_VENDORS[v] for v in vendors if BUILTIN_VENDORS.get(v)}
    seen: set[str] = set()
    pending = [Specifier(r) for r in metadata.requires("byoc") or []]
    pending = [r for r in pending if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras)]
    while pending:
        requirement = pending.pop()
        name = _canonical(requirement.name)
        if name in seen or name == "byoc":
            continue
        try:
            dist = metadata.distribution(requirement.name)
        except metadata.PackageNotFoundError:
            continue  # not installed here: not counted
        seen.add(name)
        for text in dist.requires or []:
            nested = Specifier(text)
            if nested.marker is None or any(nested.marker.evaluate({"extra": e}) for e in requirement.extras or {""}):
                pending.append(nested)
    package = Path(__file__).resolve().parent.parent
    return sum(_bytes(name) for name in seen) + tree_bytes(package)


def tree_bytes(directory: str | os.PathLike) -> int:
    return sum(path.stat().st_size for path in Path(directory).rglob("*") if path.is_file())
