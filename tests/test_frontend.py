import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax

import byoc
from byoc.errors import DynamicShapeError, ModelLoadError

from conftest import assert_fp32_close, onnxruntime_outputs, small_model, small_module


def _ops(mod):
    return [b.value.op.name for blk in mod["main"].body.blocks for b in blk.bindings if isinstance(b.value, relax.Call)]


def _names(mod):
    return {b.var.name for blk in mod["main"].body.blocks for b in blk.bindings}


def test_bindings_carry_onnx_node_names():
    names = _names(small_module("resnet18"))
    assert {"stem/Conv", "stem/MaxPool", "layer1/block0/Relu", "head/Gemm"} <= names
    assert not any(n.startswith("lv") for n in names)


def test_batch_norm_is_folded_and_weights_are_constants():
    mod = small_module("resnet18")
    assert "relax.nn.batch_norm" not in _ops(mod)
    assert len(mod["main"].params) == 1  # the image; weights are bound constants


def test_clip_becomes_one_relax_clip():
    assert _ops(small_module("mobilenet_v2")).count("relax.clip") == 35


@pytest.mark.parametrize("name", ["mlp", "mobilenet_v2", "bert_encoder"])
def test_imported_module_matches_onnxruntime(name):
    model = small_model(name)
    inputs = byoc.models.sample_inputs(model)
    vm = relax.VirtualMachine(relax.build(small_module(name), target="llvm"), tvm.cpu())
    result = vm["main"](*[tvm.runtime.tensor(v) for v in inputs.values()])
    assert_fp32_close([result.numpy()], onnxruntime_outputs(model, inputs))


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ModelLoadError, match="nope.onnx.*no such file"):
        byoc.from_onnx(tmp_path / "nope.onnx")


def test_garbage_file_is_named_with_the_cause(tmp_path):
    path = tmp_path / "garbage.onnx"
    path.write_bytes(b"\x08\x07this is not protobuf\xff\xff")
    with pytest.raises(ModelLoadError, match="garbage.onnx"):
        byoc.from_onnx(path)


def test_invalid_graph_is_malformed(tmp_path):
    node = helper.make_node("Relu", ["missing_input"], ["y"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "bad.onnx"
    onnx.save(model, path)
    with pytest.raises(ModelLoadError, match="bad.onnx.*malformed"):
        byoc.from_onnx(path)


def _dynamic_model():
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_dynamic_input_needs_a_shape():
    with pytest.raises(DynamicShapeError, match="'x'.*batch.*shapes="):
        byoc.from_onnx(_dynamic_model())
    mod = byoc.from_onnx(_dynamic_model(), shapes={"x": [2, 4]})
    assert [int(d) for d in mod["main"].params[0].ty.shape.values] == [2, 4]


def test_shapes_for_unknown_inputs_are_refused():
    with pytest.raises(ModelLoadError, match="unknown inputs"):
        byoc.from_onnx(_dynamic_model(), shapes={"x": [1, 4], "z": [1]})


def test_batch_norm_folding_keeps_numerics():
    model = small_model("resnet18")
    inputs = byoc.models.sample_inputs(model)
    folded = byoc.frontend.onnx_fold.fold_batch_norms(model)
    assert not any(n.op_type == "BatchNormalization" for n in folded.graph.node)
    assert_fp32_close(onnxruntime_outputs(folded, inputs), onnxruntime_outputs(model, inputs))
    assert np.isfinite(onnxruntime_outputs(folded, inputs)[0]).all()
