"""Casting a region to float16, or bfloat16 (used by half-precision engines such as TensorRT's
and the cuda vendor's).

Region inputs are cast at the boundary, float32 constants are stored in the half type, every op
computes in it, and outputs are cast back to float32, so the host keeps float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from byoc.processing.json_rewrite import GraphWriter

_ASTYPE = "relax.attrs.AstypeAttrs"


def _cast(writer: GraphWriter, ref: dict, spec: Mapping[str, Any], dtype: str, name: str) -> dict:
    return writer.add("relax.astype", [ref], [{"shape": spec["shape"], "dtype": dtype}], name, {"dtype": dtype}, _ASTYPE)


HALF_TYPES = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def to_float16(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray],
               half: str = "float16") -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The region computed in `half` ("float16" or "bfloat16"), float32 at its boundary."""
    writer = GraphWriter(graph, constants)
    for index, spec in enumerate(graph["inputs"]):
        if spec["dtype"] == "float32":
            writer.mapping[("input", index)] = _cast(writer, {"input": index}, spec, half, spec["name"])
    for name, array in constants.items():
        if array.dtype == np.float32:
            writer.mapping[("const", name)] = writer.constant(array.astype(HALF_TYPES[half]), "fp16" if half == "float16" else "bf16")
    for node in graph["nodes"]:
        outputs = [{**o, "dtype": half if o["dtype"] == "float32" else o["dtype"]} for o in node["outputs"]]
        attrs = dict(node["attrs"])
        for key in ("out_dtype", "dtype"):
            if attrs.get(key) == "float32":
                attrs[key] = half
        writer.copy(node, outputs=outputs, attrs=attrs)
    outputs = []
    for ref in graph["outputs"]:
        new = writer.lookup(ref)
        spec = writer.nodes[new["node"]]["outputs"][new.get("index", 0)] if "node" in new else None
        outputs.append(_cast(writer, new, spec, "float32", "output") if spec and spec["dtype"] == half else new)
    result = writer.graph(outputs)
    return result, writer.used_constants(result)
