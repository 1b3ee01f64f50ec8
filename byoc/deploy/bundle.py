"""Writing a deployment folder (see byoc.deploy)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import tvm

from byoc import library_path
from byoc.backend.runtime import vendor_runtime
from byoc.deploy.probe import BYOC_ROOT, Probe, probe
from byoc.deploy.sizes import Requirement, full_install, installed, owner, requirements_of, tree_bytes
from byoc.errors import ByocError
from byoc.runtime_metadata.artifact import read_manifest

ARTIFACT = "model.byoc"
RUNTIME = "runtime"  # the folder the loader puts on the path: tvm and byoc's runtime modules
LIBRARIES = "libs"  # the vendors' shared libraries (see byoc.library_path)
LOADER = "load.py"
# Two lines: the folder's runtime first on the path, only TVM's runtime library loaded (a
# compiler found elsewhere on the machine is not used), the vendors' libraries found in the
# folder; then the model.
LOADER_SOURCE = (f"import os, sys; here = os.path.dirname(os.path.abspath(__file__)); sys.path.insert(0, os.path.join(here, '{RUNTIME}')); "
                 f"os.environ.update(TVM_USE_RUNTIME_LIB='1', {library_path.VARIABLE}=os.path.join(here, '{LIBRARIES}'))\n"
                 f"import byoc; model = byoc.load(os.path.join(here, '{ARTIFACT}'))\n")
# What of TVM's Python package a run does not read: the compiler library, headers, sources and
# build files.
_TVM_LEFT_OUT = ("libtvm_compiler.so", "include", "src", "3rdparty", "cmake", "lib64", "__pycache__")


@dataclass(frozen=True)
class Deployment:
    """What `deploy` wrote and how big it is (bytes)."""

    directory: str
    embedded: list[str]  # regions whose engines were embedded for it
    requirements: list[Requirement]
    not_run: dict[str, str]  # vendor -> why its regions did not run here (their device is the target's)
    target_packages: list[str]  # what the vendors' code loads on the target and this machine has not
    folder_bytes: int
    requirements_bytes: int  # the requirements as installed here
    full_install_bytes: int  # byoc, TVM with its compiler, and their dependencies for these vendors, as installed here

    @property
    def total_bytes(self) -> int:
        return self.folder_bytes + self.requirements_bytes

    def summary(self) -> str:
        mib = 2**20
        lines = [f"wrote {self.directory}: {ARTIFACT}, {RUNTIME}/ (TVM's runtime and byoc's runtime modules), {LIBRARIES}/ (the vendors' "
                 f"libraries), requirements.txt, {LOADER}",
                 f"  engines embedded for a run without the compiler: {', '.join(self.embedded) or 'none needed'}",
                 *(f"  {vendor}'s regions were loaded, not run, here ({reason}): the target runs them" for vendor, reason in self.not_run.items()),
                 *([f"  for the target to install besides (not on this machine, so not pinned): {' '.join(self.target_packages)}"]
                   if self.target_packages else []),
                 f"  on disk: the folder {self.folder_bytes / mib:.1f} MiB + its requirements {self.requirements_bytes / mib:.1f} MiB "
                 f"= {self.total_bytes / mib:.1f} MiB, against {self.full_install_bytes / mib:.1f} MiB for a full install "
                 f"({self.total_bytes / self.full_install_bytes:.2f} of it)",
                 f"  on the target: pip install -r requirements.txt; then in Python: from load import model (see {LOADER})"]
        return "\n".join(lines)


def deploy(artifact: str | os.PathLike, directory: str | os.PathLike) -> Deployment:
    """Write the deployment folder of `artifact` into `directory` (see byoc.deploy). A ByocError
    where the artifact cannot run without the compiler even with its engines embedded (a
    region of dynamic dimensions)."""
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        raise ByocError(f"{os.fspath(directory)!r} is not empty: deploy writes a folder of its own")
    directory.mkdir(parents=True, exist_ok=True)
    embedded = _artifact(Path(artifact), directory / ARTIFACT)
    found = probe(directory / ARTIFACT)
    vendors = sorted(read_manifest(directory / ARTIFACT)["vendors"])
    runtime = directory / RUNTIME
    _copy_tvm(runtime / "tvm")
    _copy_byoc(found, runtime)
    carried = _copy_libraries(found, vendors, directory / LIBRARIES)
    requirements = requirements_of(found, carried)
    elsewhere = sorted(name for name in carried if not installed(name))
    (directory / "requirements.txt").write_text("".join(f"{r.name}=={r.version}\n" for r in requirements)
                                                + ("# the vendors' libraries, not installed where this was deployed:\n" if elsewhere else "")
                                                + "".join(f"{name}\n" for name in elsewhere))
    (directory / LOADER).write_text(LOADER_SOURCE)
    deployment = Deployment(str(directory), embedded, requirements, found.not_run, elsewhere, tree_bytes(directory),
                            sum(r.bytes for r in requirements), full_install(vendors))
    (directory / "deployment.json").write_text(json.dumps({**asdict(deployment), "python": sys.version.split()[0],
                                                           "tvm": tvm.__version__, "byoc": metadata.version("byoc")}, indent=1))
    return deployment


def _artifact(source: Path, target: Path) -> list[str]:
    """The artifact copied to `target` (its signature kept), or exported again with the engines a
    run without the compiler must read from it embedded (their regions' symbols). A region of
    dynamic dimensions cannot be: a ByocError says why."""
    from byoc.runtime_metadata.model import dispatched_per_shape, engines_built_here, load

    model = load(source)
    per_shape = dispatched_per_shape(model.parts)
    if per_shape:
        raise ByocError(f"{os.fspath(source)!r} cannot run without byoc's compiler: {'; '.join(per_shape)}")
    runtimes = {a.backend: vendor_runtime(a.backend) for a in model.parts.artifacts}
    needs = [a.symbol for a in engines_built_here(model.parts, runtimes)]
    if not needs:
        shutil.copyfile(source, target)
        return []
    model.embed_engines()
    model.export(target)
    return sorted(needs)


def _copy_libraries(found: Probe, vendors: list[str], target: Path) -> set[str]:
    """The shared libraries the probe mapped from the distributions the vendors' code formats
    name (`Codegen.runtime_packages`), copied into `target`; returns those distributions."""
    packages = {name for vendor in vendors for name in vendor_runtime(vendor).codegen.runtime_packages()}
    target.mkdir()
    for library in found.libraries:
        if owner(library) in packages:
            shutil.copyfile(library, target / Path(library).name)
    return packages


def _copy_tvm(target: Path) -> None:
    """TVM's Python package and its runtime libraries, without the compiler."""
    source = Path(tvm.__file__).resolve().parent
    shutil.copytree(source, target, ignore=lambda _, names: [n for n in names if n in _TVM_LEFT_OUT or n.endswith(".pyc")])


def _copy_byoc(found: Probe, runtime: Path) -> None:
    """The modules of byoc the probe imported, and the data files of their packages."""
    packages = set()
    for relative in found.byoc_files:
        (runtime / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(BYOC_ROOT / relative, runtime / relative)
        packages.add(Path(relative).parent)
    for package in packages:
        for data in (BYOC_ROOT / package).glob("*.json"):
            shutil.copyfile(data, runtime / package / data.name)
    missing = [str(p / "__init__.py") for p in packages if not (runtime / p / "__init__.py").exists()]
    if missing:
        raise ByocError(f"byoc's packages {missing} were not imported by the probe; byoc is not installed as a package here")

