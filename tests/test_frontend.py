import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax

import byoc
from byoc.errors import DynamicShapeError, ModelLoadError, QuantizedModelWarning
from byoc.ir.dims import dims_of
from byoc.ir.types import static_shape

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


def test_tvm_folds_the_constant_part_alone():
    """What numpy does not fold (exp here) is folded by TVM; the ops that read the input stay."""
    from byoc.frontend.fold_constants import fold_constants_tvm

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    values = np.arange(6, dtype="float32").reshape(2, 3) / 10
    with bb.function("main", [x]):
        with bb.dataflow():
            scale = bb.emit(relax.op.exp(relax.const(values)))
            out = bb.emit_output(relax.op.multiply(x, relax.op.add(scale, relax.const(1.0))))
        bb.emit_func_output(out)
    folded = fold_constants_tvm(bb.get())
    assert _ops(folded) == ["relax.multiply"]
    got = tvm.relax.VirtualMachine(tvm.relax.build(folded, "llvm"), tvm.cpu())["main"](tvm.runtime.tensor(np.ones((2, 3), "float32")))
    np.testing.assert_allclose(got.numpy(), np.exp(values) + 1, rtol=1e-6)


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


def _relu_then_neg(nodes) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_nodes_out_of_order_are_sorted_as_onnxruntime_sorts_them():
    """onnxruntime's float16 converter appends the casts of the graph's inputs after their readers."""
    model = _relu_then_neg([helper.make_node("Neg", ["y"], ["z"], name="neg"), helper.make_node("Relu", ["x"], ["y"], name="relu")])
    x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], np.float32)
    mod = byoc.from_onnx(model)
    assert [b.var.name for b in mod["main"].body.blocks[0].bindings] == ["relu", "neg"]
    assert_fp32_close(byoc.build(byoc.partition_for(mod, "dnnl")).run(x), onnxruntime_outputs(model, {"x": x}))
    assert [n.name for n in model.graph.node] == ["neg", "relu"]  # the caller's model is left as it was


def test_a_cycle_is_malformed():
    model = _relu_then_neg([helper.make_node("Neg", ["y"], ["z"]), helper.make_node("Relu", ["z"], ["y"])])
    with pytest.raises(ModelLoadError, match="malformed"):
        byoc.from_onnx(model)


