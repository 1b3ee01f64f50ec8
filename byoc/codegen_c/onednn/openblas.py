"""OpenBLAS from pip (`scipy-openblas32`, the build SciPy ships): the second kernel of a float32
dense product, beside oneDNN's, where it is faster on the machine at hand (see `product_choice`).

Why a second kernel: oneDNN 3.2's float32 GEMM for AVX2 (`gemm:jit:f32`) runs BERT's 128x768 by
768x3072 dense layer at 65-95 GFLOP/s on 2 cores of an AMD EPYC without AVX-512 (and of an
AVX-512 one limited to AVX2), where OpenBLAS's Haswell kernels reach 112-170; with AVX-512,
oneDNN's brgemm is the faster one on most shapes. Which one runs is measured per machine, not
assumed.

OpenBLAS keeps a pool of threads of its own beside oneDNN's TBB workers. After a call, its
threads wait for the next one spinning, 2^28 cycles by default, and on 2 cores that spin takes a
core from the oneDNN primitive that runs next: a BERT dense layer by oneDNN then one by OpenBLAS
took 16.6 ms instead of 9.8. With `OPENBLAS_THREAD_TIMEOUT=4` (2^4 cycles, its least) they
sleep at once, and the pair takes 9.9 ms. OpenBLAS reads it when it loads, and the package loads
it as it is imported (to read its configuration), so it is set (unless the user did) before the
one import here; `prepare` loads the library before any host library links it in, and gives
OpenBLAS the thread count oneDNN has. (It was once set only in `prepare`, after the link flags
of the first region had imported the package: every dnnl model built after the first in a process
then ran its oneDNN work beside a spinning OpenBLAS thread, MaxViT at 134-189 ms instead of 83.)
"""

from __future__ import annotations

import ctypes
import functools
import os
from importlib import metadata
from pathlib import Path

from byoc import library_path

PACKAGE = "scipy-openblas32"
LIBRARY = "scipy_openblas"  # linked as -lscipy_openblas
SPIN_ENV = "OPENBLAS_THREAD_TIMEOUT"
SPIN_LEAST = "4"
# The one function a kernel calls (cblas.h's, its enums as the ints they are), declared where it is
# called rather than through the 600-line header in every region's C.
SGEMM_DECLARATION = ("void scipy_cblas_sgemm(int order, int transa, int transb, int m, int n, int k, float alpha, const float* a, "
                     "int lda, const float* b, int ldb, float beta, float* c, int ldc);")
ROW_MAJOR, NO_TRANSPOSE = 101, 111  # CblasRowMajor, CblasNoTrans


def _package() -> bool:
    try:
        metadata.distribution(PACKAGE)
        return True
    except metadata.PackageNotFoundError:
        return False


def installed() -> bool:
    return _package() or library_path.find(f"lib{LIBRARY}.so") is not None


def version() -> str:
    if not installed():
        return "not installed"
    return metadata.version(PACKAGE) if _package() else f"deployed ({library_path.VARIABLE})"


@functools.cache
def library_dir() -> str:
    """The directory of libscipy_openblas.so (the package's `get_lib_dir`, or a deployment's copy,
    see byoc.library_path)."""
    os.environ.setdefault(SPIN_ENV, SPIN_LEAST)  # importing the package loads the library (above)
    if not _package():
        return str(library_path.find(f"lib{LIBRARY}.so").parent)
    import scipy_openblas32

    return str(Path(scipy_openblas32.get_lib_dir()).resolve())


def library_dirs() -> list[str]:
    return [library_dir()] if installed() else []


def libraries() -> list[str]:
    return [LIBRARY] if installed() else []


@functools.cache
def _loaded() -> ctypes.CDLL:
    return ctypes.CDLL(str(Path(library_dir()) / f"lib{LIBRARY}.so"))


def prepare(threads: int | None) -> None:
    """Load OpenBLAS with its threads sleeping between calls, `threads` of them (None: one per
    core, as oneDNN takes). A no-op where it is not installed."""
    if not installed():
        return
    library = _loaded()
    library.scipy_openblas_set_num_threads(ctypes.c_int(threads or len(os.sched_getaffinity(0))))


def core() -> str:
    """The kernels OpenBLAS chose for this CPU ("Haswell", "SkylakeX", "Zen"; `OPENBLAS_CORETYPE`
    chooses others)."""
    if not installed():
        return "not installed"
    library = _loaded()
    library.scipy_openblas_get_corename.restype = ctypes.c_char_p
    return library.scipy_openblas_get_corename().decode()
