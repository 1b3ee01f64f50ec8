"""Code generation option 1: regions as JSON graphs, validated against a versioned schema."""

from byoc.codegen_json.runtime import JsonRuntime
from byoc.codegen_json.schema import FORMAT_NAME, FORMAT_VERSION, load_graph, schema, validate_graph
from byoc.codegen_json.serialize import region_to_json
from byoc.codegen_json.to_onnx import LATEST_OPSET, OPSET, Limit, OpEntry, graph_to_onnx, onnx_checks, onnx_op_table, op_table_markdown
from byoc.codegen_json.to_relax import graph_to_relax

__all__ = [
    "FORMAT_NAME", "FORMAT_VERSION", "LATEST_OPSET", "OPSET", "JsonRuntime", "Limit", "OpEntry", "graph_to_onnx", "graph_to_relax",
    "load_graph", "onnx_checks", "onnx_op_table", "op_table_markdown", "region_to_json", "schema", "validate_graph",
]
