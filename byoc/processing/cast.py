"""Casting a region to float16 (used by half-precision engines such as TensorRT's).

Region inputs are cast at the boundary, float32 constants are stored as float16, every op
computes in float16, and outputs are cast back to float32, so the host keeps float32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from byoc.processing.json_rewrite import GraphWriter

_ASTYPE = "relax.attrs.AstypeAttrs"


def _cast(writer: GraphWriter, ref: dict, spec: Mapping[str, Any], dtype: str, name: str) -> dict:
    return writer.add("relax.astype", [ref], [{"shape": spec["shape"], "dtype": dtype}], name, {"dtype": dtype}, _ASTYPE)


def to_float16(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    writer = GraphWriter(graph, constants)
    for index, spec in enumerate(graph["inputs"]):
        if spec["dtype"] == "float32":
            writer.mapping[("input", index)] = _cast(writer, {"input": index}, spec, "float16", spec["name"])
    for name, array in constants.items():
        if array.dtype == np.float32:
            writer.mapping[("const", name)] = writer.constant(array.astype(np.float16), "fp16")
    for node in graph["nodes"]:
        outputs = [{**o, "dtype": "float16" if o["dtype"] == "float32" else o["dtype"]} for o in node["outputs"]]
        attrs = dict(node["attrs"])
        for key in ("out_dtype", "dtype"):
            if attrs.get(key) == "float32":
                attrs[key] = "float16"
        writer.copy(node, outputs=outputs, attrs=attrs)
    outputs = []
    for ref in graph["outputs"]:
        new = writer.lookup(ref)
        spec = writer.nodes[new["node"]]["outputs"][new.get("index", 0)] if "node" in new else None
        outputs.append(_cast(writer, new, spec, "float32", "output") if spec and spec["dtype"] == "float16" else new)
    result = writer.graph(outputs)
    return result, writer.used_constants(result)
