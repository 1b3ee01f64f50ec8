"""onnxruntime's fused transformer ops (com.microsoft Attention, EmbedLayerNormalization,
SkipLayerNormalization, the GELUs, ...) written in standard ONNX at import: each against
onnxruntime's own kernel, at the opsets that write layer norms and reductions differently, and an
exported BERT after onnxruntime's transformer optimizer, whole on dnnl."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from legacy_export import BERT_INPUTS, bert_inputs, legacy_bert
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc.errors import ModelLoadError

from conftest import assert_fp32_close, onnxruntime_outputs

B, S, H, HEADS = 2, 6, 16, 2
F = TensorProto.FLOAT
I32 = TensorProto.INT32


def _model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "contrib", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)])


def _weights(name, *shape, seed=0):
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.3, name)


def _tensor(name, dtype, shape):
    return helper.make_tensor_value_info(name, dtype, shape)


def _check(model, inputs, vendors=("dnnl", "onnxruntime")):
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    for vendor in vendors:
        assert_fp32_close(byoc.build(byoc.partition_for(byoc.from_onnx(model), vendor)).run(inputs), want)


def _x(*shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("opset", [13, 17])
@pytest.mark.parametrize("form", ["plain", "bias_and_sum", "simplified"])
def test_skip_layer_normalization(opset, form):
    simplified = form == "simplified"
    op = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
    inputs = ["x", "skip", "gamma"] + ([] if simplified else ["beta"]) + (["bias"] if form != "plain" else [])
    outputs = ["y", "", "", "sum"] if form == "bias_and_sum" else ["y"]
    node = helper.make_node(op, inputs, outputs, domain="com.microsoft", epsilon=1e-5, name="skip_norm")
    values = [_tensor("y", F, [B, S, H])] + ([_tensor("sum", F, [B, S, H])] if "sum" in outputs else [])
    initializers = [_weights("gamma", H, seed=2), _weights("beta", H, seed=3), _weights("bias", H, seed=4)]
    model = _model([node], [_tensor("x", F, [B, S, H]), _tensor("skip", F, [B, S, H])], values,
                   [i for i in initializers if i.name in inputs], opset)
    _check(model, {"x": _x(B, S, H), "skip": _x(B, S, H, seed=5)})


@pytest.mark.parametrize("op, opset", [("SkipSimplifiedLayerNormalization", 17), ("SkipLayerNormalization", 13),
                                       ("SkipLayerNormalization", 17)])
def test_a_norm_between_products_stays_in_their_dnnl_region(op, opset):
    """Written in the form exporters write (before opset 17, LayerNormalization's own
    decomposition), so dnnl's patterns take it as they take an export's."""
    names = ["m", "x", "gamma"] + (["beta"] if op == "SkipLayerNormalization" else [])
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m"]), helper.make_node(op, names, ["n"], domain="com.microsoft", epsilon=1e-5),
             helper.make_node("MatMul", ["n", "w2"], ["y"])]
    initializers = [_weights("w1", H, H), _weights("w2", H, H, seed=3), _weights("gamma", H, seed=2), _weights("beta", H, seed=4)]
    model = _model(nodes, [_tensor("x", F, [B, S, H])], [_tensor("y", F, [B, S, H])],
                   [i for i in initializers if i.name in (*names, "w1", "w2")], opset)
    report = byoc.report(byoc.partition_for(byoc.from_onnx(model), "dnnl"))
    assert len(report.regions) == 1 and not report.host_ops, report.to_table()
    _check(model, {"x": _x(B, S, H)}, vendors=("dnnl",))


def test_simplified_layer_normalization_and_the_gelus():
    nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "gamma"], ["n"], epsilon=1e-6, axis=-1),
             helper.make_node("BiasGelu", ["n", "bias"], ["a"], domain="com.microsoft"),
             helper.make_node("FastGelu", ["a", "bias"], ["b"], domain="com.microsoft"),
             helper.make_node("FastGelu", ["b"], ["c"], domain="com.microsoft"),
             helper.make_node("Gelu", ["c"], ["d"], domain="com.microsoft"),
             helper.make_node("QuickGelu", ["d"], ["y"], domain="com.microsoft", alpha=1.5)]
    model = _model(nodes, [_tensor("x", F, [B, S, H])], [_tensor("y", F, [B, S, H])],
                   [_weights("gamma", H, seed=2), _weights("bias", H, seed=3)])
    _check(model, {"x": _x(B, S, H)})


@pytest.mark.parametrize("with_mask", [True, False])
def test_embed_layer_normalization(with_mask):
    names = ["ids", "segments", "words", "positions", "segment_table", "gamma", "beta"] + (["mask"] if with_mask else [])
    node = helper.make_node("EmbedLayerNormalization", names, ["y", "mask_index", "sum"], domain="com.microsoft", epsilon=1e-12)
    inputs = [_tensor("ids", I32, [B, S]), _tensor("segments", I32, [B, S])] + ([_tensor("mask", I32, [B, S])] if with_mask else [])
    outputs = [_tensor("y", F, [B, S, H]), _tensor("mask_index", I32, [B]), _tensor("sum", F, [B, S, H])]
    model = _model([node], inputs, outputs, [_weights("words", 20, H), _weights("positions", 16, H, seed=2),
                                             _weights("segment_table", 2, H, seed=3), _weights("gamma", H, seed=4),
                                             _weights("beta", H, seed=5)])
    rng = np.random.default_rng(6)
    feed = {"ids": rng.integers(0, 20, (B, S)).astype(np.int32), "segments": rng.integers(0, 2, (B, S)).astype(np.int32)}
    if with_mask:
        feed["mask"] = np.array([[1] * S, [1] * (S - 2) + [0, 0]], np.int32)
    _check(model, feed)


def _attention_model(mask_shape=None, unidirectional=0, attention_bias=False, **attrs):
    inputs = [_tensor("x", F, [B, S, H])]
    names = ["x", "w", "b", "mask" if mask_shape else ""]
    if mask_shape:
        inputs.append(_tensor("mask", I32, mask_shape))
    if attention_bias:
        names += ["", "attention_bias"]
        inputs.append(_tensor("attention_bias", F, [B, HEADS, S, S]))
    sizes = attrs.get("qkv_hidden_sizes", [H, H, H])
    node = helper.make_node("Attention", names, ["y"], domain="com.microsoft", num_heads=HEADS, unidirectional=unidirectional,
                            **attrs)
    return _model([node], inputs, [_tensor("y", F, [B, S, sizes[2]])], [_weights("w", H, sum(sizes)), _weights("b", sum(sizes), seed=2)])


ATTENTION_CASES = {
    "no mask": (None, {}),
    "mask of lengths": ([B], {}),
    "mask of ends and starts": ([2 * B], {}),
    "raw mask": ([B, S], {}),
    "mask per query": ([B, S, S], {}),
    "causal, with a raw mask": ([B, S], {"unidirectional": 1}),
    "scale, sizes and filter value": ([B, S], {"scale": 0.5, "qkv_hidden_sizes": [H, H, 8], "mask_filter_value": -2.0}),
    "attention bias": (None, {"attention_bias": True}),
}


@pytest.mark.parametrize("case", list(ATTENTION_CASES))
def test_attention_as_onnxruntime_computes_it(case):
    mask_shape, attrs = ATTENTION_CASES[case]
    model = _attention_model(mask_shape, **attrs)
    feed = {"x": _x(B, S, H)}
    if mask_shape == [B]:
        feed["mask"] = np.array([S, S - 2], np.int32)
    elif mask_shape == [2 * B]:
        feed["mask"] = np.array([S, S - 1, 0, 2], np.int32)
    elif mask_shape:
        feed["mask"] = (np.random.default_rng(7).random(mask_shape) > 0.3).astype(np.int32)
        feed["mask"][..., 0] = 1
    if attrs.get("attention_bias"):
        feed["attention_bias"] = _x(B, HEADS, S, S, seed=8)
    _check(model, feed)


def test_attention_forms_byoc_does_not_write_are_refused_by_node():
    past = _attention_model()
    past.graph.node[0].input.extend(["past"])
    past.graph.input.append(_tensor("past", F, [2, B, HEADS, 3, H // HEADS]))
    with pytest.raises(ModelLoadError, match=r"node '.*' \(com.microsoft Attention\): attention with a past key/value state"):
        byoc.from_onnx(past)
    four_d = _attention_model([B, 1, S, S])
    with pytest.raises(ModelLoadError, match="a mask of rank 4 is not supported"):
        byoc.from_onnx(four_d)


def _optimized_bert(tmp_path):
    from onnxruntime.transformers.optimizer import optimize_model

    onnx.save(legacy_bert(tmp_path, layers=2, width=64, heads=4, attention="eager"), tmp_path / "bert.onnx")
    return optimize_model(str(tmp_path / "bert.onnx"), model_type="bert", num_heads=4, hidden_size=64).model


@pytest.mark.parametrize("per_channel", [False, True])
def test_an_optimized_bert_quantized_dynamically_runs_its_products_in_int8(per_channel, tmp_path):
    """quantize_dynamic of an optimized BERT writes QEmbedLayerNormalization (int8 tables) and
    QAttention (int8 packed weights on activations quantized at run time): written as their
    dequantized float ops, and the products int8 on dnnl as for any quantize_dynamic model."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    onnx.save(_optimized_bert(tmp_path), tmp_path / "optimized.onnx")
    quantize_dynamic(str(tmp_path / "optimized.onnx"), str(tmp_path / "quantized.onnx"), weight_type=QuantType.QInt8,
                     per_channel=per_channel, extra_options={"DefaultTensorType": TensorProto.FLOAT})
    model = onnx.load(tmp_path / "quantized.onnx")
    assert {"QAttention", "QEmbedLayerNormalization"} <= {n.op_type for n in model.graph.node}
    partitioned = byoc.partition_for(byoc.from_onnx(model, shapes={name: [2, 16] for name in BERT_INPUTS}), "dnnl")
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and report.offload_ratio_macs == 1.0, report.to_table()
    assert any(p.startswith("dnnl.qdense_dynamic") for p in report.regions[0].patterns), report.regions[0].patterns
    feed = bert_inputs(2, 16, seed=3)
    got, want = byoc.build(partitioned).run(feed)[0], onnxruntime_outputs(model, feed)[0]
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-3  # the same int8 products; float sums in another order


