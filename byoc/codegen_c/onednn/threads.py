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


def limit_threads() -> None:
    """Apply the requested thread limit, once per process (a no-op without one)."""
    global _applied
    with _lock:
        if _applied:
            return
        count = requested()
        if count is not None:
            ctypes.CDLL(str(_helper())).byoc_limit_threads(ctypes.c_size_t(count))
        _applied = True
