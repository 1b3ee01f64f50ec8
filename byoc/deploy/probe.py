"""What loading and running an artifact imports and maps, with TVM's compiler not loaded.

`python -m byoc.deploy.probe ARTIFACT` loads the artifact with its engines made at load, runs it
once on zeros of its inputs' shapes (each named dimension at its `opt`), and prints, as JSON, the
files of byoc's modules it imported, the top-level names of the other modules, and the shared
libraries the process mapped. A model whose regions need a device this machine lacks (a GPU) is
loaded but not run, and says so. `probe` runs it in a fresh process with `TVM_USE_RUNTIME_LIB=1`,
so that anything that needs the compiler fails there, as it would on the target.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from byoc.errors import ByocError
from byoc.ir.dim_range import DimRange, at_opt

MARK = "byoc-deploy-probe:"  # the line of the probe's output that holds its JSON
BYOC_ROOT = Path(__file__).resolve().parents[2]  # the directory that holds the `byoc` package


@dataclass(frozen=True)
class Probe:
    byoc_files: list[str]  # relative to the directory that holds the `byoc` package
    modules: list[str]  # top-level names of the other modules imported (stdlib included)
    libraries: list[str]  # shared libraries mapped, resolved
    not_run: dict[str, str]  # vendor -> why its regions could not run here (no device): loaded only


def probe(artifact: str | os.PathLike, env: dict[str, str] | None = None) -> Probe:
    """`artifact` loaded and run once in a fresh process without TVM's compiler (see above); a
    ByocError with that process's error where it cannot."""
    run = subprocess.run([sys.executable, "-m", "byoc.deploy.probe", os.fspath(artifact)], capture_output=True, text=True,
                         env={**os.environ, **(env or {}), "TVM_USE_RUNTIME_LIB": "1"}, timeout=600)
    found = [line.removeprefix(MARK) for line in run.stdout.splitlines() if line.startswith(MARK)]
    if run.returncode != 0 or not found:
        raise ByocError(f"{os.fspath(artifact)!r} does not load and run with TVM's runtime alone: "
                        f"{(run.stderr or run.stdout).strip().splitlines()[-1] if (run.stderr or run.stdout).strip() else run.returncode}")
    return Probe(**json.loads(found[0]))


def input_shapes(manifest: dict) -> list[tuple[int, ...]]:
    """Each input's shape with every named dimension at its `opt` (an example input's)."""
    dims = {name: DimRange(*values) for name, values in manifest.get("dims", {}).items()}
    return [at_opt(spec["shape"], dims) for spec in manifest["inputs"]]


def _mapped_libraries() -> list[str]:
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if ".so" in line.split()[-1]}
    return sorted(str(Path(p).resolve()) for p in paths if os.path.exists(p))


def main(artifact: str) -> None:
    from byoc.backend.runtime import vendor_runtime
    from byoc.runtime_metadata.artifact import read_manifest
    from byoc.runtime_metadata.model import load

    manifest = read_manifest(artifact)
    # A model built here for a device this machine lacks (a GPU) is loaded, not run: what it
    # imports is known, and the libraries it would map are its vendors' to name.
    not_run = {vendor: reason for vendor in sorted({r["backend"] for r in manifest["regions"]})
               if (reason := vendor_runtime(vendor).codegen.device_missing()) is not None}
    model = load(artifact, engines="lazy" if not_run else "eager")
    if not not_run:
        model.run(*[np.zeros(shape, spec["dtype"]) for shape, spec in zip(input_shapes(manifest), manifest["inputs"])])
    byoc_files = sorted(str(Path(m.__file__).resolve().relative_to(BYOC_ROOT)) for name, m in list(sys.modules.items())
                        if (name == "byoc" or name.startswith("byoc.")) and getattr(m, "__file__", None))
    modules = sorted({name.split(".")[0] for name in sys.modules if not name.startswith("byoc")})
    print(MARK + json.dumps({"byoc_files": byoc_files, "modules": modules, "libraries": _mapped_libraries(), "not_run": not_run}))


if __name__ == "__main__":
    main(sys.argv[1])