def test_an_optimized_bert_runs_whole_on_dnnl(tmp_path):
    """An exported BERT through onnxruntime's transformer optimizer (EmbedLayerNormalization,
    Attention with the mask's lengths, SkipLayerNormalization, BiasGelu): one dnnl region with
    every MAC, at several shapes of one artifact, with a padded row."""
    model = _optimized_bert(tmp_path)
    fused = {n.op_type for n in model.graph.node if n.domain == "com.microsoft"}
    assert {"Attention", "EmbedLayerNormalization", "SkipLayerNormalization"} <= fused, fused
    partitioned = byoc.partition_for(byoc.from_onnx(model, dims={"batch": (1, 4), "sequence": (1, 32)}), "dnnl")
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and report.offload_ratio_macs == 1.0, report.to_table()
    compiled = byoc.build(partitioned)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch, sequence in [(2, 16), (1, 5)]:
        feed = bert_inputs(batch, sequence, seed=batch)
        assert_fp32_close(compiled.run(feed), session.run(None, feed))


def _onnx_attention(mask_type=None, kv_heads=HEADS, form="4d", **attrs):
    """ONNX's own Attention (opset 23) on 4D queries, keys and values (or 3D, with head counts)."""
    d = H // HEADS
    if form == "4d":
        shapes = {"q": [B, HEADS, S, d], "k": [B, kv_heads, S, d], "v": [B, kv_heads, S, d]}
        output = [B, HEADS, S, d]
    else:
        shapes = {"q": [B, S, H], "k": [B, S, kv_heads * d], "v": [B, S, kv_heads * d]}
        output = [B, S, H]
        attrs = {**attrs, "q_num_heads": HEADS, "kv_num_heads": kv_heads}
    inputs = [_tensor(name, F, shape) for name, shape in shapes.items()]
    names = ["q", "k", "v"]
    if mask_type is not None:
        names.append("mask")
        inputs.append(_tensor("mask", mask_type, [B, 1, S, S]))
    node = helper.make_node("Attention", names, ["y"], **attrs)
    graph = helper.make_graph([node], "attention", inputs, [_tensor("y", F, output)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]), shapes