def _large_weight_model(weight: np.ndarray) -> onnx.ModelProto:
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="product")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, weight.shape[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, weight.shape[1]])],
                              [onnx.numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_large_weights_are_checked_as_onnx_checks_them():
    """The checker gets large weights as empty stand-ins (serializing them took 1 s of a BERT-base
    import); their sizes are checked beside it, with onnx's message, and a good model passes."""
    weight = np.random.default_rng(0).standard_normal((512, 1024)).astype("float32")  # 2 MB
    model = _large_weight_model(weight)
    x = np.ones((1, 512), "float32")
    assert_fp32_close(byoc.build(byoc.partition_for(byoc.from_onnx(model), "reference")).run(x), [x @ weight])
    model.graph.initializer[0].raw_data = model.graph.initializer[0].raw_data[:10]
    with pytest.raises(onnx.checker.ValidationError, match="raw_data size \\(10 bytes\\) is too small"):
        onnx.checker.check_model(model)  # what onnx says ...
    with pytest.raises(ModelLoadError, match="malformed: TensorProto \\(tensor name: w\\) raw_data size \\(10 bytes\\) is too small "
                       "for the declared shape and type \\(2097152 bytes required\\)"):
        byoc.from_onnx(model)  # ... byoc says too
    model.graph.initializer[0].raw_data = weight.tobytes()
    model.graph.initializer[0].float_data.append(1.0)
    with pytest.raises(ModelLoadError, match="one and only one value field"):
        byoc.from_onnx(model)


def _dynamic_model():
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_named_dynamic_dimension_is_kept_with_an_open_range_and_an_unnamed_one_needs_a_shape():
    mod = byoc.from_onnx(_dynamic_model())  # the file as it is: `batch` stays dynamic, with nothing bounding it
    assert str(dims_of(mod)["batch"]) == "1.." and dims_of(mod)["batch"].open
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(byoc.build(byoc.partition_for(mod, "onnxruntime")).run(x)[0], np.maximum(x, 0))
    mod = byoc.from_onnx(_dynamic_model(), shapes={"x": [2, 4]})
    assert [int(d) for d in mod["main"].params[0].ty.shape.values] == [2, 4] and not dims_of(mod)
    unnamed = _dynamic_model()
    unnamed.graph.input[0].type.tensor_type.shape.dim[0].ClearField("dim_param")
    with pytest.raises(DynamicShapeError, match=r"input 'x' has dynamic dim 0, which the file does not name\. Pass shapes="):
        byoc.from_onnx(unnamed)


def test_shapes_for_unknown_inputs_are_refused():
    with pytest.raises(ModelLoadError, match=r"unknown input\(s\) \['z'\]; the model's inputs are \['x'\]"):
        byoc.from_onnx(_dynamic_model(), shapes={"x": [1, 4], "z": [1]})
    # A misspelt name is refused even where the real input is left dynamic.
    with pytest.raises(ModelLoadError, match=r"unknown input\(s\) \['X'\]"):
        byoc.from_onnx(_dynamic_model(), shapes={"X": [1, 4]})


def _two_dynamic_inputs():
    """input_ids and attention_mask as exporters write them: both [batch, seq]."""
    values = [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", "seq"]) for name in ("ids", "mask")]
    node = helper.make_node("Mul", ["ids", "mask"], ["y"], name="mul")
    graph = helper.make_graph([node], "g", values, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_every_dynamic_input_is_named_at_once_and_named_dimensions_are_shared():
    unnamed = _two_dynamic_inputs()
    for value in unnamed.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            dim.ClearField("dim_param")
    with pytest.raises(DynamicShapeError, match=r"input 'ids' has dynamic dim 0, dim 1; input 'mask' has dynamic dim 0, dim 1, "
                                                r"which the file does not name\. .*shapes=\{'ids': \[...\], 'mask': \[...\]\}"):
        byoc.from_onnx(unnamed)
    # One input's shape gives `batch` and `seq` for the other.
    mod = byoc.from_onnx(_two_dynamic_inputs(), shapes={"ids": [2, 16]})
    assert [[int(d) for d in p.ty.shape.values] for p in mod["main"].params] == [[2, 16], [2, 16]]
    # Left dynamic, both inputs share the two open dimensions.
    mod = byoc.from_onnx(_two_dynamic_inputs())
    assert {name: str(r) for name, r in dims_of(mod).items()} == {"batch": "1..", "seq": "1.."}
    assert [[str(d) for d in p.ty.shape.values] for p in mod["main"].params] == [["batch", "seq"]] * 2


@pytest.mark.parametrize("shapes, message", [
    ({"ids": [2, 16], "mask": [2, 8]}, r"dimension 'seq' is 16 for input 'ids' dim 1 but 8 for input 'mask' dim 1"),
    ({"ids": [2, -1]}, r"dim 1 \(seq\) is -1; every dimension must be a positive integer"),
    ({"ids": [0, 16]}, r"dim 0 \(batch\) is 0; every dimension must be a positive integer"),
    ({"ids": [2, 16, 1]}, r"has 3 dimension\(s\); the model's input 'ids' has 2"),
    ({"ids": "2x16"}, r"expected a list of integers"),
])
def test_contradicting_shapes_are_named_before_conversion(shapes, message):
    with pytest.raises(ModelLoadError, match=message):
        byoc.from_onnx(_two_dynamic_inputs(), shapes=shapes)


def test_shapes_that_contradict_a_static_file_are_refused():
    model = small_model("mlp")
    name = model.graph.input[0].name
    with pytest.raises(ModelLoadError, match=rf"shapes\['{name}'\] = \[2, 64\]: dim 0 is 1 in the model, not 2"):
        byoc.from_onnx(model, shapes={name: [2, 64]})


def test_batch_norm_folding_keeps_numerics():
    model = small_model("resnet18")
    inputs = byoc.models.sample_inputs(model)
    folded = byoc.frontend.onnx.fold_affine.fold_batch_norms(model)
    assert not any(n.op_type == "BatchNormalization" for n in folded.graph.node)
    assert_fp32_close(onnxruntime_outputs(folded, inputs), onnxruntime_outputs(model, inputs))
    assert np.isfinite(onnxruntime_outputs(folded, inputs)[0]).all()


def _affine_model():
    """Unnamed nodes, as Caffe2 exports them: Conv, BatchNormalization, then a per-channel Mul
    and Add (Inception v2's scale and shift), a Sub by a scalar, then a Mul by a constant that
    varies over space (not per channel) and a Conv read twice."""
    rng = np.random.default_rng(0)

    def init(name, shape, low=None):
        values = rng.uniform(0.5, 1.5, shape) if low else rng.standard_normal(shape)
        return onnx.numpy_helper.from_array(values.astype(np.float32), name)

    initializers = [init("w", (8, 4, 3, 3)), init("gamma", (8,)), init("beta", (8,)), init("mean", (8,)), init("var", (8,), low=True),
                    init("scale", (8, 1, 1)), init("shift", (1, 8, 1, 1)), init("one", ()), init("spatial", (1, 1, 6, 6)),
                    init("w2", (8, 8, 1, 1))]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]),
             helper.make_node("BatchNormalization", ["c", "gamma", "beta", "mean", "var"], ["b"]),
             helper.make_node("Mul", ["scale", "b"], ["m"]), helper.make_node("Add", ["m", "shift"], ["a"]),
             helper.make_node("Sub", ["a", "one"], ["s"]), helper.make_node("Relu", ["s"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["c2"]), helper.make_node("Mul", ["c2", "spatial"], ["p"]),
             helper.make_node("Conv", ["p", "w2"], ["c3"]), helper.make_node("Add", ["c3", "c3"], ["y"])]
    graph = helper.make_graph(nodes, "affine", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_per_channel_affine_ops_fold_into_the_conv_before_them():
    model = _affine_model()
    folded = byoc.frontend.onnx.fold_affine.fold_batch_norms(model)
    # BN, Mul, Add and Sub are absorbed by the first Conv; the spatial Mul and the Add reading c3 twice stay
    assert [n.op_type for n in folded.graph.node] == ["Conv", "Relu", "Conv", "Mul", "Conv", "Add"]
    inputs = {"x": np.random.default_rng(1).standard_normal((1, 4, 8, 8)).astype(np.float32)}
    assert_fp32_close(onnxruntime_outputs(folded, inputs), onnxruntime_outputs(model, inputs))
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), "reference"))
    assert_fp32_close(compiled.run(**inputs), onnxruntime_outputs(model, inputs))


