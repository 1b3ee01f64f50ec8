"""Layout transformation (paper section 3.2): inside a region, NCHW becomes NHWC.

Transposes are inserted at the region's boundary (and where an op that cares about layout but
has no NHWC form reads a converted tensor); convolutions, pooling and the ops around them switch
to NHWC, constant weights are transposed once (OIHW to OHWI), and broadcast constants and axis
attributes follow the new layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from byoc.codegen_json.references import ref_key, tensor_refs, value_spec
from byoc.processing.json_rewrite import GraphWriter

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)
_AXIS = {0: 0, 1: 3, 2: 1, 3: 2}  # an NCHW axis -> its position in NHWC
_ELEMENTWISE = {
    "relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum",
    "relax.nn.relu", "relax.clip", "relax.sigmoid", "relax.tanh", "relax.exp", "relax.sqrt",
    "relax.quantize", "relax.dequantize",
}
_POOLS = {"relax.nn.max_pool2d", "relax.nn.avg_pool2d"}
_PERMUTE = "relax.attrs.PermuteDimsAttrs"


def _permuted(shape, order) -> list[int]:
    return [shape[i] for i in order]


def _global_pooling(node: dict) -> bool:
    shape = node["outputs"][0]["shape"]
    return len(shape) == 4 and sorted(a % 4 for a in node["attrs"]["axis"]) == [2, 3]


class _LayoutPass:
    def __init__(self, graph: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> None:
        self.graph = graph
        self.constants = constants
        self.writer = GraphWriter(graph, constants)
        self.nhwc: set[tuple] = set()  # keys (in the new graph) of tensors held in NHWC

    def _spec(self, ref: dict) -> Mapping[str, Any]:
        if "node" in ref:
            return self.writer.nodes[ref["node"]]["outputs"][ref.get("index", 0)]
        return value_spec({"inputs": self.writer.inputs, "constants": self.writer.constant_specs, "nodes": []}, ref)

    def _transpose(self, ref: dict, order, name: str) -> dict:
        spec = self._spec(ref)
        out = {"shape": _permuted(spec["shape"], order), "dtype": spec["dtype"]}
        result = self.writer.add("relax.permute_dims", [ref], [out], name, {"axes": list(order)}, _PERMUTE)
        if order == TO_NHWC:
            self.nhwc.add(ref_key(result))
        return result

    def _as_nchw(self, ref: dict, name: str) -> dict:
        return self._transpose(ref, TO_NCHW, name) if ref_key(ref) in self.nhwc else ref

    def _as_nhwc(self, ref: dict, name: str) -> dict:
        """An activation or constant operand of a 4-D op, in NHWC."""
        if ref_key(ref) in self.nhwc:
            return ref
        spec = self._spec(ref)
        if "const" in ref:
            array = self.writer.constants[ref["const"]]
            if array.ndim == 4:
                return self.writer.constant(np.transpose(array, TO_NHWC), "nhwc")
            if 0 < array.ndim < 4:  # broadcasting from the right: pad to 4-D first
                return self.writer.constant(np.transpose(array.reshape((1,) * (4 - array.ndim) + array.shape), TO_NHWC), "nhwc")
            return ref
        return self._transpose(ref, TO_NHWC, name) if len(spec["shape"]) == 4 else ref

    def _emit(self, node: dict, args: list, nhwc: bool, **attrs) -> None:
        outputs = [{"shape": _permuted(o["shape"], TO_NHWC) if nhwc and len(o["shape"]) == 4 else o["shape"], "dtype": o["dtype"]}
                   for o in node["outputs"]]
        refs = self.writer.copy(node, args, outputs=outputs, attrs={**node["attrs"], **attrs})
        if nhwc:
            self.nhwc.update(ref_key(r) for r, o in zip(refs, outputs) if len(o["shape"]) == 4)

    def _node(self, node: dict) -> None:
        w, op, name, attrs = self.writer, node["op"], node["name"], node["attrs"]
        args = [w.lookup(a) for a in node["args"]]
        if op == "relax.nn.conv2d" and "const" in node["args"][1] and attrs["data_layout"] == "NCHW" and attrs["kernel_layout"] == "OIHW":
            weights = w.constant(np.transpose(self.constants[node["args"][1]["const"]], TO_NHWC), "ohwi")
            self._emit(node, [self._as_nhwc(args[0], name), weights], True, data_layout="NHWC", kernel_layout="OHWI", out_layout="NHWC")
        elif op in _POOLS and attrs["layout"] == "NCHW":
            self._emit(node, [self._as_nhwc(args[0], name)], True, layout="NHWC", out_layout="NHWC")
        elif op in _ELEMENTWISE and any(ref_key(a) in self.nhwc for a in args if "node" in a or "input" in a):
            converted = [self._as_nhwc(a, name) if any(k in a for k in ("input", "const", "node")) else a for a in args]
            self._emit(node, converted, True)
        elif op == "relax.concat" and all(ref_key(r) in self.nhwc for r in tensor_refs(args[0])):
            self._emit(node, args, True, axis=_AXIS[attrs["axis"] % 4])
        elif op == "relax.mean" and attrs["keepdims"] and (ref_key(args[0]) in self.nhwc or _global_pooling(node)):
            # Global average pooling is pooling: NHWC even when it reads the region's NCHW input.
            self._emit(node, [self._as_nhwc(args[0], name)], True, axis=sorted(_AXIS[a % 4] for a in attrs["axis"]))
        elif op == "relax.nn.softmax" and ref_key(args[0]) in self.nhwc:
            self._emit(node, args, True, axis=_AXIS[attrs["axis"] % 4])
        else:
            self._emit(node, [self._nchw_arg(a, name) for a in args], False)

    def _nchw_arg(self, ref: dict, name: str) -> dict:
        if "tuple" in ref:
            return {"tuple": [self._nchw_arg(item, name) for item in ref["tuple"]]}
        return self._as_nchw(ref, name) if any(k in ref for k in ("input", "node")) else ref

    def run(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        for node in self.graph["nodes"]:
            self._node(node)
        outputs = [self._as_nchw(self.writer.lookup(ref), "output") for ref in self.graph["outputs"]]
        graph = self.writer.graph(outputs)
        return graph, self.writer.used_constants(graph)


def to_nhwc(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The region with its convolutions and pooling in NHWC, transposes at the boundary."""
    return _LayoutPass(graph, constants).run()
