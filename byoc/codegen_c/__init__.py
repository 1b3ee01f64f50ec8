"""Code generation option 2: regions as C calling a vendor kernel library, linked into the host
library."""

from byoc.codegen_c.generate import generate_c_source
from byoc.codegen_c.kernel_call import C_TYPES, CBuffer, Emitter, KernelCall, KernelCode
from byoc.codegen_c.library import CLibrary

__all__ = ["C_TYPES", "CBuffer", "CLibrary", "Emitter", "KernelCall", "KernelCode", "generate_c_source"]