def _linear_norm(channels_last: int) -> onnx.ModelProto:
    """LeViT's LinearNorm as torch.onnx writes it: MatMul, a Reshape to (rows, channels_last),
    BatchNormalization, a Reshape back, then a reader."""
    rng = np.random.default_rng(0)
    arrays = {"w": rng.standard_normal((8, 16)), "gamma": rng.uniform(0.5, 1.5, channels_last),
              "beta": rng.standard_normal(channels_last), "mean": rng.standard_normal(channels_last),
              "var": rng.uniform(0.5, 1.5, channels_last)}
    initializers = [onnx.numpy_helper.from_array(v.astype(np.float32), k) for k, v in arrays.items()] + [
        onnx.numpy_helper.from_array(np.array([-1, channels_last], np.int64), "rows"),
        onnx.numpy_helper.from_array(np.array([2, 6, 16], np.int64), "back")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Reshape", ["m", "rows"], ["flat"]),
             helper.make_node("BatchNormalization", ["flat", "gamma", "beta", "mean", "var"], ["n"]),
             helper.make_node("Reshape", ["n", "back"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "linear_norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 6, 16])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_batch_norm_after_a_dense_layer_folds_into_its_weights_and_a_bias():
    """LeViT's 295 binary primitives on dnnl: each norm after a dense layer is now the layer's
    scale and bias, and the dense layer with its bias is one dnnl kernel."""
    from byoc.frontend.onnx.fold_dense_norm import fold_batch_norms_after_dense

    model = _linear_norm(16)
    folded = fold_batch_norms_after_dense(model)
    assert [n.op_type for n in folded.graph.node] == ["MatMul", "Add", "Reshape", "Reshape", "Relu"]
    inputs = {"x": np.random.default_rng(1).standard_normal((2, 6, 8)).astype(np.float32)}
    assert_fp32_close(onnxruntime_outputs(folded, inputs), onnxruntime_outputs(model, inputs))
    partitioned = byoc.partition_for(byoc.from_onnx(model), "dnnl")
    assert len(byoc.report(partitioned).regions) == 1 and "multiply" not in partitioned.script()
    assert_fp32_close(byoc.build(partitioned, strict=True).run(**inputs), onnxruntime_outputs(model, inputs))
    # A norm over other channels than the product's columns does not fold
    other = _linear_norm(32)
    assert fold_batch_norms_after_dense(other) is other


def _gather_by(indices: np.ndarray) -> onnx.ModelProto:
    """A product, a Gather along its columns by constant `indices`, another product: as the dynamo
    exporter writes torch's `as_strided` (ConvNeXt V2's head) where the indices count up by one."""
    rng = np.random.default_rng(0)
    initializers = [onnx.numpy_helper.from_array(rng.standard_normal((4, 8)).astype(np.float32), "w"),
                    onnx.numpy_helper.from_array(indices.astype(np.int64), "indices"),
                    onnx.numpy_helper.from_array(rng.standard_normal((indices.size, 4)).astype(np.float32), "w2")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Gather", ["m", "indices"], ["g"], axis=1),
             helper.make_node("Reshape", ["g", "rows"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    initializers.append(onnx.numpy_helper.from_array(np.array([2, indices.size], np.int64), "rows"))
    graph = helper.make_graph(nodes, "gather", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("indices, taken", [
    (np.arange(8).reshape(1, 8, 1, 1), False),  # every column, in order: a reshape
    (np.arange(2, 5).reshape(3, 1), False),  # a range of them: a slice and a reshape
    (np.array([3, 1, 2]), True),  # any other order stays a gather
])
def test_a_gather_of_counted_up_indices_is_a_slice(indices, taken):
    model = _gather_by(indices)
    partitioned = byoc.partition_for(byoc.from_onnx(model), "dnnl")
    assert ("R.take(" in partitioned.script()) == taken
    inputs = {"x": np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)}
    if not taken:
        assert len(byoc.report(partitioned).regions) == 1 and not byoc.report(partitioned).host_ops
    assert_fp32_close(byoc.build(partitioned).run(**inputs), onnxruntime_outputs(model, inputs))


def _fake_quantized(scale: float) -> onnx.ModelProto:
    nodes = [helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], name="scores_QuantizeLinear"),
             helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"], name="scores_DequantizeLinear")]
    graph = helper.make_graph(nodes, "masked", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor("scale", TensorProto.FLOAT, [], [scale]), helper.make_tensor("zero", TensorProto.UINT8, [], [0])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_quantization_scale_that_loses_every_value_is_named(recwarn):
    """onnxruntime's tool gives a scale of inf to a tensor whose calibrated range takes in an
    attention mask's lowest float (a quantized GPT-Neo): the file imports and runs as it says,
    and the warning names the nodes."""
    with pytest.warns(QuantizedModelWarning, match=r"'scores_QuantizeLinear' \(QuantizeLinear, scale inf\), "
                                                   r"'scores_DequantizeLinear' .*nodes_to_exclude"):
        byoc.from_onnx(_fake_quantized(float("inf")))
    with pytest.warns(QuantizedModelWarning, match="scale 0"):
        byoc.from_onnx(_fake_quantized(0.0))
    recwarn.clear()
    byoc.from_onnx(_fake_quantized(0.05))
    assert not [w for w in recwarn if issubclass(w.category, QuantizedModelWarning)]


def _activation_between_reshapes(read_twice: bool) -> onnx.ModelProto:
    """rows = Reshape(x); y = Reshape(0.5 * Gelu(rows)), back to x's shape; with `read_twice`,
    the GELU's result is an output of its own too."""
    nodes = [
        helper.make_node("Reshape", ["x", "rows_shape"], ["rows"], name="to_rows"),
        helper.make_node("Gelu", ["rows"], ["gelu"], name="gelu"),
        helper.make_node("Mul", ["gelu", "half"], ["scaled"], name="scaled"),
        helper.make_node("Reshape", ["scaled", "tokens_shape"], ["y"], name="to_tokens"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])]
    if read_twice:
        outputs.append(helper.make_tensor_value_info("gelu", TensorProto.FLOAT, [8, 16]))
    initializers = [helper.make_tensor("rows_shape", TensorProto.INT64, [2], [8, 16]),
                    helper.make_tensor("tokens_shape", TensorProto.INT64, [3], [1, 8, 16]),
                    helper.make_tensor("half", TensorProto.FLOAT, [1], [0.5])]
    graph = helper.make_graph(nodes, "between_reshapes", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16])],
                              outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


@pytest.mark.parametrize("read_twice", [False, True])
def test_reshapes_that_undo_each_other_around_element_wise_ops_are_dropped(read_twice):
    """Element-wise ops compute the same on any shape: reshape(f(reshape(x))) back to x's shape is
    f(x), each op keeping its node's name. A value read by another op stays as it was, so that
    nothing is computed twice."""
    model = _activation_between_reshapes(read_twice)
    mod = byoc.from_onnx(model)
    bindings = [b for block in mod["main"].body.blocks for b in block.bindings if isinstance(b.value, relax.Call)]
    reshapes = [b for b in bindings if b.value.op.name == "relax.reshape"]
    assert len(reshapes) == (2 if read_twice else 0), mod
    if not read_twice:
        assert [b.value.op.name for b in bindings] == ["relax.nn.gelu", "relax.multiply"] and bindings[0].var.name == "gelu"
    inputs = {"x": np.random.default_rng(0).standard_normal((1, 8, 16), np.float32)}
    assert_fp32_close([np.asarray(o) for o in byoc.build(byoc.partition_for(mod, "reference")).run(inputs)],
                      onnxruntime_outputs(model, inputs))


def _keys_transposed(read_twice: bool, batch: int | str = 1) -> onnx.ModelProto:
    """Attention's keys as exporters write them: heads (batch, 4, 8, 16) transposed from
    (batch, 8, 4, 16), reshaped to three axes (batch and heads merged), transposed, reshaped back
    to four; with `read_twice`, the heads are an output of their own too. At batch 1 the
    reshapes are given in full, else with -1 for the merged axis, as an export with a dynamic
    batch writes them."""
    nodes = [
        helper.make_node("Transpose", ["k"], ["heads"], perm=[0, 2, 1, 3], name="heads"),
        helper.make_node("Reshape", ["heads", "three"], ["flat"], name="flat"),
        helper.make_node("Transpose", ["flat"], ["flat_t"], perm=[0, 2, 1], name="flat_t"),
        helper.make_node("Reshape", ["flat_t", "four"], ["keys_t"], name="keys_t"),
        helper.make_node("MatMul", ["q", "keys_t"], ["scores"], name="scores"),
    ]
    outputs = [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [batch, 4, 8, 8])]
    if read_twice:
        outputs.append(helper.make_tensor_value_info("heads", TensorProto.FLOAT, [batch, 4, 8, 16]))
    initializers = [helper.make_tensor("three", TensorProto.INT64, [3], [4 if batch == 1 else -1, 8, 16]),
                    helper.make_tensor("four", TensorProto.INT64, [4], [1 if batch == 1 else -1, 4, 16, 8])]
    graph = helper.make_graph(nodes, "keys", [helper.make_tensor_value_info("k", TensorProto.FLOAT, [batch, 8, 4, 16]),
                                              helper.make_tensor_value_info("q", TensorProto.FLOAT, [batch, 4, 8, 16])], outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


@pytest.mark.parametrize("read_twice", [False, True])
def test_transposes_and_unit_reshapes_in_a_chain_are_one_transpose(read_twice):
    """transpose, reshape dropping a unit axis, transpose, reshape adding it back: one transpose
    of the source, named after the chain's last node. A link read elsewhere ends the chain."""
    model = _keys_transposed(read_twice)
    mod = byoc.from_onnx(model)
    moves = [b for block in mod["main"].body.blocks for b in block.bindings
             if isinstance(b.value, relax.Call) and b.value.op.name in ("relax.permute_dims", "relax.reshape")]
    if read_twice:
        assert [b.value.op.name for b in moves] == ["relax.permute_dims", "relax.permute_dims"], mod
        assert [int(a) for a in moves[1].value.attrs.axes] == [0, 1, 3, 2]
    else:
        assert len(moves) == 1 and moves[0].var.name == "keys_t" and [int(a) for a in moves[0].value.attrs.axes] == [0, 2, 3, 1], mod
    rng = np.random.default_rng(0)
    inputs = {"k": rng.standard_normal((1, 8, 4, 16), np.float32), "q": rng.standard_normal((1, 4, 8, 16), np.float32)}
    assert_fp32_close([np.asarray(o) for o in byoc.build(byoc.partition_for(mod, "reference")).run(inputs)],
                      onnxruntime_outputs(model, inputs))


def test_a_transposed_chain_that_adds_a_unit_axis_adds_it_first():
    """Llama's repeated keys: reshape to three axes (heads merged), transpose, reshape adding the
    batch axis back: the source is reshaped first, its heads merged and the unit axis added (a
    view), then one transpose of four axes (which a vendor reads as a view where a product reads
    it)."""
    nodes = [helper.make_node("Reshape", ["k", "three"], ["merged"], name="merged"),
             helper.make_node("Transpose", ["merged"], ["merged_t"], perm=[0, 2, 1], name="merged_t"),
             helper.make_node("Reshape", ["merged_t", "four"], ["keys_t"], name="keys_t"),
             helper.make_node("MatMul", ["q", "keys_t"], ["scores"], name="scores")]
    initializers = [helper.make_tensor("three", TensorProto.INT64, [3], [4, 8, 16]), helper.make_tensor("four", TensorProto.INT64, [4], [1, 4, 16, 8])]
    graph = helper.make_graph(nodes, "keys", [helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, 2, 2, 8, 16]),
                                              helper.make_tensor_value_info("q", TensorProto.FLOAT, [1, 4, 8, 16])],
                              [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 4, 8, 8])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    mod = byoc.from_onnx(model)
    moves = [(b.value.op.name, static_shape(b.value.ty)) for block in mod["main"].body.blocks for b in block.bindings
             if isinstance(b.value, relax.Call) and b.value.op.name in ("relax.permute_dims", "relax.reshape")]
    assert moves == [("relax.reshape", (1, 4, 8, 16)), ("relax.permute_dims", (1, 4, 16, 8))], moves
    rng = np.random.default_rng(0)
    inputs = {"k": rng.standard_normal((1, 2, 2, 8, 16), np.float32), "q": rng.standard_normal((1, 4, 8, 16), np.float32)}
    assert_fp32_close([np.asarray(o) for o in byoc.build(byoc.partition_for(mod, "reference")).run(inputs)],
                      onnxruntime_outputs(model, inputs))


@pytest.mark.parametrize("batch", [2, "batch"])
def test_a_chain_merging_batch_and_heads_is_one_transpose(batch):
    """Attention's keys as an export with batch > 1, or a dynamic batch, writes them: the reshape
    merges batch and heads (`batch * 4`, static or symbolic) and the last splits them again.
    One transpose of the source, which dnnl reads as a view: the keys were copied twice at each
    call (two reorders a layer in ONEDNN_VERBOSE)."""
    model = _keys_transposed(False, batch)
    mod = byoc.from_onnx(model, dims={"batch": (1, 8)} if batch == "batch" else None)
    moves = [b.value for block in mod["main"].body.blocks for b in block.bindings
             if isinstance(b.value, relax.Call) and b.value.op.name in ("relax.permute_dims", "relax.reshape")]
    assert len(moves) == 1 and moves[0].op.name == "relax.permute_dims" and [int(a) for a in moves[0].attrs.axes] == [0, 2, 3, 1], mod
    model_dnnl = byoc.build(byoc.partition_for(mod, "dnnl"))
    for size in (2,) if batch == 2 else (1, 3):
        rng = np.random.default_rng(size)
        inputs = {"k": rng.standard_normal((size, 8, 4, 16), np.float32), "q": rng.standard_normal((size, 4, 8, 16), np.float32)}
        assert_fp32_close([np.asarray(o) for o in model_dnnl.run(inputs)], onnxruntime_outputs(model, inputs))


def test_a_chain_that_splits_or_merges_axes_apart_is_left_as_it_was():
    """A reshape splitting the source's axis (a dense layer's 64 features into 4 heads of 16),
    and one merging axes that a transpose moved apart (batch and heads, with the sequence between
    them in memory), move no axes of their source whole: the moves stay as written, and compute
    the same."""
    nodes = [helper.make_node("Reshape", ["x", "split"], ["heads"], name="heads"),
             helper.make_node("Transpose", ["heads"], ["heads_t"], perm=[0, 2, 1, 3], name="heads_t"),
             helper.make_node("Reshape", ["heads_t", "three"], ["flat"], name="flat"),
             helper.make_node("Transpose", ["flat"], ["flat_t"], perm=[0, 2, 1], name="flat_t")]
    initializers = [helper.make_tensor("split", TensorProto.INT64, [4], [2, 8, 4, 16]),
                    helper.make_tensor("three", TensorProto.INT64, [3], [8, 8, 16])]
    graph = helper.make_graph(nodes, "split", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 64])],
                              [helper.make_tensor_value_info("flat_t", TensorProto.FLOAT, [8, 16, 8])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    mod = byoc.from_onnx(model)
    moves = [(b.value.op.name, static_shape(b.value.ty)) for block in mod["main"].body.blocks for b in block.bindings
             if isinstance(b.value, relax.Call) and b.value.op.name in ("relax.permute_dims", "relax.reshape")]
    assert moves == [("relax.reshape", (2, 8, 4, 16)), ("relax.permute_dims", (2, 4, 8, 16)), ("relax.reshape", (8, 8, 16)),
                     ("relax.permute_dims", (8, 16, 8))], moves
    inputs = {"x": np.random.default_rng(0).standard_normal((2, 8, 64), np.float32)}
    assert_fp32_close([np.asarray(o) for o in byoc.build(byoc.partition_for(mod, "reference")).run(inputs)],
                      onnxruntime_outputs(model, inputs))


def _one_node_model(node, inputs, output, opset=13, initializers=()):
    graph = helper.make_graph([node], "g", inputs, [output], initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_a_prelu_slope_that_does_not_broadcast_is_named():
    """From opset 7 PRelu's slope broadcasts from the last axis; one that does not is an error
    naming the node and both shapes (TVM's converter raised an IndexError)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 4])
    slope = onnx.numpy_helper.from_array(np.full(3, 0.25, np.float32), "slope")
    model = _one_node_model(helper.make_node("PRelu", ["x", "slope"], ["y"], name="act"), [x], y, initializers=[slope])
    with pytest.raises(ModelLoadError, match=r"'act' \(PRelu\).*slope of shape \(3,\) does not broadcast to its input's \(2, 3, 4\)"):
        byoc.from_onnx(model)


@pytest.mark.parametrize("op, position, message", [
    ("SequenceAt", 3, r"SequenceAt position 3 is out of range for a sequence of 3 tensors \(\[-3, 2\]\)"),
    ("SequenceErase", -4, r"SequenceErase position -4 is out of range"),
])
def test_sequence_positions_out_of_range_are_named(op, position, message):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3] if op == "SequenceAt" else [4, 3])
    nodes = [helper.make_node("SequenceConstruct", ["x", "x", "x"], ["s"]),
             helper.make_node("Constant", [], ["p"], value=onnx.numpy_helper.from_array(np.array(position, np.int64))),
             helper.make_node(op, ["s", "p"], ["t"], name="pick")]
    if op == "SequenceErase":
        nodes.append(helper.make_node("ConcatFromSequence", ["t"], ["y"], axis=0))
    else:
        nodes[-1].output[0] = "y"
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(ModelLoadError, match=message):
        byoc.from_onnx(model)


def test_sequences_split_from_a_tensor_are_read_through_their_type():
    """SplitToSequence binds its tuple to a variable, which TVM's sequence converters cannot take
    the length of; negative positions count from the back as ONNX (and Python) count them."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [6, 2])
    const = lambda name, v: helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.array(v, np.int64)))  # noqa: E731
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"], axis=0),
             const("minus_one", -1), const("zero", 0),
             helper.make_node("SequenceAt", ["s", "zero"], ["first"]),
             helper.make_node("SequenceInsert", ["s", "first", "minus_one"], ["s2"]),
             helper.make_node("SequenceErase", ["s2", "zero"], ["s3"]),
             helper.make_node("ConcatFromSequence", ["s3"], ["y"], axis=0)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 13)])
    data = np.arange(12, dtype=np.float32).reshape(6, 2)
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl"))
    expected = onnxruntime_outputs(model, {"x": data})
    assert_fp32_close(compiled.run(data), expected)
    np.testing.assert_array_equal(expected[0], data[[1, 2, 3, 4, 0, 5]])


