"""nvcc: a region's CUDA C++ compiled into a shared library, once per source and architecture.

The library links CUDA's runtime statically (`-cudart static`), so it needs only the driver
(libcuda) where it runs, and cuBLAS and cuDNN, which it opens itself (see `prologue`). It holds
the machine code for the architecture named and its PTX, which a newer GPU's driver compiles.
nvcc is $BYOC_NVCC, else the one on the PATH, else CUDA's default install.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from byoc.cache_dirs import library_cache_dir
from byoc.errors import BuildError

_INSTALLED = ("/usr/local/cuda/bin/nvcc", "/usr/local/cuda-13.0/bin/nvcc")


def nvcc() -> str | None:
    """The nvcc to compile with, or None where there is none."""
    given = os.environ.get("BYOC_NVCC")
    if given:
        return given
    return shutil.which("nvcc") or next((path for path in _INSTALLED if os.path.exists(path)), None)


def flags(arch: int) -> list[str]:
    return ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-cudart", "static",
            f"-gencode=arch=compute_{arch},code=[sm_{arch},compute_{arch}]", "-ldl"]


def compile_region(source: str, arch: int, where: str) -> bytes:
    """The shared library of `source` for sm_`arch` (from byoc's cache where compiled before);
    BuildError with nvcc's message where it fails, or where there is no nvcc."""
    compiler = nvcc()
    if compiler is None:
        raise BuildError(f"{where}: compiling CUDA needs nvcc (CUDA's toolkit), which is not on the PATH; set BYOC_NVCC")
    digest = hashlib.sha256((source + repr(flags(arch)) + compiler).encode()).hexdigest()[:32]
    cached = library_cache_dir() / f"cuda-{digest}.so"
    if cached.exists():
        return cached.read_bytes()
    cached.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cached.parent) as tmp:
        unit, built = Path(tmp) / "region.cu", Path(tmp) / "region.so"
        unit.write_text(source)
        run = subprocess.run([compiler, *flags(arch), "-o", str(built), str(unit)], capture_output=True, text=True)
        if run.returncode != 0:
            raise BuildError(f"{where}: nvcc failed for sm_{arch}: {(run.stderr or run.stdout).strip()[-3000:]}")
        os.replace(built, cached)  # atomic: a concurrent build reads the whole file or none
    return cached.read_bytes()
