"""Quantized models as users bring them: a zoo model quantized by onnxruntime's own tool (QDQ,
per-channel int8 weights), imported with its quantization kept, and run by oneDNN in int8
primitives in one region, against onnxruntime running the same file.

Tolerance: two int8 runs of one model differ by about as much as each differs from the float
model. onnxruntime and oneDNN requantize with the same scales in a different order of float
operations, and byoc fuses a residual add into its convolution (one rounding step fewer), so an
element near a rounding boundary lands one step apart, and a step early in the network moves the
logits of this random-weight model by a few. So: relative L2 against onnxruntime on the same
file at most 3% on average over the samples (about 2% measured on these small models, 1.5% on
the full ResNet-50), and against the float model no more than onnxruntime's own int8 error plus
half a percent (both about 2% here).
"""

from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import byoc
from byoc import models as zoo
from byoc.errors import IndexOutOfRangeError
from byoc.ir.types import dtype_name, op_name, static_shape
from byoc.models.graph_builder import OnnxGraphBuilder
from byoc.models.quantized import quantize_static
from byoc.timing import onednn_has_avx512_core, onednn_has_vnni

from conftest import int8_product_formats, onednn_executions

pytest.importorskip("onnxruntime.quantization")


def _quantized(name: str, activations: str) -> onnx.ModelProto:
    model = zoo.get(name, small=True)
    return quantize_static(model, [zoo.sample_inputs(model, seed=s) for s in range(4)], activations)


FLOAT_RESNET = zoo.get("resnet18", small=True)


@pytest.fixture(scope="module")
def resnet_u8() -> onnx.ModelProto:
    return _quantized("resnet18", "uint8")


