"""Code generation option 1: regions as JSON graphs, validated against a versioned schema."""

from byoc.exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "JsonRuntime": "byoc.codegen_json.runtime",
    **dict.fromkeys(["FORMAT_NAME", "FORMAT_VERSION", "load_graph", "validate_graph"], "byoc.codegen_json.schema"),
    "region_to_json": "byoc.codegen_json.serialize",
    **dict.fromkeys(["LATEST_OPSET", "OPSET", "Limit", "OpEntry", "graph_to_onnx", "onnx_checks", "onnx_op_table", "op_table_markdown"],
                    "byoc.codegen_json.to_onnx"),
    "graph_to_relax": "byoc.codegen_json.to_relax",
})

__all__ = [
    "FORMAT_NAME", "FORMAT_VERSION", "LATEST_OPSET", "OPSET", "JsonRuntime", "Limit", "OpEntry", "graph_to_onnx", "graph_to_relax",
    "load_graph", "onnx_checks", "onnx_op_table", "op_table_markdown", "region_to_json", "validate_graph",
]
