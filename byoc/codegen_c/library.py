"""What a vendor that takes C gives byoc: its kernel library and a table of op emitters.

The C generator groups a region's JSON graph into kernels (a composite, or a single op), gives
each kernel its input and output buffers, and asks the emitter registered for the kernel's
pattern or op for three pieces of C: file-scope state, code run once at initialisation (when
constants and intermediate buffers exist, e.g. to create primitives or reorder weights), and code
run per call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from byoc.backend.codegen import Codegen, RegionCode, RegionSource
from byoc.codegen_c.generate import generate_c_source
from byoc.codegen_c.kernel_call import CBuffer, Emitter, KernelCode


@dataclass
class CLibrary(Codegen):
    """A kernel library: how to compile against it and how to emit calls into it. Its regions
    are C linked into the host library: the host calls them directly, with no engine."""

    kind: ClassVar[str] = "c"
    extension: ClassVar[str] = "c"
    links_into_host: ClassVar[bool] = True

    name: str
    version: str
    # By pattern name (without backend prefix) or op name; a backend's `pattern` and `supports`
    # bind them as they declare what the backend takes (`emit=`).
    emitters: dict[str, Emitter] = field(default_factory=dict)
    headers: Sequence[str] = ()
    include_dirs: Callable[[], Sequence[str]] = lambda: ()
    library_dirs: Callable[[], Sequence[str]] = lambda: ()
    libraries: Sequence[str] = ()
    prologue: str = ""  # C helpers shared by the emitters of this library
    # "c++" where the emitters or the prologue write C++ (the source is then compiled as C++).
    language: str = "c"
    extra_flags: Sequence[str] = field(default_factory=list)
    # Per-buffer code of the library (e.g. a memory object per tensor): its init runs before the
    # kernels' for inputs, outputs and constants, after allocation for intermediates; its run
    # code at the start of every call.
    bind_buffer: Callable[[CBuffer], KernelCode] | None = None
    # Ops whose kernel may make its result a view of its first input's data rather than a copy (a
    # reshape of data in plain layout): that input's memory is then kept for as long as the
    # result is read.
    views: Sequence[str] = ()
    # Called before a host library with regions of this library initialises them, at least once
    # per process (process-wide settings of the library: its thread limit).
    runtime_setup: Callable[[], None] | None = None
    # What the library keeps for the shapes met, process-wide, as a profile says it (oneDNN's
    # primitive cache), where it keeps anything.
    held: Callable[[], str] | None = None
    # For regions with symbolic shapes (byoc.codegen_c.symbolic_shapes), C that makes every object the
    # library's creation functions make owned by `byoc_arena_now` (a `byoc_arena*`, NULL:
    # owned by nobody, kept for the process) and defines `void byoc_release(byoc_arena*)`, which
    # destroys an arena's objects: a kernel's primitives are released and made again when the
    # dimensions it reads change. A library without it is generated per shape.
    ownership: str = ""
    # The pip distributions whose libraries its regions load (see `Codegen.runtime_packages`).
    packages: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.language not in ("c", "c++"):
            raise ValueError(f"kernel library {self.name!r}: language must be 'c' or 'c++', got {self.language!r}")

    @property
    def library_version(self) -> str:
        return self.version

    @property
    def source_language(self) -> str:
        return self.language

    def generate(self, region: RegionSource) -> RegionCode:
        source = generate_c_source(region.graph, self, region.constants, region.settings)
        return RegionCode(source.encode(), "c", tuple(region.constants))

    def runtime_packages(self) -> tuple[str, ...]:
        return tuple(self.packages)

    def bind(self, name: str, emitter: Emitter) -> None:
        self.emitters[name] = emitter

    def prepare_runtime(self) -> None:
        if self.runtime_setup is not None:
            self.runtime_setup()

    def link_flags(self) -> list[str]:
        flags = [f"-I{d}" for d in self.include_dirs()]
        for directory in self.library_dirs():
            flags += [f"-L{directory}", f"-Wl,-rpath,{directory}"]
        # TVM puts these options before the object files; with the linker's --as-needed default
        # the libraries would then be dropped as unused.
        if self.libraries:
            flags += ["-Wl,--no-as-needed", *(f"-l{lib}" for lib in self.libraries)]
        return flags + list(self.extra_flags)

    def emitter_for(self, pattern: str | None, op: str) -> Emitter | None:
        if pattern is not None and pattern in self.emitters:
            return self.emitters[pattern]
        return self.emitters.get(op)