def _cast_model(source, target, op="Cast"):
    x = helper.make_tensor_value_info("x", source, [2, 3])
    y = helper.make_tensor_value_info("y", target, [2, 3])
    return _one_node_model(helper.make_node(op, ["x"], ["y"], name="narrow", to=target), [x], y, opset=21)


def test_bfloat16_tensors_go_in_and_out_of_a_compiled_model():
    """numpy's DLPack takes no bfloat16: inputs and outputs pass as ml_dtypes' bfloat16 arrays."""
    import ml_dtypes

    data = np.array([[0.1, -2.5, 3e38], [np.inf, np.nan, -0.0]], np.float32)
    down = byoc.build(byoc.partition_for(byoc.from_onnx(_cast_model(TensorProto.FLOAT, TensorProto.BFLOAT16)), "dnnl"))
    narrow = down.run(data)[0]
    assert narrow.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(narrow.view(np.uint16), data.astype(ml_dtypes.bfloat16).view(np.uint16))
    up = byoc.build(byoc.partition_for(byoc.from_onnx(_cast_model(TensorProto.BFLOAT16, TensorProto.FLOAT)), "dnnl"))
    np.testing.assert_array_equal(up.run(narrow)[0], narrow.astype(np.float32))


@pytest.mark.parametrize("target, message", [
    (TensorProto.FLOAT8E4M3FN, "float8e4m3fn tensors are not supported"),
    (TensorProto.INT4, "int4 tensors are not supported outside the weights of a DequantizeLinear"),
    (TensorProto.STRING, "string tensors are not supported"),
])
def test_float8_sub_byte_and_string_tensors_are_refused_by_node(target, message):
    """TVM converts float8 wrongly (no error), fails to build sub-byte tensors and has no string
    tensors: refused up front, naming the node."""
    with pytest.raises(ModelLoadError, match=f"node 'narrow' \\(Cast\\): {message}"):
        byoc.from_onnx(_cast_model(TensorProto.FLOAT, target))


