"""ONNX files to Relax (`importer.from_onnx`), in the order the importer runs its steps.

Before TVM sees the model, on the ONNX graph: `checker` (onnx's checker without the weights),
`node_names` (names for unnamed nodes), `node_order` (nodes sorted as onnxruntime sorts them),
`contrib_ops` (onnxruntime's fused ops in standard form), `qoperator` (QOperator files in QDQ
form), `nbits` (block-quantized weights as float), `graph_inputs` (which inputs are constants),
`input_shapes` (every input's static shape), `specialize` (shapes and shape-deciding values),
`evaluate_constants` (constant folding with onnx's reference evaluator), `fold_affine` (batch
norms into convolutions), `functions` (function ops expanded), `support` (which converter
imports each op), `lost_scales` (quantization scales that lose every value).

The conversion: TVM's ONNX converters, with byoc's own where TVM's are wrong or too general
(`converters`, with `index_operands` and `sequences`).
"""
