"""The Ethos-U region program: int8 NHWC operations with TFLite requantization parameters.

`compile_program` lowers a quantized NHWC region (QDQ graph) to it. The same program feeds the
Vela lowering (NPU operations, encoded weights, command stream) and the reference executor.
Operations the NPU has no instruction for (the layout transposes at the region's boundary,
reshapes) are marked to run on the CPU between NPU command-stream segments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from byoc.errors import CodegenError
from byoc.processing.qkernels import QKernel, QWeights, TensorTable, quantized_kernels

NPU_KINDS = ("conv", "depthwise", "fully_connected", "maxpool", "avgpool", "add", "concat")
CPU_KINDS = ("transpose", "reshape")


def quantize_multiplier(multiplier: float) -> tuple[int, int]:
    """TFLite's QuantizeMultiplier: multiplier = q * 2**(shift - 31), q a 31-bit integer."""
    if multiplier == 0.0:
        return 0, 0
    fraction, shift = math.frexp(multiplier)
    quantized = round(fraction * (1 << 31))
    if quantized == 1 << 31:
        quantized //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return int(quantized), int(shift)


# The Ethos-U configurations Vela compiles for (byoc.vendors.ethos_u.vela_lowering).
ACCELERATORS = ("ethos-u55-32", "ethos-u55-64", "ethos-u55-128", "ethos-u55-256", "ethos-u65-256", "ethos-u65-512")


@dataclass
class ETensor:
    shape: tuple[int, ...]
    scale: float
    zero_point: int


@dataclass
class EOp:
    kind: str
    inputs: list[int]
    output: int
    name: str
    params: dict[str, Any] = field(default_factory=dict)
    weights: np.ndarray | None = None  # int8, OHWI (depthwise: [C, H, W, 1]; fully connected: [N, 1, 1, K])
    weight_scales: np.ndarray | None = None
    bias: np.ndarray | None = None  # int32, at input scale x weight scale
    multipliers: np.ndarray | None = None  # int32 per output channel
    shifts: np.ndarray | None = None

    @property
    def on_npu(self) -> bool:
        return self.kind in NPU_KINDS


@dataclass
class EProgram:
    accelerator: str
    tensors: list[ETensor]
    inputs: list[int]
    outputs: list[int]
    ops: list[EOp]


def _activation_bounds(kernel: QKernel, out: ETensor) -> tuple[int, int]:
    low, high = -128, 127
    if kernel.node("relax.nn.relu") is not None:
        low = max(low, out.zero_point)
    clip = kernel.node("relax.clip")
    if clip is not None:
        low = max(low, out.zero_point + round(clip["args"][1]["prim"] / out.scale))
        high = min(high, out.zero_point + round(clip["args"][2]["prim"] / out.scale))
    return int(low), int(high)


class _Compiler:
    def __init__(self, graph: dict[str, Any], constants: dict[str, np.ndarray], accelerator: str) -> None:
        self.where = f"region {graph['symbol']} ({graph['backend']})"
        self.kernels, self.output_tensors = quantized_kernels(graph, constants)
        self.accelerator = accelerator
        self.tensor = TensorTable(lambda q: ETensor(q.shape, q.scale, q.zero_point))
        self.tensors: list[ETensor] = self.tensor.items

    def _weighted(self, kernel: QKernel, root: dict, kind: str) -> EOp:
        source, weights = kernel.operand(root, 0), kernel.operand(root, 1)
        if not isinstance(weights, QWeights):
            raise CodegenError(f"{self.where}: node {root['name']!r} needs constant int8 weights")
        data = weights.data
        if kind == "fully_connected":  # [K, N] -> OHWI [N, 1, 1, K]
            data = data.T.reshape(data.shape[1], 1, 1, data.shape[0])
        out = self.tensor(kernel.output)
        source_id = self.tensor(source)
        channels = self.tensors[out].shape[-1]
        scales = np.broadcast_to(weights.scale.reshape(-1), (channels,)).astype(np.float64)
        bias = kernel.bias(self.where)
        bias = np.zeros(channels) if bias is None else np.broadcast_to(bias.reshape(-1), (channels,))
        in_scale, out_scale = self.tensors[source_id].scale, self.tensors[out].scale
        bias_int = np.clip(np.round(bias / (in_scale * scales)), -(2**31), 2**31 - 1).astype(np.int32)
        pairs = [quantize_multiplier(in_scale * s / out_scale) for s in scales]
        low, high = _activation_bounds(kernel, self.tensors[out])
        params: dict[str, Any] = {"act_min": low, "act_max": high}
        if kind != "fully_connected":
            attrs = root["attrs"]
            params.update(strides=list(attrs["strides"]), padding=list(attrs["padding"]), dilation=list(attrs["dilation"]))
        return EOp(kind, [source_id], out, root["name"], params, np.require(data, requirements="C"), scales.astype(np.float32), bias_int,
                   np.array([p[0] for p in pairs], np.int32), np.array([p[1] for p in pairs], np.int32))

    def _op(self, kernel: QKernel) -> EOp:
        root = kernel.nodes[0]
        op, name, attrs = root["op"], root["name"], root["attrs"]
        if op == "relax.nn.conv2d":
            return self._weighted(kernel, root, "depthwise" if attrs["groups"] > 1 else "conv")
        if op == "relax.matmul":
            return self._weighted(kernel, root, "fully_connected")
        out = self.tensor(kernel.output)
        if op == "relax.concat":
            parts = [self.tensor(q) for q in kernel.operand(root, 0)]
            return EOp("concat", parts, out, name, {"axis": attrs["axis"] % len(self.tensors[out].shape)})
        inputs = [self.tensor(q) for q in kernel.inputs()]
        low, high = _activation_bounds(kernel, self.tensors[out])
        if op in ("relax.nn.max_pool2d", "relax.nn.avg_pool2d"):
            kind = "maxpool" if op == "relax.nn.max_pool2d" else "avgpool"
            params = {"pool": list(attrs["pool_size"]), "strides": list(attrs["strides"]), "padding": list(attrs["padding"]),
                      "count_include_pad": bool(attrs.get("count_include_pad", False)), "act_min": low, "act_max": high}
            return EOp(kind, inputs, out, name, params)
        if op == "relax.mean":
            if sorted(int(a) % 4 for a in attrs["axis"]) != [1, 2]:  # the layout pass makes global pooling NHWC
                raise CodegenError(f"{self.where}: node {name!r}: a mean over axes {list(attrs['axis'])} is not NHWC global pooling")
            _, height, width, _ = self.tensors[inputs[0]].shape
            params = {"pool": [height, width], "strides": [1, 1], "padding": [0, 0, 0, 0], "count_include_pad": False, "act_min": low, "act_max": high}
            return EOp("avgpool", inputs, out, name, params)
        if op == "relax.add":
            return EOp("add", inputs, out, name, {"act_min": low, "act_max": high})
        if op == "relax.permute_dims":
            return EOp("transpose", inputs, out, name, {"axes": list(attrs["axes"])})
        if op == "relax.reshape":
            return EOp("reshape", inputs, out, name)
        raise CodegenError(f"{self.where}: Ethos-U has no operation for {op} (node {name!r})")

    def run(self) -> EProgram:
        ops = [self._op(k) for k in self.kernels]
        outputs = [self.tensor(q) for q in self.output_tensors]
        return EProgram(self.accelerator, self.tensors, self.tensor.region_inputs(), outputs, ops)


def compile_program(graph: dict[str, Any], constants: dict[str, np.ndarray], accelerator: str) -> EProgram:
    return _Compiler(graph, constants, accelerator).run()