def _relative_l2(compiled, model: onnx.ModelProto, seeds=(100, 101, 102), float_model: onnx.ModelProto | None = None) -> list[float]:
    """Per sample, relative L2 against onnxruntime running `model`, or, with `float_model`, the
    excess of `compiled`'s error over onnxruntime's int8 error, both against the float model."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    reference = ort.InferenceSession(float_model.SerializeToString(), providers=["CPUExecutionProvider"]) if float_model else None
    errors = []
    for seed in seeds:
        inputs = zoo.sample_inputs(model, seed=seed)
        want, got = session.run(None, inputs)[0], compiled.run(inputs)[0]
        if reference is None:
            errors.append(float(np.linalg.norm(got - want) / np.linalg.norm(want)))
        else:
            exact = reference.run(None, inputs)[0]
            errors.append(float((np.linalg.norm(got - exact) - np.linalg.norm(want - exact)) / np.linalg.norm(exact)))
    return errors


def _within_bound(errors: list[float]) -> bool:
    return float(np.mean(errors)) <= 0.03 and max(errors) <= 0.04


def _as_accurate_as_onnxruntime(compiled, model: onnx.ModelProto, float_model: onnx.ModelProto) -> bool:
    return float(np.mean(_relative_l2(compiled, model, float_model=float_model))) <= 0.005


def test_a_model_quantized_by_onnxruntime_runs_in_int8_primitives_in_one_region(resnet_u8, tmp_path):
    partitioned = byoc.partition_for(byoc.from_onnx(resnet_u8), "dnnl")
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and report.offload_ratio_nodes == 1.0, report.to_table()
    patterns = Counter({p: n for r in report.regions for p, n in r.patterns.items()})
    convolutions = sum(1 for n in resnet_u8.graph.node if n.op_type == "Conv")
    # each convolution an int8 composite, the residual adds fused into them
    assert sum(n for p, n in patterns.items() if p.startswith("dnnl.qconv2d")) == convolutions, patterns
    assert patterns["dnnl.qconv2d_bias_add"] > 0, patterns
    compiled = byoc.build(partitioned)
    errors = _relative_l2(compiled, resnet_u8)
    assert _within_bound(errors), errors
    assert _as_accurate_as_onnxruntime(compiled, resnet_u8, FLOAT_RESNET)

    # In a fresh process, from the exported artifact: oneDNN's own log shows what runs.
    executed = onednn_executions(compiled, resnet_u8, tmp_path)
    convolutions_run = [fields for fields in executed if fields[3] == "convolution"]
    assert len(convolutions_run) == convolutions
    source, weights = int8_product_formats()
    assert all(source in fields[6] and weights in fields[6] for fields in convolutions_run), convolutions_run[:2]
    assert not [fields for fields in executed if fields[4].startswith("ref")], "oneDNN ran reference (C loop) kernels"


@pytest.fixture(scope="module")
def resnet_s8() -> onnx.ModelProto:
    return _quantized("resnet18", "int8")


def test_int8_activations_run_as_uint8(resnet_s8, tmp_path):
    """onnxruntime's default (int8 activations) runs as uint8 inside the region, where x86's int8
    kernels are fastest and, without VNNI, most accurate (byoc.processing.unsigned)."""
    partitioned = byoc.partition_for(byoc.from_onnx(resnet_s8), "dnnl")
    assert len(byoc.report(partitioned).regions) == 1
    compiled = byoc.build(partitioned)
    errors = _relative_l2(compiled, resnet_s8)
    assert _within_bound(errors), errors
    assert _as_accurate_as_onnxruntime(compiled, resnet_s8, FLOAT_RESNET)
    convolutions_run = [fields for fields in onednn_executions(compiled, resnet_s8, tmp_path) if fields[3] == "convolution"]
    assert len(convolutions_run) == sum(1 for n in resnet_s8.graph.node if n.op_type == "Conv")
    source, weights = int8_product_formats()
    assert all(source in fields[6] and weights in fields[6] for fields in convolutions_run), convolutions_run[:2]


def test_moving_int8_activations_to_uint8_changes_no_value(resnet_s8):
    """Each quantize the region keeps to itself produces uint8 with its zero point 128 up, its
    readers take the moved zero point, and the region computes the same bits (run by TVM)."""
    from byoc.codegen_json import tvm_engine
    from byoc.codegen_json.references import value_spec
    from byoc.codegen_json.serialize import region_to_json
    from byoc.processing.unsigned import int8_activations_to_uint8
    from byoc.runtime_metadata.build import region_functions

    ((symbol, name, func),) = region_functions(byoc.partition_for(byoc.from_onnx(resnet_s8), "dnnl"))
    graph, constants = region_to_json(func, symbol, name)
    moved, moved_constants = int8_activations_to_uint8(graph, constants)
    quantizes = [n for n in moved["nodes"] if n["op"] == "relax.quantize"]
    assert quantizes and all(n["outputs"][0]["dtype"] == n["attrs"]["out_dtype"] == "uint8" for n in quantizes)
    before = [n for n in graph["nodes"] if n["op"] == "relax.quantize"]
    zero = {n["args"][2]["const"] for n in before}
    assert all(constants[z].dtype == np.int8 for z in zero)
    assert all(moved_constants[n["args"][2]["const"]].astype(np.int32) == constants[b["args"][2]["const"]].astype(np.int32) + 128
               for n, b in zip(quantizes, before))

    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(spec["shape"]).astype(np.float32) for spec in graph["inputs"]]
    results = []
    for g, c in ((graph, constants), (moved, moved_constants)):
        outputs = [np.empty(spec["shape"], np.float32) for spec in (value_spec(g, ref) for ref in g["outputs"])]
        tvm_engine.build_engine(g, c, {}).run(inputs, outputs)
        results.append(outputs)
    assert all(np.array_equal(a, b) for a, b in zip(*results))

    # int8 data that leaves the region, or that an op other than a dequantize reads, stays int8
    first = before[0]
    leaving, _ = int8_activations_to_uint8({**graph, "outputs": [*graph["outputs"], {"node": first["id"], "index": 0}]}, constants)
    assert leaving["nodes"][first["id"]]["outputs"][0]["dtype"] == "int8"
    cast = {"id": len(graph["nodes"]), "name": "cast", "op": "relax.astype", "args": [{"node": first["id"], "index": 0}],
            "attrs": {"dtype": "float32"}, "outputs": [{"shape": first["outputs"][0]["shape"], "dtype": "float32"}]}
    read, _ = int8_activations_to_uint8({**graph, "nodes": [*graph["nodes"], cast]}, constants)
    assert read["nodes"][first["id"]]["outputs"][0]["dtype"] == "int8"
    assert sum(n["outputs"][0]["dtype"] == "uint8" for n in read["nodes"] if n["op"] == "relax.quantize") == len(before) - 1


def test_weights_stay_int8_from_import_to_the_artifact(resnet_u8, tmp_path):
    mod = byoc.from_onnx(resnet_u8)
    weights = [b.value for block in mod["main"].body.blocks for b in block.bindings
               if getattr(getattr(b.value, "op", None), "name", None) == "relax.dequantize" and b.value.args[0].ty.dtype == "int8"]
    layers = sum(1 for n in resnet_u8.graph.node if n.op_type in ("Conv", "Gemm", "MatMul"))
    assert len(weights) == layers
    stored = sum(numpy_helper.to_array(i).nbytes for i in resnet_u8.graph.initializer if i.data_type == onnx.TensorProto.INT8)
    record = json.loads(str(byoc.partition_for(mod, "dnnl").attrs["byoc.partition"]))
    # The region holds the int8 weights and float32 biases and scales: not four times the weights.
    assert record["regions"][0]["constant_bytes"] < 1.2 * stored


def test_a_vendor_without_quantized_ops_gets_float_weights_as_before(resnet_u8):
    report = byoc.report(byoc.partition_for(byoc.from_onnx(resnet_u8), "reference"))
    convolutions = sum(1 for n in resnet_u8.graph.node if n.op_type == "Conv")
    offloaded = Counter(op for r in report.regions for op in r.ops)
    assert offloaded["relax.nn.conv2d"] == convolutions, report.to_table()
    assert "relax.dequantize" not in offloaded
    assert any("relax.quantize" in reason for reasons in report.host_reasons().values() for reason in reasons)


def test_the_onnxruntime_vendor_runs_the_quantized_model_as_onnxruntime_does(resnet_u8):
    """The region keeps the model's QuantizeLinear/DequantizeLinear and int8 weights, each Conv
    its bias: onnxruntime fuses them into its int8 kernels, as for the file alone."""
    partitioned = byoc.partition_for(byoc.from_onnx(resnet_u8), "onnxruntime")
    assert len(byoc.report(partitioned).regions) == 1
    assert max(_relative_l2(byoc.build(partitioned), resnet_u8)) < 1e-5


def test_the_onnxruntime_vendor_gets_the_moves_of_int8_data_back_as_the_model_had_them():
    """Partitioning moves slices, new axes and broadcasts onto the int8 data; the hand-off writes
    each back between a DequantizeLinear and a QuantizeLinear, as the file had it: onnxruntime
    turns s8 into its fast u8 kernels only where a DequantizeLinear reads a QuantizeLinear
    directly (a quantized Llama base took 11.0 ms a run instead of 6.2 until it did)."""
    from byoc.codegen_json.serialize import region_to_json
    from byoc.codegen_json.to_onnx import LATEST_OPSET, graph_to_onnx
    from byoc.runtime_metadata.build import region_functions

    model = _exported_attention()
    quantized = quantize_static(model, [zoo.sample_inputs(model, seed=s) for s in range(4)], "int8")
    partitioned = byoc.partition_for(byoc.from_onnx(quantized), "onnxruntime")
    ((symbol, name, func),) = region_functions(partitioned)
    region = graph_to_onnx(*region_to_json(func, symbol, name), opset=LATEST_OPSET)
    producer = {out: node for node in region.graph.node for out in node.output}
    moves = [node for node in region.graph.node if node.op_type in ("Slice", "Unsqueeze", "Expand", "Reshape", "Transpose")]
    assert {"Slice", "Expand"} <= {node.op_type for node in moves}, moves
    on_int8 = [node.name for node in moves if node.input[0] in producer and producer[node.input[0]].op_type == "QuantizeLinear"]
    assert not on_int8, on_int8
    assert _within_bound(_relative_l2(byoc.build(partitioned), quantized))


def _optimized_ops(model: onnx.ModelProto, path) -> Counter:
    """The op types of `model` as onnxruntime's graph optimizer leaves it."""
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(path)
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return Counter(node.op_type for node in onnx.load(str(path)).graph.node)


