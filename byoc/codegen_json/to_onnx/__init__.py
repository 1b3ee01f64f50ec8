"""JSON graph -> ONNX model: byoc's hand-off to vendors whose libraries import ONNX (ONNX
Runtime: one inference session per region; TensorRT: its ONNX parser builds the engine's network;
plugin vendors that build their engines from ONNX). See docs/onnx-handoff.md.

A vendor claims ops with `onnx_checks(opset)` and builds its engine from
`graph_to_onnx(graph, constants, opset)`; `onnx_op_table(opset)` lists what is written, when, and
at which opsets. One declaration per Relax op (`TRANSLATIONS`): the ONNX op it becomes, its
emitter, what ONNX cannot express of it (a `Limit`: a check returning the reason, with its rule in
words) and the opset a form of it needs (`Since`). Every check also holds the op's tensors to the
type constraints of the ONNX op's schema, so an int64 `exp` or int32 GatherND indices stay on the
host with the reason rather than failing in the vendor's importer.
"""

from byoc.codegen_json.to_onnx.limits import Limit, Since
from byoc.codegen_json.to_onnx.model import graph_to_onnx
from byoc.codegen_json.to_onnx.op_table import OpEntry, onnx_op_table, op_table_markdown
from byoc.codegen_json.to_onnx.translations import EMITTERS, ONNX_CHECKS, ONNX_OPS, TRANSLATIONS, Translation, onnx_checks
from byoc.codegen_json.to_onnx.writer import LATEST_OPSET, OPSET, OPSETS

__all__ = ["EMITTERS", "LATEST_OPSET", "ONNX_CHECKS", "ONNX_OPS", "OPSET", "OPSETS", "TRANSLATIONS", "Limit", "OpEntry", "Since",
           "Translation", "graph_to_onnx", "onnx_checks", "onnx_op_table", "op_table_markdown"]