def test_topk_of_a_type_the_sort_library_lacks_is_refused():
    x = helper.make_tensor_value_info("x", TensorProto.UINT16, [3, 4])
    v = helper.make_tensor_value_info("v", TensorProto.UINT16, [3, 2])
    i = helper.make_tensor_value_info("i", TensorProto.INT64, [3, 2])
    k = onnx.numpy_helper.from_array(np.array([2], np.int64), "k")
    graph = helper.make_graph([helper.make_node("TopK", ["x", "k"], ["v", "i"], name="best", axis=1)], "g", [x], [v, i], [k])
    with pytest.raises(ModelLoadError, match=r"node 'best' \(TopK\): TopK of uint16 is not supported"):
        byoc.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))


@pytest.mark.parametrize("dtype, bounds", [(np.int8, {"min": 0}), (np.uint8, {"max": 200}), (np.int32, {})])
def test_an_integer_clip_without_a_bound_is_bounded_by_its_type(dtype, bounds):
    """An absent bound of an integer Clip is the type's limit (it was infinity, which failed to
    build: "Cannot convert infinity to BigInt")."""
    tensor = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    names = [""] * 2
    inits = []
    for index, key in enumerate(("min", "max")):
        if key in bounds:
            names[index] = key
            inits.append(onnx.numpy_helper.from_array(np.array(bounds[key], dtype), key))
    x = helper.make_tensor_value_info("x", tensor, [2, 4])
    y = helper.make_tensor_value_info("y", tensor, [2, 4])
    model = _one_node_model(helper.make_node("Clip", ["x", *names], ["y"]), [x], y, initializers=inits)
    data = np.array([[-128, -1, 0, 1], [100, 127, 5, -7]]).astype(dtype)
    got = byoc.build(byoc.from_onnx(model)).run(data)[0]
    np.testing.assert_array_equal(got, onnxruntime_outputs(model, {"x": data})[0])


