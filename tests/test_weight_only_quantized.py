"""Weights quantized in blocks of 2-, 4- or 8-bit codes (onnxruntime's `MatMulNBitsQuantizer`: its
com.microsoft MatMulNBits, or int4 DequantizeLinear with a block size in QDQ form): dequantized
once at import, as onnxruntime's kernel dequantizes them, so that a vendor multiplies in float;
each against onnxruntime on the same file."""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import QuantFormat
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

import byoc
from byoc.errors import ModelLoadError
from byoc.frontend.onnx.nbits import dequantized_weight

K, N, ROWS = 256, 96, 8


def _dense_model() -> onnx.ModelProto:
    """Two dense layers with a bias and a ReLU between them."""
    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)
               for name, shape in (("w1", (K, N)), ("w2", (N, K)))]
    bias = numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, ROWS, K])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, ROWS, K])], [*weights, bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


def _quantized(**options) -> onnx.ModelProto:
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    quantizer = MatMulNBitsQuantizer(_dense_model(), **options)
    quantizer.process()
    return quantizer.model.model


def _x() -> np.ndarray:
    return np.random.default_rng(1).standard_normal((2, ROWS, K)).astype(np.float32)


def _rel_l2(actual, expected) -> float:
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def _onnxruntime(model, x, **config) -> np.ndarray:
    options = ort.SessionOptions()
    for key, value in config.items():
        options.add_session_config_entry(key, value)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.mark.parametrize("bits, symmetric, block_size", [(4, True, 32), (4, False, 128), (8, True, 64), (8, False, 32)])
def test_matmul_nbits_is_a_float_product_on_dnnl_as_onnxruntime_computes_it(bits, symmetric, block_size):
    model = _quantized(bits=bits, block_size=block_size, is_symmetric=symmetric)
    assert [n.op_type for n in model.graph.node].count("MatMulNBits") == 2
    partitioned = byoc.partition_for(byoc.from_onnx(model), "dnnl")
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and report.offload_ratio_macs == 1.0, report.to_table()
    x = _x()
    got = byoc.build(partitioned).run(x=x)[0]
    assert _rel_l2(got, _onnxruntime(model, x)) < 1e-6  # the same dequantized weights, in float


def test_at_accuracy_level_4_onnxruntime_quantizes_the_activations_and_byoc_does_not():
    """onnxruntime multiplies in int8 at accuracy level 4; byoc in float, nearer the float model."""
    model, x = _quantized(bits=4, block_size=32, accuracy_level=4), _x()
    got = byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl")).run(x=x)[0]
    float_model = ort.InferenceSession(_dense_model().SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    theirs = _onnxruntime(model, x)
    assert _rel_l2(got, theirs) < 0.02
    assert _rel_l2(got, float_model) < _rel_l2(theirs, float_model)


def test_int4_weights_in_qdq_form_are_dequantized_by_block():
    """DequantizeLinear of an int4 initializer with a block size (opset 21): TVM reads neither."""
    model, x = _quantized(bits=4, block_size=32, is_symmetric=False, quant_format=QuantFormat.QDQ), _x()
    assert any(init.data_type == TensorProto.UINT4 for init in model.graph.initializer)
    partitioned = byoc.partition_for(byoc.from_onnx(model), "dnnl")
    assert byoc.report(partitioned).offload_ratio_macs == 1.0
    got = byoc.build(partitioned).run(x=x)[0]
    # onnxruntime fuses the pair into MatMulNBits at accuracy level 4 unless told otherwise
    assert _rel_l2(got, _onnxruntime(model, x, **{"session.qdq_matmulnbits_accuracy_level": "0"})) < 1e-6


def test_zero_points_as_numbers_and_groups_per_row():
    """Zero points of the scales' type, and g_idx giving each row of K its group."""
    rng = np.random.default_rng(2)
    k, n, block = 64, 8, 16
    packed = rng.integers(0, 256, (n, k // block, block // 2), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, (n, k // block)).astype(np.float32)
    zeros = rng.uniform(6, 9, (n, k // block)).astype(np.float32)
    groups = rng.permutation(np.arange(k) // block).astype(np.int32)
    weight = dequantized_weight(packed, scales, zeros, groups, k, n, 4, block)
    codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(n, k).astype(np.float32)
    expected = ((codes - zeros[:, groups]) * scales[:, groups]).T
    np.testing.assert_allclose(weight, expected, rtol=1e-6)


def test_weights_computed_at_run_time_are_refused_by_node():
    node = helper.make_node("MatMulNBits", ["x", "codes", "scales"], ["y"], name="proj", domain="com.microsoft",
                            K=32, N=4, bits=4, block_size=32)
    graph = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32]),
                                                helper.make_tensor_value_info("codes", TensorProto.UINT8, [4, 1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                              [numpy_helper.from_array(np.ones((4, 1), np.float32), "scales")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(ModelLoadError, match="'proj' \\(com.microsoft MatMulNBits\\): its weights, scales and zero points must "
                                             "be constants; \\['codes'\\] are computed at run time"):
        byoc.from_onnx(model)


@pytest.mark.parametrize("quant_type", [0, 1], ids=["FP4", "NF4"])
def test_matmul_bnb4_weights_are_bitsandbytes_codes_scaled_per_block(quant_type):
    from onnxruntime.quantization.matmul_bnb4_quantizer import MatMulBnb4Quantizer

    logging.getLogger("onnxruntime.quantization.matmul_bnb4_quantizer").setLevel(logging.WARNING)
    quantizer = MatMulBnb4Quantizer(_dense_model(), quant_type, 64)
    quantizer.process()
    model, x = quantizer.model.model, _x()
    assert [n.op_type for n in model.graph.node].count("MatMulBnb4") == 2
    partitioned = byoc.partition_for(byoc.from_onnx(model), "dnnl")
    assert byoc.report(partitioned).offload_ratio_macs == 1.0
    assert _rel_l2(byoc.build(partitioned).run(x=x)[0], _onnxruntime(model, x)) < 1e-6


@pytest.mark.parametrize("symmetric", [True, False])
def test_a_quantized_embedding_is_a_gather_from_the_dequantized_table(symmetric):
    """GatherBlockQuantized: the quantizer's embeddings, uint4 codes by block along the width."""
    rng = np.random.default_rng(3)
    table = numpy_helper.from_array((rng.standard_normal((50, K)) * 0.1).astype(np.float32), "table")
    weight = numpy_helper.from_array((rng.standard_normal((K, N)) * 0.1).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("Gather", ["table", "ids"], ["e"], axis=0), helper.make_node("MatMul", ["e", "w"], ["y"])],
                              "embed", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, ROWS])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, ROWS, N])], [table, weight])
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    quantizer = MatMulNBitsQuantizer(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), bits=4, block_size=32,
                                     is_symmetric=symmetric, op_types_to_quantize=("MatMul", "Gather"),
                                     quant_axes=(("Gather", 1), ("MatMul", 0)))
    quantizer.process()
    model = quantizer.model.model
    assert {n.op_type for n in model.graph.node} == {"GatherBlockQuantized", "MatMulNBits"}
    ids = rng.integers(0, 50, (2, ROWS)).astype(np.int64)
    got = byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl")).run(ids=ids)[0]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    assert _rel_l2(got, want) < 1e-6