ONNX_ATTENTION_CASES = {
    "no mask": (None, {}),
    "boolean mask, a row masked whole": (TensorProto.BOOL, {}),
    "float mask": (F, {}),
    "causal, with a boolean mask": (TensorProto.BOOL, {"is_causal": 1}),
    "grouped-query, scaled": (None, {"kv_heads": 1, "scale": 0.3}),
    "3D, by its function body": (TensorProto.BOOL, {"form": "3d"}),
}


@pytest.mark.parametrize("case", list(ONNX_ATTENTION_CASES))
def test_onnx_attention_as_onnxruntime_computes_it(case):
    """Written as its opset-18 export is (softmax(Q K^T * scale + mask) V, a row masked whole
    giving 0), so the products and the softmax are one dnnl region; forms not written so (3D
    inputs here) go by the op's function body."""
    mask_type, attrs = ONNX_ATTENTION_CASES[case]
    model, shapes = _onnx_attention(mask_type, **attrs)
    rng = np.random.default_rng(9)
    feed = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}
    if mask_type == TensorProto.BOOL:
        feed["mask"] = rng.random((B, 1, S, S)) > 0.3
        feed["mask"][0, 0, 2, :] = False  # a query that sees no key
    elif mask_type == F:
        feed["mask"] = (rng.standard_normal((B, 1, S, S)) * 2).astype(np.float32)
    _check(model, feed)
    if attrs.get("form", "4d") == "4d":
        report = byoc.report(byoc.partition_for(byoc.from_onnx(model), "dnnl"))
        assert len(report.regions) == 1 and not any("relax.matmul" in h.ops or "relax.nn.softmax" in h.ops for h in report.host_ops), \
            report.to_table()