def test_eyelike_gives_the_dtype_it_is_asked_for():
    x = helper.make_tensor_value_info("x", TensorProto.INT32, [3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.DOUBLE, [3, 4])
    model = _one_node_model(helper.make_node("EyeLike", ["x"], ["y"], dtype=TensorProto.DOUBLE, k=1), [x], y)
    got = byoc.build(byoc.from_onnx(model)).run(np.zeros((3, 4), np.int32))[0]
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, np.eye(3, 4, k=1))


def test_a_compiled_model_takes_its_inputs_by_the_names_in_the_file(tmp_path, capsys):
    """TVM renames inputs to identifiers (`input.1` -> `input_1`, `past_key_values.0.key` ->
    `past_key_values_0_key`); the compiled model, its artifact and the command line keep the
    file's names, as onnxruntime does."""
    from byoc.cli import main

    names = ["input.1", "past_key_values.0.key"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in names]
    y = helper.make_tensor_value_info("logits.out", TensorProto.FLOAT, [2, 3])
    model = _one_node_model(helper.make_node("Add", names, ["logits.out"]), inputs, y)
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl"))
    assert [spec.name for spec in compiled.inputs] == names and [spec.name for spec in compiled.outputs] == ["logits.out"]
    a, b = np.ones((2, 3), np.float32), np.full((2, 3), 2, np.float32)
    np.testing.assert_array_equal(compiled.run(**{"input.1": a, "past_key_values.0.key": b})[0], a + b)
    path = tmp_path / "add.byoc"
    compiled.export(path)
    np.save(tmp_path / "b.npy", b)
    assert main(["run", str(path), "--input", f"past_key_values.0.key={tmp_path / 'b.npy'}"]) == 0
    assert "output 0 (logits.out)" in capsys.readouterr().out


