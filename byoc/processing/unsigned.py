"""int8 activations moved to uint8, exactly, for kernels that are fastest on unsigned sources.

x86 int8 arithmetic multiplies unsigned 8-bit sources by signed 8-bit weights (VNNI's
`vpdpbusd`, AVX2's `vpmaddubsw`). Given a signed source, oneDNN adds 128 to it and subtracts a
compensation per output channel on every call; on CPUs without VNNI it also halves the weights
so that its 16-bit sums cannot saturate, which costs a bit of each weight. A model quantized with
int8 activations (onnxruntime's default) then runs 1.3-2x slower than the same model with uint8
activations, and less accurately on AVX2.

An int8 tensor with zero point z holds the same values as the uint8 tensor `q + 128` with zero
point `z + 128`: `quantize` clips to [-128, 127] where the uint8 form clips to [0, 255], and
`dequantize` subtracts the zero point. So each quantize inside the region whose int8 result is
only dequantized there (directly, or after moves: reshapes, transposes, slices, broadcasts,
which commute with the shift) is rewritten to produce uint8, and its readers take the moved
zero point. The result is bit for bit the same; int8 data that leaves the region, or that
another op reads, is left as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from byoc.codegen_json.references import ref_key, tensor_refs
from byoc.ir.quantization import INT8_MOVES
from byoc.processing.json_rewrite import GraphWriter

_SHIFT = 128


def _readers(graph: Mapping[str, Any]) -> dict[tuple, list[dict[str, Any]]]:
    found: dict[tuple, list[dict[str, Any]]] = {}
    for node in graph["nodes"]:
        for arg in node["args"]:
            for ref in tensor_refs(arg):
                found.setdefault(ref_key(ref), []).append(node)
    return found


def _per_tensor_zero_point(constants: Mapping[str, np.ndarray], node: Mapping[str, Any]) -> bool:
    ref = node["args"][2]
    return "const" in ref and np.asarray(constants[ref["const"]]).size == 1


def _unsigned_family(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], quantize: Mapping[str, Any],
                     readers: Mapping[tuple, list[dict[str, Any]]], outputs: set[tuple]) -> set[int] | None:
    """The ids of the nodes that carry `quantize`'s int8 result (the quantize, and the moves
    of it) and of the dequantizes that read them, or None where the result cannot move: it
    leaves the region, or an op other than these reads it."""
    family = {quantize["id"]}
    pending = [quantize]
    while pending:
        node = pending.pop()
        key = ("node", node["id"], 0)
        if key in outputs:
            return None
        for reader in readers.get(key, []):
            if reader["id"] in family:
                continue
            if reader["op"] == "relax.dequantize" and ref_key(reader["args"][0]) == key and _per_tensor_zero_point(constants, reader):
                family.add(reader["id"])
            elif reader["op"] in INT8_MOVES and ref_key(reader["args"][0]) == key:
                family.add(reader["id"])
                pending.append(reader)
            else:
                return None
    return family


def int8_activations_to_uint8(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The region with each int8 activation the region quantizes and dequantizes itself made
    uint8 (see the module's docstring); unchanged where there is none."""
    readers = _readers(graph)
    outputs = {ref_key(ref) for ref in graph["outputs"]}
    moved: set[int] = set()
    for node in graph["nodes"]:
        if node["op"] == "relax.quantize" and node["outputs"][0]["dtype"] == "int8" and _per_tensor_zero_point(constants, node):
            family = _unsigned_family(graph, constants, node, readers, outputs)
            if family is not None:
                moved |= family
    if not moved:
        return dict(graph), dict(constants)
    writer = GraphWriter(graph, constants)
    shifted: dict[str, dict[str, Any]] = {}  # zero point constant -> the moved one

    def shifted_zero_point(ref: Mapping[str, Any]) -> dict[str, Any]:
        if ref["const"] not in shifted:
            zero = np.asarray(constants[ref["const"]]).astype(np.int32) + _SHIFT
            shifted[ref["const"]] = writer.constant(zero.astype(np.uint8), "zero_point_u8")
        return shifted[ref["const"]]

    for node in graph["nodes"]:
        if node["id"] not in moved:
            writer.copy(node)
            continue
        args = [writer.lookup(a) for a in node["args"]]
        changes: dict[str, Any] = {}
        if node["op"] in ("relax.quantize", "relax.dequantize"):
            args[2] = shifted_zero_point(node["args"][2])
        if node["op"] != "relax.dequantize":
            changes["outputs"] = [{**node["outputs"][0], "dtype": "uint8"}]
            if node["attrs"].get("out_dtype") == "int8":
                changes["attrs"] = {**node["attrs"], "out_dtype": "uint8"}
        writer.copy(node, args, **changes)
    result = writer.graph([writer.lookup(ref) for ref in graph["outputs"]])
    return result, writer.used_constants(result)
