"""C that calls oneDNN's C API (v3): the kernel library of the `dnnl` vendor, and of any vendor whose
kernels are oneDNN primitives.

A vendor's data sheet binds its ops to the emitters here (`emitters`, `int8_elementwise` for
element-wise kernels on int8 data); each emitter describes its op with one `Kernel` (`kernel`); `library` finds
oneDNN as pip installs it and holds the C every region shares (memory conversions, descriptors with
run-time dimensions, each kernel's ownership of what it creates); `threads` limits the threads of
oneDNN's TBB runtime; `kernel_scales` reads a quantized composite's scales; `openblas` finds
OpenBLAS, which runs a float32 dense product where `product_choice` measured it faster here.
"""

from byoc.codegen_c.library import CLibrary
from byoc.codegen_c.onednn import emitters, int8_elementwise, library, openblas, product_choice, threads
from byoc.codegen_c.onednn.emitters import GELU_FORMS, LAYOUT_POLICIES, RESHAPES, VIEWS
from byoc.codegen_c.onednn.kernel import ELTWISE_OPS


def onednn_library() -> CLibrary:
    """oneDNN as a vendor's kernel library, its emitter table empty: each vendor binds its own
    ops to the emitters as it declares them."""
    return CLibrary(
        name="onednn",
        version=library.version() if library.installed() else "not installed",
        headers=["oneapi/dnnl/dnnl.h", "math.h", "stdio.h"],
        include_dirs=lambda: [library.include_dir()],
        library_dirs=lambda: [*library.library_dirs(), *openblas.library_dirs()],
        libraries=[*library.LIBRARIES, *openblas.libraries()],
        prologue=library.PROLOGUE,
        ownership=library.OWNERSHIP,
        bind_buffer=library.bind_buffer,
        views=VIEWS,
        runtime_setup=_runtime_setup,
        held=threads.primitive_cache_held,
        packages=(library.RUNTIME_PACKAGE, library.TBB_PACKAGE, library.INTEL_RUNTIME_PACKAGE, openblas.PACKAGE),
    )


def _runtime_setup() -> None:
    """oneDNN's thread limit and primitive cache, OpenBLAS (the second kernel of dense products) loaded with as many
    threads, sleeping between calls, and the question regions ask at load: which of the two runs
    each dense product on this machine."""
    threads.limit_threads()
    threads.limit_primitive_cache()
    openblas.prepare(threads.requested())
    product_choice.register_choice()


__all__ = ["ELTWISE_OPS", "GELU_FORMS", "LAYOUT_POLICIES", "RESHAPES", "VIEWS", "emitters", "library", "onednn_library", "int8_elementwise", "threads"]
