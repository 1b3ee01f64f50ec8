"""Code generation option 2: regions as C calling a vendor kernel library, linked into the host
library."""

from byoc.exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "generate_c_source": "byoc.codegen_c.generate",
    **dict.fromkeys(["C_TYPES", "CBuffer", "Emitter", "KernelCall", "KernelCode"], "byoc.codegen_c.kernel_call"),
    "CLibrary": "byoc.codegen_c.library",
})

__all__ = ["C_TYPES", "CBuffer", "CLibrary", "Emitter", "KernelCall", "KernelCode", "generate_c_source"]
