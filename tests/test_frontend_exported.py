"""Models as exporters write them: shape arithmetic folded to a fixed point before import.

PyTorch's legacy (TorchScript) exporter with dynamic axes computes every Reshape's target from
the Shape of the previous Reshape's result, layer after layer: each fold makes the next shape
known. Folding stopped after 8 passes and a 2-layer GPT-2 failed to import ("Reshape requires
the input new shape to be Shape"); a 12-layer one needs the chain followed 86 times.
"""

from __future__ import annotations

import numpy as np
import onnx
from legacy_export import bert_inputs, legacy_bert, legacy_gpt2
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc.frontend.onnx.evaluate_constants import fold_onnx_constants

from conftest import assert_fp32_close, onnxruntime_outputs


def _reshape_chain(links: int) -> onnx.ModelProto:
    """x (dynamic dims) reshaped `links` times, each time to the previous result's shape rotated
    (Shape -> Gather -> Reshape): each target is known only once the one before is folded."""
    nodes, value = [], "x"
    for i in range(links):
        nodes += [helper.make_node("Shape", [value], [f"shape{i}"], name=f"link{i}/Shape"),
                  helper.make_node("Gather", [f"shape{i}", "rotate"], [f"target{i}"], name=f"link{i}/Gather", axis=0),
                  helper.make_node("Reshape", [value, f"target{i}"], [f"r{i}"], name=f"link{i}/Reshape")]
        value = f"r{i}"
    nodes.append(helper.make_node("Relu", [value], ["y"], name="out/Relu"))
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b", "c"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a2", "b2", "c2"])],
                              [numpy_helper.from_array(np.array([1, 2, 0], np.int64), "rotate")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_folding_follows_a_chain_of_40_reshapes_to_the_end():
    model = _reshape_chain(40)
    folded = fold_onnx_constants(model, {"x": [2, 3, 5]})
    assert [n.op_type for n in folded.graph.node] == ["Reshape"] * 40 + ["Relu"]
    x = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model, shapes={"x": [2, 3, 5]}), "dnnl"))
    assert_fp32_close(compiled.run(x), onnxruntime_outputs(model, {"x": x}))


def test_a_legacy_gpt2_export_with_dynamic_axes_imports_and_matches_onnxruntime(tmp_path):
    model, _ = legacy_gpt2(tmp_path, layers=12, width=64, vocab=500, length=16, dynamic=True)
    assert any(n.op_type == "Shape" for n in model.graph.node)  # the shape arithmetic this test is about

    mod = byoc.from_onnx(model, shapes={"input_ids": [2, 16]})
    compiled = byoc.build(byoc.partition_for(mod, "dnnl"))
    batch = np.random.default_rng(1).integers(0, 500, (2, 16)).astype(np.int64)
    assert_fp32_close(compiled.run(batch), onnxruntime_outputs(model, {"input_ids": batch}))


def test_a_legacy_bert_export_runs_every_shape_of_its_dynamic_axes(tmp_path):
    """The legacy exporter multiplies BERT's mask by its batch size, taken from the mask's
    shape by a constant index: that value is computed with, so it is a tensor (a shape value
    was refused: "cannot handle ShapeExpr inputs")."""
    model = legacy_bert(tmp_path, layers=1, width=32, heads=2)
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model, dims={"batch": (1, 4), "sequence": (1, 32)}), "dnnl"))
    for batch, sequence in [(1, 5), (3, 17)]:
        feed = bert_inputs(batch, sequence, seed=sequence)
        assert_fp32_close(compiled.run(feed), onnxruntime_outputs(model, feed))
