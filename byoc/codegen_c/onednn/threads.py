"""The thread limit of oneDNN's TBB runtime: `BYOC_NUM_THREADS`, else `OMP_NUM_THREADS`.

TBB takes every core unless a `tbb::global_control` says otherwise, and that is a C++ object:
its header costs 0.75 s of compilation in every region's C file (2.5 minutes over the test
suite), so a two-line C++ helper is compiled once per machine instead, into byoc's cache, and
called before the first oneDNN region of the process initialises. The limit lives as long as the
process; libdnnl resolves libtbb to the copy the helper loaded, so the limit is the one it sees.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from pathlib import Path

from byoc.codegen_c.onednn import library
from byoc.errors import BuildError

_SOURCE = """#include <oneapi/tbb/global_control.h>
extern "C" void byoc_limit_threads(size_t count) {
  static oneapi::tbb::global_control* limit = new oneapi::tbb::global_control(oneapi::tbb::global_control::max_allowed_parallelism, count);
  (void)limit;
}
"""
_lock = threading.Lock()
_applied = False


def requested() -> int | None:
    """The thread count asked for in the environment, or None (every core)."""
    for variable in ("BYOC_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(variable, "").strip()
        if value:
            try:
                count = int(value)
            except ValueError:
                raise BuildError(f"{variable}={value!r}: expected a whole number of threads") from None
            if count > 0:
                return count
    return None


def _helper() -> Path:
    lib_dirs = library.library_dirs()
    flags = ["-shared", "-fPIC", "-O1", f"-I{library.tbb_include_dir()}", *(f"-L{d}" for d in lib_dirs),
             *(f"-Wl,-rpath,{d}" for d in lib_dirs), "-ltbb"]
    return library.compiled_once("tbb-limit", _SOURCE, flags, "oneDNN's thread limit")


# oneDNN keeps up to 1,024 primitives (each with its JIT code) for shapes met before. A region with
# dynamic dimensions makes primitives for every shape it meets: at 1,000 random shapes a tiny
# BERT held 69 MiB more with 1,024 than with 128, at the same speed. byoc keeps 128 unless
# ONEDNN_PRIMITIVE_CACHE_CAPACITY says otherwise.
PRIMITIVE_CACHE_CAPACITY = 128
_cache_set = False


def limit_primitive_cache() -> None:
    """Set oneDNN's primitive cache capacity, once per process, unless the user set it."""
    global _cache_set
    with _lock:
        if _cache_set or os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "").strip():
            return
        # libdnnl has no rpath: its dependencies are loaded first, as the host library's links do
        for name in ("libintlc.so.5", "libimf.so", "libtbb.so.12", "libdnnl.so.3"):
            path = next((Path(d) / name for d in library.library_dirs() if (Path(d) / name).exists()), None)
            loaded = ctypes.CDLL(str(path) if path is not None else name, mode=ctypes.RTLD_GLOBAL)
        loaded.dnnl_set_primitive_cache_capacity(ctypes.c_int(PRIMITIVE_CACHE_CAPACITY))
        _cache_set = True


def primitive_cache_held() -> str:
    """oneDNN's primitive cache, as a profile says it: it counts primitives, not bytes."""
    given = os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "").strip()
    capacity = given if given else str(PRIMITIVE_CACHE_CAPACITY)
    return (f"at most {capacity} primitives with their JIT code, process-wide (oneDNN's cache; "
            f"{'ONEDNN_PRIMITIVE_CACHE_CAPACITY' if given else 'byoc sets it unless ONEDNN_PRIMITIVE_CACHE_CAPACITY does'})")


def limit_threads() -> None:
    """Apply the requested thread limit, once per process (a no-op without one)."""
    global _applied
    with _lock:
        if _applied:
            return
        count = requested()
        missing = library.helpers_missing() if count is not None else None
        if missing is not None:
            warnings.warn(f"byoc: oneDNN's thread limit ({count}) is not applied: its helper cannot be compiled here ({missing}); "
                          "oneDNN takes every core", stacklevel=2)
        elif count is not None:
            ctypes.CDLL(str(_helper())).byoc_limit_threads(ctypes.c_size_t(count))
        _applied = True
