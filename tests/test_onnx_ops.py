"""byoc's own ONNX converters: each against onnxruntime on inputs where TVM's converter is wrong,
and the forms byoc refuses, refused with the node and the reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from byoc.errors import ModelLoadError
from byoc.onnx_backend import backend_for
from byoc.testing.kit import onnxruntime_session

from conftest import assert_fp32_close

HOST = backend_for([])


def _model(nodes, inputs, outputs, initializers=(), opset=18) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "case", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                              [numpy_helper.from_array(v, k) for k, v in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _check_against_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> None:
    want = onnxruntime_session(model).run(None, feeds)
    got = HOST.prepare(model).run(feeds)
    assert_fp32_close(list(got), want)


def test_conv_transpose_output_shape_sets_the_padding():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], name="up", strides=[3, 2], output_shape=[10, 8])
    model = _model([node], [("x", TensorProto.FLOAT, [1, 1, 3, 3])], [("y", TensorProto.FLOAT, [1, 2, 10, 8])], [("w", weight)])
    _check_against_onnxruntime(model, {"x": rng.standard_normal((1, 1, 3, 3)).astype(np.float32)})


def test_softplus_and_mish_keep_their_digits_at_both_ends():
    x = np.array([[-100.0, -30.0, -17.0, -3.0, 0.0, 1e-6, 2.0, 19.0, 21.0, 90.0]], np.float32)
    for op in ("Softplus", "Mish"):
        model = _model([helper.make_node(op, ["x"], ["y"], name="act")], [("x", TensorProto.FLOAT, [1, 10])],
                       [("y", TensorProto.FLOAT, [1, 10])])
        want = onnxruntime_session(model).run(None, {"x": x})[0]
        got = HOST.prepare(model).run({"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30)


def test_is_inf_detects_one_side():
    x = np.array([[-np.inf, np.inf, 1.0, np.nan]], np.float32)
    for side in ("detect_negative", "detect_positive"):
        model = _model([helper.make_node("IsInf", ["x"], ["y"], name="inf", **{side: 0})], [("x", TensorProto.FLOAT, [1, 4])],
                       [("y", TensorProto.BOOL, [1, 4])], opset=20)
        _check_against_onnxruntime(model, {"x": x})


def test_resize_with_axes_covers_the_other_axes():
    scales = np.array([2.0, 3.0], np.float32)
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", mode="nearest", axes=[3, 2])
    model = _model([node], [("x", TensorProto.FLOAT, [1, 2, 2, 3])], [("y", TensorProto.FLOAT, [1, 2, 6, 6])], [("scales", scales)])
    _check_against_onnxruntime(model, {"x": np.arange(12, dtype=np.float32).reshape(1, 2, 2, 3)})


@pytest.mark.parametrize("attrs, scales, reason", [
    ({"mode": "linear", "antialias": 1}, [1, 1, 0.5, 0.5], "antialias"),
    ({"mode": "linear"}, [1, 1, 0.7, 0.7], "fractional output sizes"),
    ({"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"}, [1, 1, 2, 2], "half_pixel_symmetric"),
])
def test_resize_forms_tvm_gets_wrong_are_refused_by_name(attrs, scales, reason):
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="shrink", **attrs)
    model = _model([node], [("x", TensorProto.FLOAT, [1, 1, 5, 5])], [("y", TensorProto.FLOAT, ["h", "w"])],
                   [("scales", np.array(scales, np.float32))])
    with pytest.raises(ModelLoadError, match=rf"'shrink' \(Resize\).*{reason}"):
        HOST.prepare(model)


def test_max_pool_indices_and_batch_norm_training_are_refused_up_front():
    pool = helper.make_node("MaxPool", ["x"], ["y", "i"], name="pool", kernel_shape=[2, 2])
    model = _model([pool], [("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                   [("y", TensorProto.FLOAT, [1, 1, 3, 3]), ("i", TensorProto.INT64, [1, 1, 3, 3])])
    with pytest.raises(ModelLoadError, match=r"'pool' \(MaxPool\): its Indices output"):
        HOST.prepare(model)
    stats = [("s", np.ones(2, np.float32)), ("b", np.zeros(2, np.float32)), ("m", np.zeros(2, np.float32)), ("v", np.ones(2, np.float32))]
    norm = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], name="bn", training_mode=1)
    model = _model([norm], [("x", TensorProto.FLOAT, [1, 2, 3, 3])],
                   [("y", TensorProto.FLOAT, [1, 2, 3, 3]), ("rm", TensorProto.FLOAT, [2]), ("rv", TensorProto.FLOAT, [2])], stats)
    with pytest.raises(ModelLoadError, match=r"'bn' \(BatchNormalization\): training mode"):
        HOST.prepare(model)


def test_layer_normalization_returns_its_statistics():
    rng = np.random.default_rng(1)
    node = helper.make_node("LayerNormalization", ["x", "g", "b"], ["y", "mean", "inv"], name="ln", axis=1)
    model = _model([node], [("x", TensorProto.FLOAT, [2, 3, 4])],
                   [("y", TensorProto.FLOAT, [2, 3, 4]), ("mean", TensorProto.FLOAT, [2, 1, 1]), ("inv", TensorProto.FLOAT, [2, 1, 1])],
                   [("g", rng.standard_normal((3, 4)).astype(np.float32)), ("b", rng.standard_normal((3, 4)).astype(np.float32))])
    _check_against_onnxruntime(model, {"x": rng.standard_normal((2, 3, 4)).astype(np.float32)})


def test_shape_arithmetic_folds_into_a_static_reshape():
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["n"], name="batch", axis=0),
             helper.make_node("Unsqueeze", ["n", "zero_axis"], ["n1"], name="n1"),
             helper.make_node("Concat", ["n1", "minus_one"], ["target"], name="target", axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="flatten")]
    model = _model(nodes, [("x", TensorProto.FLOAT, [2, 3, 4])], [("y", TensorProto.FLOAT, [2, 12])],
                   [("zero", np.array(0, np.int64)), ("zero_axis", np.array([0], np.int64)), ("minus_one", np.array([-1], np.int64))])
    _check_against_onnxruntime(model, {"x": np.arange(24, dtype=np.float32).reshape(2, 3, 4)})


def test_empty_constants_on_the_host_load():
    """TVM's VM saves an empty tensor constant but cannot load it back: byoc makes it at run time."""
    nodes = [helper.make_node("Concat", ["empty", "x"], ["y"], name="join", axis=2)]
    model = _model(nodes, [("x", TensorProto.FLOAT, [2, 4, 3])], [("y", TensorProto.FLOAT, [2, 4, 3])],
                   [("empty", np.zeros((2, 4, 0), np.float32))])
    _check_against_onnxruntime(model, {"x": np.arange(24, dtype=np.float32).reshape(2, 4, 3)})
