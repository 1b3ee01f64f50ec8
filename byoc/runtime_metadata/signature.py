"""The host library's description of itself: the model's inputs and outputs and every region
its code calls, compiled into the library as data.

A manifest can be rewritten by a buggy tool; the host code cannot lie about what it calls. When
a model is made from its parts, the parts must agree with the library's own description, so
that an artifact whose manifest lost a region or changed an input's shape is refused when it is
loaded, not when the host code meets the difference.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Sequence

import tvm

from byoc.errors import ArtifactError
from byoc.runtime_metadata.artifact_types import RegionArtifact, TensorSpec

FUNCTION = "byoc_model_signature"


def signature(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec], artifacts: Sequence[RegionArtifact]) -> dict:
    return {
        "inputs": [[s.name, list(s.shape), s.dtype] for s in inputs],
        "outputs": [[list(s.shape), s.dtype] for s in outputs],
        "regions": {a.symbol: [a.codegen, [[list(s.shape), s.dtype] for s in a.inputs], [[list(s.shape), s.dtype] for s in a.outputs]]
                    for a in artifacts},
    }


def signature_module(description: dict) -> tvm.runtime.Module:
    """A C module exporting `byoc_model_signature`, which returns the description as JSON text.
    The text is a byte array: C string escapes differ from JSON's."""
    text = json.dumps(description, sort_keys=True).encode()
    data = ", ".join(str(b) for b in [*text, 0])
    code = f"""#include <tvm/ffi/c_api.h>
static const char byoc_signature[] = {{{data}}};
#ifdef __cplusplus
extern "C" {{
#endif
TVM_FFI_DLL_EXPORT int __tvm_ffi_{FUNCTION}(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {{
  (void)self; (void)args; (void)num_args;
  result->type_index = kTVMFFIOpaquePtr;
  result->v_ptr = (void*)byoc_signature;
  return 0;
}}
#ifdef __cplusplus
}}
#endif
"""
    return tvm.get_global_func("runtime.CSourceModuleCreate")(code, "c", [FUNCTION], [])


def read_signature(module: tvm.runtime.Module, where: str) -> dict:
    try:
        function = module.get_function(FUNCTION, query_imports=True)
    except Exception:  # TVM raises InternalError, AttributeError, ... with no common base
        function = None
    if function is None:
        raise ArtifactError(f"{where} does not describe itself (no {FUNCTION}): it was not built by this version of byoc")
    pointer = function()
    return json.loads(ctypes.string_at(pointer.value if isinstance(pointer, ctypes.c_void_p) else pointer).decode())


def check_signature(found: dict, expected: dict, where: str) -> None:
    """ArtifactError, naming what differs, unless the library's description is `expected`."""
    for part, what in (("inputs", "inputs"), ("outputs", "outputs")):
        if found[part] != expected[part]:
            raise ArtifactError(f"{where}: the host code takes {what} {found[part]}; the model's parts say {expected[part]}")
    if found["regions"] != expected["regions"]:
        missing = sorted(set(found["regions"]) - set(expected["regions"]))
        extra = sorted(set(expected["regions"]) - set(found["regions"]))
        changed = sorted(s for s in set(found["regions"]) & set(expected["regions"]) if found["regions"][s] != expected["regions"][s])
        raise ArtifactError(f"{where}: the host code calls regions {sorted(found['regions'])}; the model's parts "
                            f"lack {missing}, add {extra}, and differ in the code kind, inputs or outputs of {changed}")
