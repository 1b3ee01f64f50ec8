"""Code generation option 1: regions as JSON graphs, validated against a versioned schema."""

from byoc.codegen_json.runtime import JsonRuntime
from byoc.codegen_json.schema import FORMAT_NAME, FORMAT_VERSION, load_graph, schema, validate_graph
from byoc.codegen_json.serialize import region_to_json
from byoc.codegen_json.to_onnx import graph_to_onnx
from byoc.codegen_json.to_relax import graph_to_relax

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "JsonRuntime", "graph_to_onnx", "graph_to_relax", "load_graph", "region_to_json", "schema", "validate_graph"]
