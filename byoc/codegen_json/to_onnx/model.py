"""`graph_to_onnx`: a region's JSON graph as an ONNX model, refused up front where an op cannot be
written, and rewritten after into the forms vendors' importers fuse (`quantized_rewrites`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import tvm
from onnx import helper, numpy_helper
from tvm import relax

from byoc.codegen_json.references import tensor_refs, value_spec
from byoc.codegen_json.to_onnx.quantized_rewrites import (
    bias_into_conv,
    dequantized_matmul_as_gemm,
    dynamic_quantization_as_the_model_had_it,
    hard_activations,
    layout_between_quantize_and_dequantize,
)
from byoc.codegen_json.to_onnx.translations import EMITTERS, TRANSLATIONS, checks_at, supported
from byoc.codegen_json.to_onnx.writer import OPSET, Writer
from byoc.codegen_json.to_relax import constants_as_inputs, graph_to_relax
from byoc.errors import CodegenError


# ---------------------------------------------------------------- the hand-off
def _value_info(name: str, spec: Mapping[str, Any]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(spec["dtype"])), spec["shape"])


def _refuse_what_cannot_be_written(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], opset: int) -> None:
    """Every node's op has a translation and passes its check at `opset`, else a CodegenError
    naming the region, the op, the node and why: a vendor that claimed an op without the check
    gets the reason here rather than an invalid model from its importer."""
    where = f"region {graph['symbol']} ({graph['backend']})"
    for node in graph["nodes"]:
        if node["op"] not in TRANSLATIONS:
            raise CodegenError(
                f"{where}: {node['op']} (node {node['name']!r}) has no ONNX translation in byoc's hand-off; ops it "
                f"writes: see byoc.codegen_json.onnx_op_table(); claim only ops whose check in onnx_checks({opset}) passes")
    missing = [name for name in graph["constants"] if name not in constants]
    if missing:
        raise CodegenError(f"{where}: constants {missing} are not among the constants given")
    # The checks read Relax calls: the graph rebuilt, one binding per node, in order.
    bindings = graph_to_relax(constants_as_inputs(graph), {}).body.blocks[0].bindings
    calls = [b.value for b in bindings if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]
    checks = checks_at(opset)
    for node, call in zip(graph["nodes"], calls):
        reason = checks[node["op"]](call)
        if reason is not None:
            raise CodegenError(
                f"{where}: {node['op']} (node {node['name']!r}) cannot be written at ONNX opset {opset}: {reason}; "
                f"claim only ops whose check in onnx_checks({opset}) passes")


def graph_to_onnx(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], opset: int = OPSET) -> onnx.ModelProto:
    """A region's JSON graph as an ONNX model of the default domain at `opset`.

    `graph` is a byoc JSON graph (format "byoc.json-graph", version 1: `region_to_json`'s output,
    after the vendor's processing passes), every shape static. `constants` holds an array for each
    name in `graph["constants"]`; each becomes an initializer of that name. Opsets 17 (`OPSET`,
    the default: TensorRT's parser) to 20 (`LATEST_OPSET`: onnxruntime) are written; the IR
    version is the least the opset needs.

    Names: the graph inputs are `input0`, `input1`, ... in the JSON graph's input order, the
    outputs `output0`, `output1`, ... in its output order, with the JSON graph's shapes and dtypes;
    the model's graph is named after the region's symbol, each ONNX node after the JSON node it
    comes from (`<node name>__<k>`).

    Raises CodegenError, naming the region, the Relax op and the node, for an opset outside 17 to
    20, an op without a translation (see `onnx_op_table`), an op whose check in
    `onnx_checks(opset)` fails (with the check's reason), or a constant missing from `constants`;
    JsonGraphError for a node that is not a valid Relax call.
    """
    supported(opset)
    _refuse_what_cannot_be_written(graph, constants, opset)
    writer = Writer(graph, opset)
    for node in graph["nodes"]:
        args = [writer.tensor(ref) for arg in node["args"] for ref in tensor_refs(arg)]
        outs = [f"n{node['id']}_{i}" for i in range(len(node["outputs"]))]
        EMITTERS[node["op"]](writer, node, args, outs)
    convolutions = {f"n{node['id']}_0": node["outputs"][0]["shape"][1] for node in graph["nodes"] if node["op"].startswith("relax.nn.conv")}
    graph_outputs = {writer.tensor(ref) for ref in graph["outputs"]}
    bias_into_conv(writer, constants, graph_outputs, convolutions)
    hard_activations(writer, constants, graph_outputs)
    matrices = {f"n{node['id']}_0" for node in graph["nodes"]
                if node["op"] == "relax.matmul" and len(value_spec(graph, node["args"][0])["shape"]) == 2}
    dynamic_quantization_as_the_model_had_it(writer, constants, graph_outputs)
    dequantized_matmul_as_gemm(writer, constants, graph_outputs, matrices)
    layout_between_quantize_and_dequantize(writer, constants, graph_outputs)
    # A node's result is renamed to the output it is; an output that is a region input, a
    # constant or another output's tensor is an Identity (onnxruntime keeps an Identity whose
    # input other nodes read too: one more copy per run).
    outputs = [f"output{position}" for position in range(len(graph["outputs"]))]
    renamed: dict[str, str] = {}
    for name, ref in zip(outputs, graph["outputs"]):
        tensor = writer.tensor(ref)
        if "node" in ref and tensor not in renamed:
            renamed[tensor] = name
        else:
            writer.add("Identity", [renamed.get(tensor, tensor)], [name], "output")
    for onnx_node in writer.nodes:
        for field in (onnx_node.input, onnx_node.output):
            field[:] = [renamed.get(name, name) for name in field]
    output_specs = [value_spec(graph, ref) for ref in graph["outputs"]]
    read = {name for onnx_node in writer.nodes for name in onnx_node.input}
    onnx_graph = helper.make_graph(
        writer.nodes,
        graph["symbol"],
        [_value_info(f"input{i}", spec) for i, spec in enumerate(graph["inputs"])],
        [_value_info(name, spec) for name, spec in zip(outputs, output_specs)],
        [*(numpy_helper.from_array(np.require(constants[name], requirements="C"), name) for name in graph["constants"]
           if name in read), *(i for i in writer.initializers if i.name in read)],
    )
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(onnx_graph, opset_imports=opsets, producer_name="byoc")
    model.ir_version = helper.find_min_ir_version_for(opsets)  # 8 for opset 17, 9 for 20
    return model