def test_unnamed_nodes_are_named_by_op_and_position():
    """Hand-built graphs leave node names empty: each gets its op type and position, unique
    (a name the file already uses is not taken), in reports and errors; the caller's model is
    left as it was."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sin", ["a"], ["b"], name="Relu_2"),
         helper.make_node("Relu", ["b"], ["y"])], "unnamed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    hosted = {row["node"] for row in byoc.report(byoc.partition_for(byoc.from_onnx(model), "dnnl")).to_dict()["host_ops"]}
    assert hosted == {"Relu_0", "Relu_2", "Relu_2_1"}, hosted
    assert [node.name for node in model.graph.node] == ["", "Relu_2", ""]


def test_unsqueeze_takes_one_axis_as_a_0d_tensor():
    """onnx's own function bodies (AffineGrid's) give Unsqueeze its one axis as a 0-d tensor,
    which onnxruntime takes; TVM's converter failed on it ('int' object is not iterable)."""
    graph = helper.make_graph([helper.make_node("Unsqueeze", ["x", "axes"], ["y"], name="u")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 4, 1])],
                              [onnx.numpy_helper.from_array(np.array(-1, np.int64), "axes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inputs = {"x": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)}
    assert_fp32_close(byoc.build(byoc.partition_for(byoc.from_onnx(model), "reference")).run(**inputs), onnxruntime_outputs(model, inputs))