def test_the_onnxruntime_vendor_gets_the_quantized_constants_as_the_model_had_them(tmp_path):
    """A bias added on its own and a layer norm's scale stay int8 behind their DequantizeLinear
    (`Limits.quantized_as_written`), not float32 constants as dnnl takes them: onnxruntime fuses a
    quantize/dequantize unit only whole, and a quantized BERT's bias adds ran as float Adds
    between reorders (the full-size encoder 1.15x onnxruntime's time, 3.9% from its result)."""
    from byoc.codegen_json.serialize import region_to_json
    from byoc.codegen_json.to_onnx import LATEST_OPSET, graph_to_onnx
    from byoc.runtime_metadata.build import region_functions

    model = zoo.get("bert_encoder", small=True)
    quantized = quantize_static(model, [zoo.sample_inputs(model, seed=s) for s in range(4)], "uint8")
    partitioned = byoc.partition_for(byoc.from_onnx(quantized), "onnxruntime")
    ((symbol, name, func),) = region_functions(partitioned)
    region = graph_to_onnx(*region_to_json(func, symbol, name), opset=LATEST_OPSET)
    fused, handed = _optimized_ops(quantized, tmp_path / "file.onnx"), _optimized_ops(region, tmp_path / "region.onnx")
    int8_ops = [op for op in fused if op.startswith("QLinear")]
    assert int8_ops and {op: handed[op] for op in int8_ops} == {op: fused[op] for op in int8_ops}, (fused, handed)
    assert handed["Add"] == fused["Add"] and handed["Mul"] == fused["Mul"], (fused, handed)
    assert _relative_l2(byoc.build(partitioned), quantized) == [0.0, 0.0, 0.0]


def test_the_onnxruntime_vendor_writes_a_quantized_dense_layer_as_the_model_did():
    """The classifier's weights, transposed to [K, N] at import, go back to onnxruntime as
    Gemm(A, DequantizeLinear([N, K] per row), transB=1) with an int32 bias: per column, its
    DequantizeLinear ran on every call (4.7 ms of MobileNetV2's 7.3 with s8 activations)."""
    from byoc.codegen_json.serialize import region_to_json
    from byoc.codegen_json.to_onnx import LATEST_OPSET, graph_to_onnx
    from byoc.runtime_metadata.build import region_functions

    model = _quantized("mobilenet_v2", "int8")
    partitioned = byoc.partition_for(byoc.from_onnx(model), "onnxruntime")
    ((symbol, name, func),) = region_functions(partitioned)
    region = graph_to_onnx(*region_to_json(func, symbol, name), opset=LATEST_OPSET)
    producer = {out: node for node in region.graph.node for out in node.output}
    (gemm,) = [node for node in region.graph.node if node.op_type == "Gemm"]
    assert not [node for node in region.graph.node if node.op_type == "MatMul"]
    weights, bias = producer[gemm.input[1]], producer[gemm.input[2]]
    assert weights.op_type == bias.op_type == "DequantizeLinear"
    assert onnx.helper.get_attribute_value(weights.attribute[0]) == 0
    initializers = {i.name: numpy_helper.to_array(i) for i in region.graph.initializer}
    assert initializers[bias.input[0]].dtype == np.int32
    assert _within_bound(_relative_l2(byoc.build(partitioned), model))


def test_the_onnxruntime_vendor_hands_int8_activations_over_as_uint8_where_the_cpu_has_vnni(resnet_s8, monkeypatch):
    """With VNNI, onnxruntime's int8 kernels take uint8 activations without saturating, and it
    runs s8 ones through its float kernels: the region goes to it as uint8, the same values."""
    import byoc.vendors.onnxruntime.runtime as vendor
    from byoc.timing import has_vnni

    sessions: list[onnx.ModelProto] = []

    class Recording(vendor.SessionEngine):
        def __init__(self, model_bytes, options):
            sessions.append(onnx.load_from_string(model_bytes))
            super().__init__(model_bytes, options)

    monkeypatch.setattr(vendor, "SessionEngine", Recording)
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(resnet_s8), "onnxruntime"))
    (model,) = sessions
    types = {i.name: i.data_type for i in model.graph.initializer}
    zero_points = [types[node.input[2]] for node in model.graph.node if node.op_type == "QuantizeLinear"]
    want = onnx.TensorProto.UINT8 if has_vnni() else onnx.TensorProto.INT8
    assert zero_points and set(zero_points) == {want}, zero_points
    errors = _relative_l2(compiled, resnet_s8)
    assert _within_bound(errors), errors
    assert _as_accurate_as_onnxruntime(compiled, resnet_s8, FLOAT_RESNET)


