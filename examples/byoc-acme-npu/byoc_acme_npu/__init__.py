"""The ACME NPU: a byoc vendor in one file, against the public API only.

Data sheet: float32, NCHW; conv2d up to 3x3, no groups or dilation, with optional bias and ReLU
fused; max pooling without dilation or ceil mode; element-wise add and ReLU; matrix products with constant weights. The
device is simulated in NumPy (the simulator is the engine below).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

import byoc
from byoc.annotate import fused_pattern
from byoc.codegen_json import JsonRuntime

backend = byoc.Backend(
    name="acme_npu",
    priority=5,
    description="ACME NPU (NumPy simulator)",
    limits=byoc.Limits(dtypes=("float32",), layouts=("NCHW",), constant_weights=True),
    cost=byoc.CostRules(fallback_without_macs=True),
)


def _conv_limits(call) -> str | None:
    attrs = call.attrs
    kernel = [int(d) for d in call.args[1].ty.shape.values][2:]
    if attrs.groups != 1:
        return "grouped convolution is not supported"
    if max(kernel) > 3:
        return f"kernel {kernel[0]}x{kernel[1]} is larger than 3x3"
    if any(d != 1 for d in attrs.dilation):
        return "dilation is not supported"
    return None


backend.pattern(
    "conv2d_bias_relu",
    *fused_pattern("relax.nn.conv2d", bias=True, activation="relax.nn.relu"),
    check=lambda match: _conv_limits(match["root"]),
)
backend.supports("relax.nn.conv2d", check=_conv_limits)
backend.supports("relax.nn.max_pool2d", check=lambda call: "dilation or ceil mode is not supported"
                  if call.attrs.ceil_mode or any(d != 1 for d in call.attrs.dilation) else None)
backend.supports("relax.add", "relax.nn.relu", "relax.matmul")


def _conv2d(x, w, attrs):
    top, left, bottom, right = attrs["padding"]
    x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)))
    windows = sliding_window_view(x, w.shape[2:], axis=(2, 3))[:, :, :: attrs["strides"][0], :: attrs["strides"][1]]
    return np.einsum("nchwij,ocij->nohw", windows, w, optimize=True)


def _max_pool2d(x, attrs):
    top, left, bottom, right = attrs["padding"]
    x = np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=-np.inf)
    windows = sliding_window_view(x, attrs["pool_size"], axis=(2, 3))
    return windows[:, :, :: attrs["strides"][0], :: attrs["strides"][1]].max(axis=(4, 5))


_KERNELS = {
    "relax.nn.conv2d": lambda args, attrs: _conv2d(args[0], args[1], attrs),
    "relax.add": lambda args, attrs: args[0] + args[1],
    "relax.nn.relu": lambda args, attrs: np.maximum(args[0], 0),
    "relax.nn.max_pool2d": lambda args, attrs: _max_pool2d(args[0], attrs),
    "relax.matmul": lambda args, attrs: args[0] @ args[1],
}


class Simulator:
    """Executes a region's JSON graph node by node."""

    def __init__(self, graph, constants):
        self.graph = graph
        self.constants = constants

    def run(self, inputs, outputs):
        values = []

        def read(ref):
            if "input" in ref:
                return inputs[ref["input"]]
            if "const" in ref:
                return self.constants[ref["const"]]
            return values[ref["node"]]

        for node in self.graph["nodes"]:
            result = _KERNELS[node["op"]]([read(a) for a in node["args"]], node["attrs"])
            values.append(result.astype(node["outputs"][0]["dtype"], copy=False))
        for out, ref in zip(outputs, self.graph["outputs"]):
            np.copyto(out, read(ref))


backend.codegen = JsonRuntime(build_engine=lambda graph, constants, options: Simulator(graph, constants), version="acme-sim-1")
