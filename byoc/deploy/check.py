"""A deployment folder checked as a target would run it: its requirements alone on the path (linked
from this environment, as `pip install -r requirements.txt` would install them), its loader, and
no TVM compiler anywhere the process can find one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import numpy as np

from byoc.deploy.bundle import ARTIFACT, LIBRARIES
from byoc.deploy.probe import input_shapes
from byoc.errors import ByocError
from byoc.runtime_metadata.artifact import read_manifest

# Run in the target's process: the loader, one run, its outputs and what the process mapped.
_TARGET_RUN = """
import json, sys, time, numpy as np
start = time.perf_counter()
{load}
inputs = np.load(sys.argv[1])
outputs = model.run(*[inputs[f"i{{k}}"] for k in range(len(inputs.files))])
seconds = time.perf_counter() - start
np.savez(sys.argv[2], *outputs)
import tvm
maps = open("/proc/self/maps").read()
print("byoc-deploy-check:" + json.dumps({{"seconds": seconds, "tvm": tvm.__file__, "compiler": "libtvm_compiler" in maps,
                                          "libraries": sorted({{line.split()[-1] for line in maps.splitlines() if ".so" in line}})}}))
"""
_LOADED = "from load import model"  # the folder's loader (bundle.LOADER)
_FULL = "import byoc; model = byoc.load(sys.argv[3])"


@dataclass(frozen=True)
class CheckResult:
    max_difference: float  # between the target's outputs and a full install's, on the same inputs
    seconds: float  # the target's load and first run, in a fresh process
    full_install_seconds: float  # the same in a fresh process of this environment
    tvm: str  # where the target's TVM came from
    compiler_loaded: bool
    carried_libraries: list[str]  # the vendors' libraries the target mapped, each from the folder
    inputs: list[np.ndarray] = field(default_factory=list, repr=False)
    outputs: list[np.ndarray] = field(default_factory=list, repr=False)  # the target's


def _inputs(directory: Path) -> list[np.ndarray]:
    manifest = read_manifest(directory / ARTIFACT)
    rng = np.random.default_rng(0)
    arrays = []
    for shape, spec in zip(input_shapes(manifest), manifest["inputs"]):
        dtype = np.dtype(spec["dtype"])
        arrays.append(rng.standard_normal(shape).astype(dtype) if dtype.kind == "f" else np.zeros(shape, dtype))
    return arrays


def _site(directory: Path, target: Path) -> Path:
    """A site-packages holding only the folder's requirements, each linked from here, files that
    install beside it (a library in <prefix>/lib) included."""
    here = Path(sysconfig.get_paths()["purelib"])
    site = target / here.relative_to(sys.prefix)  # as deep below its prefix as here: files beside it land alike
    site.mkdir(parents=True)
    names = [line.split("==")[0] for line in (directory / "requirements.txt").read_text().split()]
    for name in names:
        for file in metadata.distribution(name).files or []:
            parts = Path(file).parts
            top = Path(*parts[:parts.count("..") + 1])
            link = site / top
            if not link.exists() and not link.is_symlink():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(here / top)
    return site


def _run(code: str, argv: list[str], cwd: Path, env: dict[str, str], python_flags: list[str]) -> dict:
    run = subprocess.run([sys.executable, *python_flags, "-c", code, *argv], capture_output=True, text=True, cwd=cwd, env=env,
                         timeout=600)
    found = [line.split(":", 1)[1] for line in run.stdout.splitlines() if line.startswith("byoc-deploy-check:")]
    if run.returncode != 0 or not found:
        raise ByocError(f"the deployment does not run: {(run.stderr or run.stdout).strip()[-1500:]}")
    return json.loads(found[0])


def check(directory: str | os.PathLike) -> CheckResult:
    """Run the deployment in `directory` as a target would (see above), and a full install on the
    same inputs; a ByocError where the deployment does not run."""
    directory = Path(directory)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        site = _site(directory, tmp / "target")
        inputs = _inputs(directory)
        np.savez(tmp / "inputs.npz", **{f"i{k}": a for k, a in enumerate(inputs)})
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TVM_"))}
        target = _run(_TARGET_RUN.format(load=_LOADED), [str(tmp / "inputs.npz"), str(tmp / "target.npz")], directory,
                      {**base, "PYTHONPATH": str(site)}, ["-S"])
        full = _run(_TARGET_RUN.format(load=_FULL), [str(tmp / "inputs.npz"), str(tmp / "full.npz"), str(directory / ARTIFACT)],
                    tmp, base, [])
        got, want = np.load(tmp / "target.npz"), np.load(tmp / "full.npz")
        difference = max((float(np.max(np.abs(got[k].astype(np.float64) - want[k]))) if got[k].size else 0.0) for k in got.files)
        outputs = [got[f"arr_{k}"] for k in range(len(got.files))]
    folder = str(directory.resolve())
    if not target["tvm"].startswith(folder):
        raise ByocError(f"the deployment ran TVM from {target['tvm']}, not from its folder")
    carried = {path.name for path in (directory / LIBRARIES).iterdir()}
    elsewhere = [path for path in target["libraries"] if Path(path).name in carried and not path.startswith(folder)]
    if elsewhere:
        raise ByocError(f"the deployment loaded {elsewhere} from outside its folder, which carries them")
    mapped = sorted(Path(path).name for path in target["libraries"] if path.startswith(folder) and Path(path).name in carried)
    return CheckResult(difference, target["seconds"], full["seconds"], target["tvm"], target["compiler"], mapped, inputs, outputs)

