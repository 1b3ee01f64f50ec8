"""The compiler run that turns TVM modules with C regions into a shared library: the host library,
or a C region's variant for one shape.

TVM's own default is the first C++ compiler on the PATH for every source, C included. Generated
C compiles 1.4-2x faster as C (a quantized BERT's 2.2 MB of oneDNN calls: 3.8 s against 7.5 s),
so a library is built as C unless a region linked into it is C++ (`Codegen.source_language`).
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Iterable

import tvm
from tvm.support import cc

from byoc.backend.codegen import Codegen

_COMPILERS = {"c": ("CC", ("gcc", "cc", "clang")), "c++": ("CXX", ("g++", "c++", "clang++"))}


def compiler(language: str) -> str:
    """The compiler for `language`: $CC or $CXX where set, else the first one on the PATH (TVM
    then reports the missing compiler when it runs it)."""
    variable, names = _COMPILERS[language]
    return os.environ.get(variable) or next((name for name in names if shutil.which(name)), names[0])


def link_flags(codegens: Iterable[Codegen]) -> list[str]:
    """Every format's compiler and linker flags, each once, in order."""
    flags: list[str] = []
    for codegen in codegens:
        flags += [flag for flag in codegen.link_flags() if flag not in flags]
    return flags


def export_shared(module: tvm.runtime.Module, path: str, codegens: Iterable[Codegen]) -> None:
    """Compile `module` with its imports into the shared library `path`, for the regions of
    `codegens` linked into it."""
    codegens = list(codegens)
    language = "c++" if any(c.source_language == "c++" for c in codegens) else "c"
    module.export_library(path, fcompile=functools.partial(cc.create_shared, cc=compiler(language)), options=link_flags(codegens))
