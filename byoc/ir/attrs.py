"""Op attributes as plain Python values and back.

The JSON codegen, reports and vendor emitters read attributes as dicts of ints, floats,
strings, lists and None; the JSON runtime of the reference backend turns them back into TVM
attribute objects to rebuild Relax calls.
"""

from __future__ import annotations

import json
from typing import Any

import tvm
import tvm_ffi


def attrs_type_key(attrs: tvm.ir.Attrs) -> str:
    return type(attrs).__tvm_ffi_type_info__.type_key


def to_python(value: Any) -> Any:
    """A TVM attribute value as JSON-compatible Python."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):  # also DataType, which subclasses str
        return str(value)
    if isinstance(value, tvm.ir.prim.expr.IntImm):
        return bool(value.value) if str(value.ty) == "bool" else int(value.value)
    if isinstance(value, tvm.ir.prim.expr.FloatImm):
        return float(value.value)
    if isinstance(value, (list, tuple)) or type(value).__name__ == "Array":
        return [to_python(v) for v in value]
    if type(value).__name__ in ("Map", "dict"):
        return {str(k): to_python(v) for k, v in value.items()}
    return str(value)


def attrs_to_dict(attrs: tvm.ir.Attrs | None) -> dict[str, Any]:
    if attrs is None:
        return {}
    fields = type(attrs).__tvm_ffi_type_info__.fields
    return {f.name: to_python(getattr(attrs, f.name)) for f in fields}


def dict_to_attrs(type_key: str, values: dict[str, Any]) -> tvm.ir.Attrs:
    """Rebuild an attrs object. Fields typed as generic objects (split's indices, say) refuse
    plain ints, so integers go to those as int64 immediates."""
    info = tvm_ffi.core._lookup_or_register_type_info_from_type_key(type_key)
    object_fields = {f.name for f in info.fields if json.loads(f.metadata.get("type_schema", "{}")).get("type") == "ffi.Object"}
    return tvm.ir.make_node(type_key, **{k: _as_immediates(v) if k in object_fields else v for k, v in values.items()})


def _as_immediates(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, list)):
        return value
    if isinstance(value, int):
        return tvm.tirx.IntImm("int64", value)
    return [_as_immediates(v) for v in value]
