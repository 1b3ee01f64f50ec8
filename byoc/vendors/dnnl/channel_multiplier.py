"""Grouped convolutions with a channel multiplier made depthwise, for oneDNN.

A convolution with one input channel per group and m > 1 outputs per group (FastViT and
MobileOne widen so between stages: 48 channels in, 96 out, 48 groups) has no JIT kernel in
oneDNN 3.2 on AVX2: it ran in its GEMM code with im2col or its reference code (FastViT-T8 spent
28 of its 41 ms there, 3.7x onnxruntime). The same convolution over the input with each channel
repeated m times, with one group per output channel, is a depthwise convolution, which oneDNN
runs with its JIT kernels on every ISA: 0.1-0.5 ms where the grouped one took 0.9-1.7 on AVX2,
and 0.07-1.1 ms against 0.25-1.4 on AVX-512, the copy of the input included. Output channel o
reads group o // m, which is channel o // m of the repeated input: the weights stay as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from byoc.codegen_json.references import kernels, value_spec
from byoc.processing.json_rewrite import GraphWriter


def _multiplier(graph: Mapping[str, Any], node: Mapping[str, Any], starts_kernel: bool) -> int:
    """m where `node` is a float NCHW convolution with one input channel per group and m > 1
    outputs per group that begins its kernel (a repeat before it then runs as a kernel of its
    own); 1 otherwise."""
    if node["op"] != "relax.nn.conv2d" or not starts_kernel:
        return 1
    attrs = node["attrs"]
    x, w = (value_spec(graph, arg) for arg in node["args"][:2])
    if (attrs["data_layout"], attrs["kernel_layout"]) != ("NCHW", "OIHW") or x["dtype"] != "float32" or not isinstance(x["shape"][1], int):
        return 1
    groups, channels, out_channels = attrs["groups"], x["shape"][1], w["shape"][0]
    if groups == 1 or groups != channels or w["shape"][1] != 1 or out_channels % groups:
        return 1
    return out_channels // groups


class ChannelMultiplierPass:
    """Each convolution with a channel multiplier made a repeat of its input and a depthwise one."""

    name = "depthwise convolutions for channel multipliers"

    def __call__(self, graph, constants, context):
        firsts = {kernel.nodes[0]["id"] for kernel in kernels(graph)}
        found = {node["id"]: m for node in graph["nodes"] if (m := _multiplier(graph, node, node["id"] in firsts)) > 1}
        if not found:
            return graph, constants
        writer = GraphWriter(graph, constants)
        for node in graph["nodes"]:
            if node["id"] not in found:
                writer.copy(node)
                continue
            x, w = (writer.lookup(arg) for arg in node["args"][:2])
            shape = value_spec(graph, node["args"][0])["shape"]
            m = found[node["id"]]
            repeated = writer.add("relax.repeat", [x], [{"shape": [shape[0], shape[1] * m, *shape[2:]], "dtype": "float32"}],
                                  f"{node['name']}_channels_repeated", {"repeats": m, "axis": 1}, "relax.attrs.RepeatAttrs")
            writer.copy(node, [repeated, w, *(writer.lookup(arg) for arg in node["args"][2:])],
                        attrs={**node["attrs"], "groups": shape[1] * m})
        rewritten = writer.graph([writer.lookup(ref) for ref in graph["outputs"]])
        return rewritten, writer.used_constants(rewritten)
