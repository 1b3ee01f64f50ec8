"""Whether TVM's compiler is here, or only its runtime library.

The apache-tvm wheel holds both (libtvm_compiler.so, 259 MB, and libtvm_runtime.so, 3 MB). TVM
loads the runtime alone where the compiler library is absent or `TVM_USE_RUNTIME_LIB=1`; there
an artifact runs (see byoc.deploy), and whatever would generate or compile code says so before
it starts, naming what it needed.
"""

from __future__ import annotations

import functools

import tvm

# A function only the compiler library registers (the one TVM's own Relax package fails on
# first when imported without it).
_COMPILER_FUNCTION = "ir.RegisterOpAttr"


@functools.cache
def compiler_missing() -> str | None:
    """Why code cannot be compiled in this process, or None where TVM's compiler is loaded."""
    if tvm.get_global_func(_COMPILER_FUNCTION, allow_missing=True) is not None:
        return None
    return ("TVM's compiler library (libtvm_compiler.so) is not loaded in this process, only TVM's runtime; "
            "install byoc with its compiler (pip install byoc) where code must be generated")
