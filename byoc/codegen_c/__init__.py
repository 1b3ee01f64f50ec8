"""Code generation option 2: regions as C calling a vendor kernel library, linked into the host
library."""

from byoc.codegen_c.generate import generate_c_source
from byoc.codegen_c.library import C_TYPES, CBuffer, CLibrary, Emitter, KernelCall, KernelCode

__all__ = ["C_TYPES", "CBuffer", "CLibrary", "Emitter", "KernelCall", "KernelCode", "generate_c_source"]