# What onnxruntime's optimizer writes into a model saved at its extended level
# (`SessionOptions.optimized_model_filepath`): Conv, Gemm and MatMul with what it fused into them.
@pytest.mark.parametrize("activation, params", [("", []), ("Relu", []), ("LeakyRelu", [0.2]), ("Clip", [-0.5, 0.7]),
                                                ("HardSigmoid", [0.3, 0.4]), ("Sigmoid", [])])
@pytest.mark.parametrize("with_sum", [False, True])
def test_fused_conv(activation, params, with_sum):
    attrs = {"activation": activation, **({"activation_params": params} if params else {})} if activation else {}
    node = helper.make_node("FusedConv", ["x", "w", "b", *(["z"] if with_sum else [])], ["y"], domain="com.microsoft",
                            name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1], **attrs)
    inputs = [_tensor("x", F, [1, 3, 8, 8])] + ([_tensor("z", F, [1, 4, 8, 8])] if with_sum else [])
    model = _model([node], inputs, [_tensor("y", F, [1, 4, 8, 8])], [_weights("w", 4, 3, 3, 3, seed=2), _weights("b", 4, seed=3)])
    _check(model, {"x": _x(1, 3, 8, 8), **({"z": _x(1, 4, 8, 8, seed=4)} if with_sum else {})})


def test_fused_gemm_and_fused_matmul():
    nodes = [helper.make_node("FusedGemm", ["x", "w", "b"], ["g"], domain="com.microsoft", transB=1, alpha=0.5,
                              activation="LeakyRelu", activation_alpha=0.1),
             helper.make_node("Reshape", ["g", "shape"], ["r"]),
             helper.make_node("FusedMatMul", ["r", "r"], ["s"], domain="com.microsoft", transB=1, alpha=0.25),
             helper.make_node("FusedMatMul", ["s", "r"], ["y"], domain="com.microsoft", transA=1)]
    initializers = [_weights("w", 12, H, seed=2), _weights("b", 12, seed=3),
                    numpy_helper.from_array(np.array([2, 3, 4], np.int64), "shape")]
    model = _model(nodes, [_tensor("x", F, [2, H])], [_tensor("y", F, [2, 3, 4])], initializers)
    _check(model, {"x": _x(2, H)})


def test_fused_ops_byoc_cannot_write_are_refused_by_node():
    conv = helper.make_node("FusedConv", ["x", "w"], ["y"], domain="com.microsoft", name="conv", kernel_shape=[1, 1],
                            activation="Softplus")
    model = _model([conv], [_tensor("x", F, [1, 3, 4, 4])], [_tensor("y", F, [1, 2, 4, 4])], [_weights("w", 2, 3, 1, 1)])
    with pytest.raises(ModelLoadError, match="'conv' \\(com.microsoft FusedConv\\): the fused activation 'Softplus' is not supported"):
        byoc.from_onnx(model)
    product = helper.make_node("FusedMatMul", ["x", "x"], ["y"], domain="com.microsoft", name="product", transBatchA=1)
    model = _model([product], [_tensor("x", F, [2, 3, 3])], [_tensor("y", F, [2, 3, 3])])
    with pytest.raises(ModelLoadError, match="'product' \\(com.microsoft FusedMatMul\\): transposed batch axes"):
        byoc.from_onnx(model)