def test_weights_with_a_zero_point_stay_float_and_say_why(resnet_u8):
    model = onnx.ModelProto()
    model.CopyFrom(resnet_u8)
    weight_zero = next(i for i in model.graph.initializer if i.name.endswith("weight_zero_point") and i.data_type == onnx.TensorProto.INT8)
    values = numpy_helper.to_array(weight_zero).copy()
    values[...] = 1
    weight_zero.CopyFrom(numpy_helper.from_array(values, weight_zero.name))
    report = byoc.report(byoc.partition_for(byoc.from_onnx(model), "dnnl"))
    reasons = [r for rs in report.host_reasons().values() for r in rs]
    assert any("zero point other than 0" in r for r in reasons), reasons
    errors = _relative_l2(byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl")), model)
    assert _within_bound(errors), errors


def test_a_quantized_transformer_is_one_int8_region():
    """BERT as onnxruntime's tool quantizes it: every intermediate of the erf GELU quantized (one
    GELU kernel on the int8 data here), reshapes and transposes of the attention between a
    quantize and a dequantize of one scale (moved on the int8 data, exactly)."""
    model = zoo.get("bert_encoder", small=True)
    quantized = quantize_static(model, [zoo.sample_inputs(model, seed=s) for s in range(4)], "uint8")
    partitioned = byoc.partition_for(byoc.from_onnx(quantized), "dnnl")
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and report.offload_ratio_macs == 1.0, report.to_table()
    patterns = Counter({p: n for r in report.regions for p, n in r.patterns.items()})
    layers = sum(1 for n in model.graph.node if n.op_type == "Erf")
    assert patterns["dnnl.qgelu"] == layers, patterns
    assert [h.ops for h in report.host_ops] == [["relax.take"]], report.host_reasons()  # the embedding's int64 token ids
    compiled = byoc.build(partitioned)
    assert _as_accurate_as_onnxruntime(compiled, quantized, model)
    # The word embedding is gathered as int8, so the host keeps it int8; its token ids are still
    # checked, under the node's name.
    table = max((t for t in quantized.graph.initializer if t.name.startswith("embeddings/word")), key=lambda t: np.prod(t.dims))
    takes = [b.value for block in partitioned["main"].body.blocks for b in block.bindings if op_name(b.value) == "relax.take"]
    assert [(dtype_name(t.args[0].ty), static_shape(t.args[0].ty)) for t in takes] == [(numpy_helper.to_array(table).dtype.name, tuple(table.dims))]
    ids = zoo.sample_inputs(model, seed=1)["input_ids"].copy()
    ids[0, 3] = table.dims[0]
    with pytest.raises(IndexOutOfRangeError, match="embeddings/Gather"):
        compiled.run(input_ids=ids)


def _exported_attention() -> onnx.ModelProto:
    """Forms torch.onnx writes in a transformer, small: attention scaled by a number, the safe
    softmax (Where(IsNaN(p), 0, p)), a SiLU's product, a slice, new axis and broadcast (a Llama's
    grouped-query attention), position embeddings added as a constant, a padding mask added to
    the scores, and a RMSNorm (a product with one value per row, then with a weight along the last
    axis)."""
    builder = OnnxGraphBuilder("exported_attention", seed=5)
    x = builder.input("x", [1, 8, 16])
    keys = builder.op("Transpose", [builder.matmul(x, 16, 16, bias=False)], perm=[0, 2, 1])
    mask = builder.input("mask", [1, 1, 8])  # a padding mask over the keys, the same for every query
    scores = builder.op("Mul", [builder.op("MatMul", [builder.matmul(x, 16, 16), keys]), builder.constant("scale", np.array(0.25, np.float32))])
    p = builder.op("Softmax", [builder.op("Add", [scores, mask])], axis=-1)
    safe = builder.op("Where", [builder.op("IsNaN", [p]), builder.constant("zero", np.zeros((), np.float32)), p])
    context = builder.op("MatMul", [safe, builder.matmul(x, 16, 16, bias=False)])
    gated = builder.op("Mul", [context, builder.op("Sigmoid", [context])])
    half = builder.op("Slice", [gated, *(builder.constant(n, np.array(v, np.int64)) for n, v in (("starts", [0]), ("ends", [8]), ("axes", [2])))])
    repeated = builder.op("Expand", [builder.op("Unsqueeze", [half, builder.constant("axis", np.array([1], np.int64))]),
                                     builder.constant("repeats", np.array([1, 2, 8, 8], np.int64))])
    rows = builder.op("Reshape", [repeated, builder.constant("shape", np.array([1, 8, 16], np.int64))])
    positioned = builder.op("Add", [rows, builder.constant("position", builder.small((1, 8, 16), 0.5))])
    mean_square = builder.op("ReduceMean", [builder.op("Mul", [positioned, positioned])], axes=[-1])
    inverse_rms = builder.op("Reciprocal", [builder.op("Sqrt", [builder.op("Add", [mean_square, builder.constant("eps", np.array(1e-6, np.float32))])])])
    normed = builder.op("Mul", [builder.op("Mul", [positioned, inverse_rms]), builder.constant("norm_weight", 1.0 + builder.small((16,), 0.2))])
    builder.output(builder.matmul(normed, 16, 16))
    return builder.build()


def test_a_quantized_export_runs_on_the_int8_data_in_one_region(tmp_path):
    """onnxruntime's tool quantizes every tensor of an exported transformer, so each op between
    the int8 products reads dequantized data and writes data to quantize. Now on dnnl:
    - the safe softmax's NaN check reads a dequantized value, which is never NaN: dropped
      (it cut exported transformers into a region per layer);
    - slices, new axes and broadcasts between one scale move the int8 data, as reshapes do;
    - the attention's products of two quantized activations are int8 products, the second
      operand's uint8 moved to int8 (oneDNN takes int8 weights only);
    - a constant added, a product with a number or with a weight along the last axis, the SiLU's
      sigmoid and product, the RMSNorm's and the mask's sum (one operand int8, the other float,
      whole, per row or repeated along the leading axes) and the softmax write their result as
      int8 themselves, with no quantizing reorder after them (nor a dequantizing one before their
      int8 operand); int8 data read with one scale and quantized with another is one reorder."""
    model = _exported_attention()
    quantized = quantize_static(model, [zoo.sample_inputs(model, seed=s) for s in range(4)], "uint8")
    assert any(n.op_type == "IsNaN" and n.input[0].endswith("DequantizeLinear_Output") for n in quantized.graph.node)
    partitioned = byoc.partition_for(byoc.from_onnx(quantized), "dnnl")
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and report.offload_ratio_nodes == 1.0, report.to_table()
    patterns = Counter({p: n for r in report.regions for p, n in r.patterns.items()})
    expected = {"dnnl.qadd_constant", "dnnl.qmultiply_constant", "dnnl.qeltwise_sigmoid", "dnnl.qmultiply_float", "dnnl.qadd_float",
                "dnnl.requantize"} | ({"dnnl.softmax_quantized"} if onednn_has_avx512_core() else set())
    assert expected <= set(patterns) and patterns["dnnl.qmatmul"] == 2, patterns  # scores, and the values' weighted sum
    region = next(f for gv, f in partitioned.functions.items() if gv.name_hint.startswith("dnnl_"))
    moves = [(op_name(b.value), dtype_name(b.value.args[0].ty)) for block in region.body.blocks for b in block.bindings
             if op_name(b.value) in ("relax.strided_slice", "relax.expand_dims", "relax.broadcast_to")]
    assert sorted(moves) == [("relax.broadcast_to", "uint8"), ("relax.expand_dims", "uint8"), ("relax.strided_slice", "uint8")], moves
    compiled = byoc.build(partitioned)
    assert _as_accurate_as_onnxruntime(compiled, quantized, model)
    executed = onednn_executions(compiled, quantized, tmp_path)
    assert not [fields for fields in executed if fields[4].startswith("ref")], "oneDNN ran reference (C loop) kernels"
    results = {fields[3]: fields[6] for fields in executed if fields[3] in ("softmax", "binary")}
    # below AVX-512 oneDNN 3.2 writes an int8 softmax in its reference code: float, then a reorder
    assert ("dst_u8" if onednn_has_avx512_core() else "dst_f32") in results["softmax"] and "dst_u8" in results["binary"], results
    products = [fields[6] for fields in executed if fields[3] == "matmul"]
    source, weights = int8_product_formats()
    assert len(products) == 6 and all(source in p and weights in p for p in products), products
    # A float softmax keeps its check (the host's NaN case is the vendor's to honour).
    ops = Counter(op_name(b.value) for block in byoc.from_onnx(model)["main"].body.blocks for b in block.bindings)
    assert ops["relax.isnan"] == 1, ops


def test_the_onnxruntime_vendor_gets_the_nan_check_of_a_quantized_softmax(tmp_path):
    """dnnl drops the safe softmax's NaN check of a dequantized value (never NaN); onnxruntime
    gets the file as written (`Limits.quantized_as_written`): it picks its int8 softmax by the
    ops around it, and without the check its results moved 2.8% on a quantized BERT."""
    from byoc.runtime_metadata.build import region_functions

    model = _exported_attention()
    quantized = quantize_static(model, [zoo.sample_inputs(model, seed=s) for s in range(4)], "uint8")
    checks = {}
    for vendor in ("onnxruntime", "dnnl"):
        partitioned = byoc.partition_for(byoc.from_onnx(quantized), vendor)
        ((_, _, region),) = region_functions(partitioned)
        checks[vendor] = sum(op_name(b.value) == "relax.isnan" for block in region.body.blocks for b in block.bindings)
        if vendor == "onnxruntime":
            assert _relative_l2(byoc.build(partitioned), quantized) == [0.0, 0.0, 0.0]
    assert checks == {"onnxruntime": 1, "dnnl": 0}, checks


def _exported_feed_forward() -> onnx.ModelProto:
    """A transformer's feed-forward block as torch.onnx and onnxruntime's optimizer write it: each
    dense layer of the 3-D activations a reshape to rows, a product and a bias, a reshape back;
    the GELU op (opset 20) between the two reshapes that undo each other."""
    builder = OnnxGraphBuilder("exported_feed_forward", seed=6)
    x = builder.input("x", [1, 8, 16])

    def dense(value: str, fin: int, fout: int) -> str:
        rows = builder.op("Reshape", [value, builder.shape_constant("rows", [8, fin])])
        return builder.op("Reshape", [builder.matmul(rows, fin, fout), builder.shape_constant("tokens", [1, 8, fout])])

    builder.output(dense(builder.op("Gelu", [dense(x, 16, 64)]), 64, 16))
    return builder.build(opset=20)


def test_an_activation_between_quantized_dense_layers_runs_on_the_int8_data(tmp_path):
    """The reshapes around the GELU undo each other (folded at import), so it reads the first
    product's int8 result and writes the second's int8 source: one primitive on the int8 data,
    with no reorder to float and back, and no copy for a reshape."""
    model = _exported_feed_forward()
    quantized = quantize_static(model, [zoo.sample_inputs(model, seed=s) for s in range(4)], "uint8")
    partitioned = byoc.partition_for(byoc.from_onnx(quantized), "dnnl")
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and report.offload_ratio_nodes == 1.0, report.to_table()
    patterns = Counter({p: n for r in report.regions for p, n in r.patterns.items()})
    assert patterns["dnnl.qeltwise_gelu"] == 1 and patterns["dnnl.qdense_bias"] == 2, patterns
    region = next(f for gv, f in partitioned.functions.items() if gv.name_hint.startswith("dnnl_"))
    ops = [op_name(b.value) for block in region.body.blocks for b in block.bindings if op_name(b.value) is not None]
    assert Counter(ops) == {"relax.reshape": 2, "relax.quantize": 1, "relax.dequantize": 1}, ops  # the region's input and output
    compiled = byoc.build(partitioned)
    assert _as_accurate_as_onnxruntime(compiled, quantized, model)
    executed = onednn_executions(compiled, quantized, tmp_path)
    assert not [fields for fields in executed if fields[4].startswith("ref")], "oneDNN ran reference (C loop) kernels"
    assert Counter(fields[3] for fields in executed if fields[3] != "reorder") == {"matmul": 2, "binary": 1}, executed
    assert any("eltwise_gelu_erf" in field for fields in executed if fields[3] == "binary" for field in fields), executed
    conversions = Counter((m[0], m[1]) for fields in executed if fields[3] == "reorder"
                          for m in [re.findall(r"(?:src|dst)_(\w+?):", fields[6])] if m[0] != m[1])
    # the region's input quantized, its result dequantized; without VNNI each dense layer's too (computed in float32)
    expected = 1 if onednn_has_vnni() else 3
    assert conversions == {("f32", "u8"): expected, ("u8", "f32"): expected}, conversions


def test_a_layer_norm_reads_and_writes_int8_data_as_onnxruntime_computes_it(tmp_path):
    """LayerNormalization between a DequantizeLinear and a QuantizeLinear (a BERT's, as
    onnxruntime's tool writes it) is one oneDNN layer norm from u8 to u8: the mean takes the zero
    point away, the scale leaves only epsilon to rescale, and the result's zero point is added to
    the shift. onnxruntime's own result, to the last step."""
    builder = OnnxGraphBuilder("quantized_layer_norm", seed=7)
    x = builder.input("x", [2, 4, 16])

    def requantized(value: str, scale: float, zero: int) -> str:
        quantization = [builder.constant("scale", np.array(scale, np.float32)), builder.constant("zero", np.array(zero, np.uint8))]
        return builder.op("DequantizeLinear", [builder.op("QuantizeLinear", [value, *quantization]), *quantization])

    gamma, beta = (builder.constant(n, v) for n, v in (("gamma", 1.0 + builder.small((16,), 0.3)), ("beta", builder.small((16,), 0.3))))
    normed = builder.op("LayerNormalization", [requantized(x, 0.05, 100), gamma, beta], axis=-1)
    builder.output(requantized(normed, 0.03, 128))
    model = builder.build()
    partitioned = byoc.partition_for(byoc.from_onnx(model), "dnnl", fallback_without_macs=False)
    assert [dict(r.patterns) for r in byoc.report(partitioned).regions] == [{"dnnl.qlayer_norm": 1}]
    compiled = byoc.build(partitioned)
    inputs = {"x": np.random.default_rng(0).standard_normal((2, 4, 16)).astype(np.float32) * 2}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    np.testing.assert_allclose(np.asarray(compiled.run(inputs)[0]), want, atol=0.03 + 1e-6)  # within one step
    norms = [fields for fields in onednn_executions(compiled, model, tmp_path) if fields[3] == "layer_normalization"]
    assert len(norms) == 1 and "src_u8" in norms[0][6] and "dst_u8" in norms[0][6], norms


def test_a_model_in_quantized_operators_runs_as_its_qdq_form():
    """onnxruntime's QOperator format (QLinearConv, com.microsoft QLinearAdd, QGemm, MaxPool on
    the uint8 data), which TVM's frontend does not convert, is rewritten as dequantize -> op ->
    quantize before import: one int8 region on dnnl, and on a float vendor the same numbers as
    onnxruntime within the tolerance above."""
    model = zoo.get("resnet18", small=True)
    quantized = quantize_static(model, [zoo.sample_inputs(model, seed=s) for s in range(4)], "uint8", operators=True)
    assert any(n.op_type == "QLinearConv" for n in quantized.graph.node)
    partitioned = byoc.partition_for(byoc.from_onnx(quantized), "dnnl")
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and report.offload_ratio_nodes == 1.0, report.to_table()
    assert _as_accurate_as_onnxruntime(byoc.build(partitioned), quantized, model)
    assert _within_bound(_relative_l2(byoc.build(byoc.partition_for(byoc.from_onnx(quantized), "reference")), quantized))


def _dynamically_quantized(name: str) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    from byoc.models.quantized import quantize_dynamic

    model = zoo.get(name, small=True)
    return model, quantize_dynamic(model)


def test_a_dynamically_quantized_model_runs_its_products_in_int8(tmp_path):
    """onnxruntime's `quantize_dynamic`: MatMulInteger on activations quantized at run time by
    DynamicQuantizeLinear. Each dense layer is one int8 kernel that quantizes its input per call
    (the host took the products as an int32 matmul, 177x onnxruntime's time on a full BERT, then
    the quantization arithmetic cut the model into 84 regions)."""
    model, quantized = _dynamically_quantized("bert_encoder")
    products = sum(1 for n in quantized.graph.node if n.op_type == "MatMulInteger")
    partitioned = byoc.partition_for(byoc.from_onnx(quantized), "dnnl")
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and report.offload_ratio_macs == 1.0, report.to_table()
    patterns = Counter({p: n for r in report.regions for p, n in r.patterns.items()})
    assert patterns["dnnl.qdense_dynamic_bias"] == products, patterns
    compiled = byoc.build(partitioned)
    assert _within_bound(_relative_l2(compiled, quantized))
    assert _as_accurate_as_onnxruntime(compiled, quantized, model)
    # without VNNI the quantized input is read back as float32 for a float product (byoc.processing.saturation),
    # beside the attention's float products
    source, weights = int8_product_formats()
    expected = products if onednn_has_vnni() else products + sum(1 for n in quantized.graph.node if n.op_type == "MatMul")
    products_run = [f for f in onednn_executions(compiled, quantized, tmp_path) if f[3] == "matmul" and source in f[6]]
    assert len(products_run) == expected and all(weights in f[6] for f in products_run), products_run[:2]


def test_a_dynamically_quantized_cnn_runs_its_convolutions_in_int8(tmp_path):
    """`quantize_dynamic` on a CNN: ConvInteger on activations quantized at run time. Each
    convolution is one int8 kernel that quantizes its input per call, its batch normalisation and
    ReLU post-ops (they were float convolutions between the host's run-time quantizations: 21
    regions on ResNet-18). The onnxruntime
    vendor runs each as a float convolution over weights dequantized once (its ConvInteger is
    the slower kernel), one region too."""
    model, quantized = _dynamically_quantized("resnet18")
    convolutions = sum(1 for n in quantized.graph.node if n.op_type == "ConvInteger")
    partitioned = byoc.partition_for(byoc.from_onnx(quantized), "dnnl")
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and not report.host_ops, report.to_table()
    patterns = Counter({p: n for r in report.regions for p, n in r.patterns.items()})
    # each with its batch normalisation and ReLU as post-ops (the float model folds them into its weights)
    assert patterns["dnnl.qconv2d_dynamic_bn_act"] + patterns["dnnl.qconv2d_dynamic_bn"] == convolutions, patterns
    assert patterns["dnnl.qconv2d_dynamic_bn_act"] > 0, patterns
    compiled = byoc.build(partitioned)
    assert _within_bound(_relative_l2(compiled, quantized))
    assert _as_accurate_as_onnxruntime(compiled, quantized, model)
    run = [f for f in onednn_executions(compiled, quantized, tmp_path) if f[3] == "convolution"]
    assert len(run) == convolutions and all("src_u8" in f[6] and "wei_s8" in f[6] for f in run), run[:2]
    on_onnxruntime = byoc.partition_for(byoc.from_onnx(quantized), "onnxruntime")
    assert len(byoc.report(on_onnxruntime).regions) == 1
    assert max(_relative_l2(byoc.build(on_onnxruntime), quantized)) < 0.02


def test_the_onnxruntime_vendor_runs_a_dynamically_quantized_model_as_onnxruntime_does():
    """The zero point DynamicQuantizeLinear computes is cast to uint8: a vendor that declares
    uint8 takes that cast, so the run-time quantization does not cut the model at each layer.
    The hand-off writes each layer back as the file had it (one DynamicQuantizeLinear per input,
    MatMulInteger), which onnxruntime fuses into its DynamicQuantizeMatMul: its own numbers."""
    from byoc.codegen_json.serialize import region_to_json
    from byoc.codegen_json.to_onnx import LATEST_OPSET, graph_to_onnx
    from byoc.runtime_metadata.build import region_functions

    _, quantized = _dynamically_quantized("bert_encoder")
    partitioned = byoc.partition_for(byoc.from_onnx(quantized), "onnxruntime")
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and [h.ops for h in report.host_ops] == [["relax.take"]], report.host_reasons()
    ((symbol, name, func),) = region_functions(partitioned)
    ops = Counter(n.op_type for n in graph_to_onnx(*region_to_json(func, symbol, name), opset=LATEST_OPSET).graph.node)
    products = sum(1 for n in quantized.graph.node if n.op_type == "MatMulInteger")
    quantizations = sum(1 for n in quantized.graph.node if n.op_type == "DynamicQuantizeLinear")
    assert ops["MatMulInteger"] == products and ops["DynamicQuantizeLinear"] == quantizations and not ops["ReduceMax"], ops
    assert max(_relative_l2(byoc.build(partitioned), quantized)) < 1e-5


def test_a_dense_layer_quantized_at_run_time_is_exact_and_takes_an_all_zero_input():
    """The integer product of one layer is onnxruntime's to float rounding; an all-zero input
    (scale 0 by DynamicQuantizeLinear's formula) gives the bias, as onnxruntime does."""
    from byoc.frontend.onnx.qoperator import qdq_form

    _, quantized = _dynamically_quantized("mlp")
    assert any(n.op_type == "DynamicQuantizeLinear" for n in qdq_form(quantized).graph.node)
    partitioned = byoc.partition_for(byoc.from_onnx(quantized), "dnnl")
    patterns = Counter({p: n for r in byoc.report(partitioned).regions for p, n in r.patterns.items()})
    assert patterns["dnnl.qdense_dynamic_bias"] == sum(1 for n in quantized.graph.node if n.op_type == "MatMulInteger"), patterns
    compiled = byoc.build(partitioned)
    session = ort.InferenceSession(quantized.SerializeToString(), providers=["CPUExecutionProvider"])
    for inputs in (zoo.sample_inputs(quantized, seed=3), {k: np.zeros_like(v) for k, v in zoo.sample_inputs(quantized).items()}):
        want, got = session.run(None, inputs)[0], compiled.run(inputs)[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def test_precision_int8_quantizes_a_float_model_for_dnnl():
    # byoc calibrates and quantizes the float model itself, as onnxruntime's tool would: one
    # region, every convolution an int8 composite, as accurate as onnxruntime's own quantization.
    samples = [zoo.sample_inputs(FLOAT_RESNET, seed=s) for s in range(8)]
    partitioned = byoc.partition_for(byoc.from_onnx(FLOAT_RESNET), "dnnl", precision="int8", calibration=samples)
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and report.offload_ratio_nodes == 1.0, report.to_table()
    patterns = Counter({p: n for r in report.regions for p, n in r.patterns.items()})
    convolutions = sum(1 for n in FLOAT_RESNET.graph.node if n.op_type == "Conv")
    assert sum(n for p, n in patterns.items() if p.startswith("dnnl.qconv2d")) == convolutions, patterns
    assert patterns["dnnl.qconv2d_bias_add_relu"] > 0 and patterns["dnnl.qmax_pool2d"] == 1, patterns
    compiled = byoc.build(partitioned)
    session = ort.InferenceSession(FLOAT_RESNET.SerializeToString(), providers=["CPUExecutionProvider"])
    ours = onnxruntimes = 0.0
    # Without VNNI both quantize weights to 7 bits: byoc itself, and onnxruntime as its docs advise
    # for such CPUs (with 8 bits its own int8 kernels saturate there).
    peer = quantize_static(FLOAT_RESNET, samples, "uint8", reduce_range=not onednn_has_vnni())
    quantized = ort.InferenceSession(peer.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in (100, 101, 102):
        inputs = zoo.sample_inputs(FLOAT_RESNET, seed=seed)
        exact = session.run(None, inputs)[0]
        ours += float(np.linalg.norm(compiled.run(inputs)[0] - exact) / np.linalg.norm(exact)) / 3
        onnxruntimes += float(np.linalg.norm(quantized.run(None, inputs)[0] - exact) / np.linalg.norm(exact)) / 3
    assert ours <= onnxruntimes + 0.005, (ours, onnxruntimes)


def test_precision_int8_keeps_a_transformer_whole():
    """byoc quantizes BERT's dense layers; each erf GELU between them stays one float kernel with
    its result quantized after it. A product that writes its quantized result itself (see
    dnnl.int8.declare_results) once took the GELU's last multiply, leaving its erf on the host:
    3 regions here, 13 at full size."""
    model = zoo.get("bert_encoder", small=True)
    samples = [zoo.sample_inputs(model, seed=s) for s in range(4)]
    report = byoc.report(byoc.partition_for(byoc.from_onnx(model), "dnnl", precision="int8", calibration=samples))
    assert len(report.regions) == 1 and report.offload_ratio_macs == 1.0, report.to_table()
    patterns = Counter({p: n for r in report.regions for p, n in r.patterns.items()})
    assert patterns["dnnl.gelu"] == sum(1 for n in model.graph.node if n.op_type == "Erf"), patterns


def test_precision_int8_refusals_name_the_cause(resnet_u8):
    mod = byoc.from_onnx(FLOAT_RESNET)
    with pytest.raises(byoc.errors.PartitionError, match="precision must be one of"):
        byoc.partition_for(mod, "dnnl", precision="int4")
    with pytest.raises(byoc.errors.QuantizationError, match="calibration"):
        byoc.partition_for(mod, "dnnl", precision="int8")
    with pytest.raises(byoc.errors.PartitionError, match="quantize at compile time anyway"):
        byoc.partition_for(mod, "vitis_ai", precision="int8", calibration=[zoo.sample_inputs(FLOAT_RESNET)])
    with pytest.raises(byoc.errors.PartitionError, match="quantized already"):
        byoc.partition_for(byoc.from_onnx(resnet_u8), "dnnl", precision="int8", calibration=[zoo.sample_inputs(FLOAT_RESNET)])


def test_precision_auto_keeps_the_measured_error_within_the_budget():
    samples = [zoo.sample_inputs(FLOAT_RESNET, seed=s) for s in range(3)]
    mod = byoc.from_onnx(FLOAT_RESNET)
    fp32 = byoc.build(byoc.partition_for(mod, "dnnl"))  # what the error is measured against
    want = [fp32.run(s)[0] for s in samples]
    # no budget for int8 at all: every layer stays fp32; a generous one: the whole model in int8
    for budget, int8_layers in ((1e-6, 0), (0.5, 21)):
        partitioned = byoc.partition_for(mod, "dnnl", precision="auto", max_rel_l2=budget, calibration=samples)
        report = byoc.precision_report(partitioned)
        assert sum(s.layers for s in report.segments if s.chosen == "int8") == int8_layers, report.to_table()
        patterns = Counter({p: n for r in byoc.report(partitioned).regions for p, n in r.patterns.items()})
        assert sum(n for p, n in patterns.items() if p.startswith(("dnnl.qconv", "dnnl.qdense"))) == int8_layers, patterns
        got = [byoc.build(partitioned).run(s)[0] for s in samples]
        error = float(np.sqrt(sum(np.sum((g - w) ** 2) for g, w in zip(got, want)) / sum(np.sum(w ** 2) for w in want)))
        assert error <= budget + 1e-6 and abs(error - report.rel_l2) < 1e-3, (error, report.to_table())
    assert "all int8" in report.to_table() and report.fp32_ms > 0


def test_int8_layers_between_fp32_ones_run_in_oneDNN_jit_kernels(tmp_path):
    """Some of a model's layers in int8, as precision chosen per segment leaves them: where a
    residual add is quantized from float32 data, the quantize wrote plain NCHW, and the int8
    convolution that adds it, NHWC, ran in oneDNN's reference code (3.4 ms instead of 0.02 on
    the small ResNet-18). The residual is brought into the convolution's layout first."""
    from byoc.processing.quantize_model import int8_plan, quantize_model
    from byoc.runtime_metadata.calibration import value_ranges

    mod = byoc.from_onnx(FLOAT_RESNET)
    samples = [zoo.sample_inputs(FLOAT_RESNET, seed=s) for s in range(2)]
    names = {b.var.id_: b.var.name for b in mod["main"].body.blocks[0].bindings}
    layers = frozenset(i for i in int8_plan(mod).order
                       if names[i] in ("layer1/block0/Conv", "layer1/block0/Conv_1", "layer1/block1/Conv"))
    plan = int8_plan(mod, layers)
    quantized = quantize_model(mod, plan, value_ranges(mod, plan.calibrated, samples, backends=[byoc.get_backend("dnnl")]))
    partitioned = byoc.partition_for(quantized, "dnnl")
    assert len(byoc.report(partitioned).regions) == 1
    compiled = byoc.build(partitioned)
    convolutions = [e for e in onednn_executions(compiled, FLOAT_RESNET, tmp_path) if e[3] == "convolution"]
    int8 = [e for e in convolutions if "src_u8" in e[6]]
    assert len(int8) == 3 and any("binary_add" in ",".join(e) for e in int8), int8
    assert not [e for e in convolutions if e[4].startswith("ref")], [e[4:7] for e in convolutions]
    want = byoc.build(byoc.partition_for(mod, "dnnl")).run(samples[0])[0]
    got = compiled.run(samples[0])[0]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.02


@pytest.mark.parametrize("vendor", ["dnnl", "onnxruntime"])
def test_conv_integer_of_weights_computed_at_run_time_is_imported(vendor):
    """Wav2Vec2's positional convolution normalises its weight per call, so `quantize_dynamic`
    quantizes that weight with DynamicQuantizeLinear too: ConvInteger of two run-time tensors,
    which import refused. It is computed in float, both operands centred per call."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(4)
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("Mul", ["v", "g"], ["w"]),
             helper.make_node("DynamicQuantizeLinear", ["w"], ["wq", "ws", "wz"]),
             helper.make_node("ConvInteger", ["xq", "wq", "xz", "wz"], ["yi"], pads=[1, 1], group=2),
             helper.make_node("Cast", ["yi"], ["yf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["xs", "ws"], ["s"]), helper.make_node("Mul", ["yf", "s"], ["y"])]
    graph = helper.make_graph(nodes, "run_time_weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 16]),
                                                          helper.make_tensor_value_info("g", TensorProto.FLOAT, [1, 1, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6, 16])],
                              [numpy_helper.from_array(rng.standard_normal((6, 2, 3)).astype(np.float32), "v")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inputs = {"x": rng.standard_normal((1, 4, 16)).astype(np.float32), "g": np.array([[[0.7]]], np.float32)}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    got = byoc.build(byoc.partition_for(byoc.from_onnx(model), vendor)).run(inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_a_quantize_dynamic_model_saved_optimized_by_onnxruntime_is_one_int8_region(tmp_path):
    """onnxruntime fuses `quantize_dynamic`'s dense layers into com.microsoft DynamicQuantizeMatMul
    and, where products share a quantized input, MatMulIntegerToFloat, and saves them so
    (`optimized_model_filepath`): both are written back as the input quantized at run time times
    the int8 weights, which dnnl runs as int8 products."""
    from onnx import TensorProto, helper
    from onnxruntime.quantization import quantize_dynamic

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal((32, 32)) * 0.2).astype(np.float32), f"w{i}") for i in range(3)]
    bias = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["p0"]), helper.make_node("MatMul", ["x", "w1"], ["p1"]),  # one input, two products
             helper.make_node("Add", ["p0", "p1"], ["s"]), helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["p2"]), helper.make_node("Add", ["p2", "b"], ["y"])]
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])], [*weights, bias])
    source, quantized, saved = (str(tmp_path / name) for name in ("dense.onnx", "dynamic.onnx", "saved.onnx"))
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), source)
    quantize_dynamic(source, quantized)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = saved
    ort.InferenceSession(quantized, options, providers=["CPUExecutionProvider"])
    fused = Counter(n.op_type for n in onnx.load(saved).graph.node if n.domain == "com.microsoft")
    assert fused.keys() & {"DynamicQuantizeMatMul", "MatMulIntegerToFloat"}, fused
    partitioned = byoc.partition_for(byoc.from_onnx(saved), "dnnl")
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and report.offload_ratio_macs == 1.0, report.to_table()
    x = rng.standard_normal((8, 32)).astype(np.float32)
    got = byoc.build(partitioned).run(x=x)[0]
    want = ort.InferenceSession(saved, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_quantized_softmax_and_where_as_onnxruntime_saves_them():
    """com.microsoft QLinearSoftmax and QLinearWhere (a quantize_static transformer that
    onnxruntime saved optimized): dequantize, the float op, quantize."""
    from onnx import TensorProto, helper

    scalar = lambda name, value, dtype: numpy_helper.from_array(np.array(value, dtype), name)  # noqa: E731
    constants = [scalar("xs", 0.05, np.float32), scalar("xz", 128, np.uint8), scalar("ys", 1 / 256, np.float32),
                 scalar("yz", 0, np.uint8), scalar("zs", 1 / 256, np.float32), scalar("zz", 0, np.uint8)]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["q"]),
             helper.make_node("QLinearSoftmax", ["q", "xs", "xz", "ys", "yz"], ["p"], domain="com.microsoft", axis=-1, opset=13),
             helper.make_node("QLinearWhere", ["keep", "p", "ys", "yz", "q", "xs", "xz", "zs", "zz"], ["w"], domain="com.microsoft"),
             helper.make_node("DequantizeLinear", ["w", "zs", "zz"], ["y"])]
    graph = helper.make_graph(nodes, "softmax", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8]),
                                                 helper.make_tensor_value_info("keep", TensorProto.BOOL, [2, 4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8])], constants)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal((2, 4, 8)).astype(np.float32), "keep": rng.random((2, 4, 8)) > 0.3}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)[0]
    for vendor in ("dnnl", "onnxruntime"):
        got = byoc.build(byoc.partition_for(byoc.from_onnx(model), vendor)).run(**inputs)[0]
        np.testing.assert_allclose(got, want, atol=1 / 256 + 1e-6)  # one step of the output's scale
