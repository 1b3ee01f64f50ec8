"""int8 convolutions and products computed in float32 where the CPU's int8 kernels would saturate.

Without VNNI, x86 int8 kernels multiply a u8 source by s8 weights with `vpmaddubsw`, which adds
each pair of products in 16 bits and saturates once the pair passes 32,767: with a source up to
255, weights beyond +-64 can. A model quantized with the full int8 range of weights (onnxruntime's
`quantize_static` default) then loses whole columns of its result (oneDNN 3.2 under
`ONEDNN_MAX_CPU_ISA=AVX2`: 9% relative L2 on one dense layer, 8.5% on one convolution).

The model's own scales are never changed here. A kernel its vendor says would saturate is
computed as the QDQ graph defines it instead: its constant weights (and int32 bias) dequantized
once into float32 constants, its source dequantized and its result quantized by reorders, and
the convolution or product between them in float32, fused with its bias and activation where the
vendor has that float composite. That is exact, and slower than the int8 kernel. A dense layer
whose input is quantized per call (`quantize_dynamic`) keeps its kernel, its weights folded to
float32: its emitter reads the quantized input back as float32. A convolution quantized per call
keeps its int8 kernel.

Where the CPU has the feature, the kernels stay int8 and the region's `info` names them
(`REQUIRES`): an artifact built there and loaded on a CPU without it warns (`warn_where_inexact`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from byoc.codegen_json.references import GraphKernel, kernels, ref_key
from byoc.errors import SaturationWarning
from byoc.processing.json_rewrite import GraphWriter
from byoc.timing import CPU_FEATURES

_ROOTS = ("relax.nn.conv2d", "relax.nn.conv1d", "relax.matmul")


@dataclass(frozen=True)
class Int8Product:
    """What decides whether an int8 kernel saturates: its root op, the type of its int8 source,
    and its constant int8 weights (None where the second operand is computed)."""

    op: str
    source_dtype: str
    weights: np.ndarray | None


# Why a kernel would saturate without the CPU feature (a reason to report), or None where it cannot.
Saturates = Callable[[Int8Product], "str | None"]

# The key of a region's `info` that names the CPU feature its int8 kernels need to be exact, and
# those kernels: {"feature": ..., "kernels": [...]}.
REQUIRES = "int8_exact_with"


def dequantized_constant(node: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> np.ndarray:
    """A dequantize of a constant, computed as ONNX defines it: (q - zero point) * scale in float32,
    the scale and zero point per slice along the node's axis where they have one value per slice."""
    data, scale, zero = (np.asarray(constants[a["const"]]) for a in node["args"])
    if scale.size > 1:
        shape = [1] * data.ndim
        shape[int(node["attrs"]["axis"]) % data.ndim] = scale.size
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    return ((data.astype(np.int64) - zero.astype(np.int64)).astype(np.float32) * scale.astype(np.float32)).astype(np.float32)


def _producer(kernel: GraphKernel, ref: Mapping[str, Any]) -> dict[str, Any] | None:
    return next((n for n in kernel.nodes if "node" in ref and n["id"] == ref["node"]), None)


def saturating_kernels(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], saturates: Saturates) -> dict[int, str]:
    """The int8 kernels of the region (by index in `kernels(graph)`) that `saturates` names, each
    with its root op's name and the reason."""
    dtypes = _tensor_dtypes(graph)
    chosen: dict[int, str] = {}
    for kernel in kernels(graph):
        if not kernel.pattern or not kernel.pattern.startswith("q"):
            continue
        product = _product_of(kernel, constants, dtypes)
        reason = saturates(product) if product is not None else None
        if reason is not None:
            root = next(n for n in kernel.nodes if n["op"] in _ROOTS)
            chosen[kernel.index] = f"{root['name']}: {reason}"
    return chosen


def in_float32(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], chosen: Collection[int],
               float_pattern: Callable[[str], str | None]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The region with the int8 kernels `chosen` (indices in `kernels(graph)`) computed in float32
    (see the module's docstring). `float_pattern` gives the float composite (a pattern name with
    its backend) for an int8 one's, or None where there is none: then its ops run one by one."""
    if not chosen:
        return dict(graph), dict(constants)
    writer = GraphWriter(graph, constants)
    for kernel in kernels(graph):
        if kernel.index not in chosen:
            for node in kernel.nodes:
                writer.copy(node)
            continue
        composite = kernel.nodes[0]["composite"]
        # quantized per call, the kernel stays whole: its emitter reads the quantized input back as float32
        whole = "_dynamic" in kernel.pattern
        name = None if whole else float_pattern(composite["pattern"])
        for node in kernel.nodes:
            if node["op"] == "relax.dequantize" and "const" in node["args"][0]:
                writer.mapping[("node", node["id"], 0)] = writer.constant(dequantized_constant(node, constants), "dequantized")
            elif whole:
                writer.copy(node)
            else:
                copied = {k: v for k, v in node.items() if k != "composite"}
                if name is not None and node["op"] not in ("relax.quantize", "relax.dequantize"):
                    copied["composite"] = {"id": composite["id"], "pattern": name}
                writer.copy(copied)
    result = writer.graph([writer.lookup(ref) for ref in graph["outputs"]])
    return result, writer.used_constants(result)


def _tensor_dtypes(graph: Mapping[str, Any]) -> dict[tuple, str]:
    dtypes = {("input", i): spec["dtype"] for i, spec in enumerate(graph["inputs"])}
    for node in graph["nodes"]:
        for index, output in enumerate(node["outputs"]):
            dtypes[("node", node["id"], index)] = output["dtype"]
    return dtypes


def _product_of(kernel: GraphKernel, constants: Mapping[str, np.ndarray], dtypes: Mapping[tuple, str]) -> Int8Product | None:
    root = next((n for n in kernel.nodes if n["op"] in _ROOTS), None)
    if root is None:
        return None
    source, weights = (_producer(kernel, arg) for arg in root["args"][:2])
    if source is None or weights is None or source["op"] != "relax.dequantize" or weights["op"] != "relax.dequantize":
        return None
    if "_dynamic" in kernel.pattern and root["op"] != "relax.matmul":
        return None  # a convolution quantized per call keeps its int8 kernel (see in_float32)
    data, source_data = weights["args"][0], source["args"][0]
    source_dtype = str(np.asarray(constants[source_data["const"]]).dtype) if "const" in source_data else dtypes[ref_key(source_data)]
    return Int8Product(root["op"], source_dtype, np.asarray(constants[data["const"]]) if "const" in data else None)


def warn_where_inexact(regions: Iterable[Any], label: str) -> None:
    """At load: a warning for each region (with `symbol`, `backend` and `info`) whose int8 kernels
    were built where the CPU feature they need was present, and this CPU lacks it (an artifact
    built on an AVX-512 VNNI server, loaded on an AMD Zen 3): those kernels may saturate here."""
    for region in regions:
        needs = region.info.get(REQUIRES)
        if not needs or CPU_FEATURES.get(needs["feature"], lambda: True)():
            continue
        kernels = needs["kernels"]
        more = f" (and {len(kernels) - 1} more)" if len(kernels) > 1 else ""
        warnings.warn(f"byoc: {label}: region {region.symbol} ({region.backend}) was built where the CPU had "
                      f"{needs['feature']}; this one has not, so {len(kernels)} of its int8 kernel(s) may saturate here: "
                      f"{kernels[0]}{more}. Build the model on a machine like this one to compute them exactly",
                      SaturationWarning, stacklevel=3)
