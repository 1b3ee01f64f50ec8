import numpy as np
import onnx
import pytest

from byoc import models as zoo
from byoc.errors import UnknownModelError

from conftest import small_model

EXPECTED = {"mlp", "resnet18", "resnet50", "mobilenet_v2", "vgg19", "inception_v3", "bert_encoder", "ssd_detector"}


def test_zoo_lists_the_required_models():
    assert EXPECTED <= set(zoo.names())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_small_models_are_valid_onnx_with_static_inputs(name):
    model = small_model(name)
    onnx.checker.check_model(model)
    for shape in zoo.model_input_shapes(model).values():
        assert all(d > 0 for d in shape)


def test_models_are_deterministic_for_a_seed():
    a, b = zoo.get("mlp", seed=3), zoo.get("mlp", seed=3)
    assert a.SerializeToString() == b.SerializeToString()
    assert zoo.get("mlp", seed=4).SerializeToString() != a.SerializeToString()


def test_resnet50_has_the_published_structure():
    model = zoo.get("resnet50", image_size=64)
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    assert len(convs) == 53  # 1 stem + 16 blocks x 3 + 4 downsample
    weights = sum(int(np.prod(i.dims)) for i in model.graph.initializer)
    assert 25_000_000 < weights < 26_000_000  # ResNet-50 has 25.6 M parameters


def test_bert_inputs_stay_in_the_vocabulary():
    model = small_model("bert_encoder")
    ids = zoo.sample_inputs(model, seed=1)["input_ids"]
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 1000


def test_detector_ends_in_non_max_suppression():
    assert small_model("ssd_detector").graph.node[-1].op_type == "NonMaxSuppression"


def test_unknown_model_names_the_zoo():
    with pytest.raises(UnknownModelError, match="resnet18"):
        zoo.get("alexnet")


def test_integer_inputs_of_any_file_stay_within_the_tables_they_index():
    """A file without recorded ranges: each integer input gets [0, rows) of the smallest table
    it gathers from, through casts and reshapes (BERT's token types have 2 rows; the default
    [0, 100) made onnxruntime refuse the seeded inputs of `byoc bench`)."""
    from onnx import TensorProto, helper, numpy_helper

    tables = [numpy_helper.from_array(np.zeros((rows, 4), np.float32), name) for name, rows in [("words", 50), ("types", 2)]]
    nodes = [helper.make_node("Gather", ["words", "ids"], ["w"]), helper.make_node("Cast", ["types_in"], ["t32"], to=TensorProto.INT32),
             helper.make_node("Unsqueeze", ["t32", "axis"], ["t"]), helper.make_node("Gather", ["types", "t"], ["g"]),
             helper.make_node("Add", ["mask", "mask"], ["m"])]
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT64, [1, 6]) for name in ("ids", "types_in", "mask")]
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT if name != "m" else TensorProto.INT64, None) for name in "wgm"]
    graph = helper.make_graph(nodes, "tables", inputs, outputs, [*tables, numpy_helper.from_array(np.array([0], np.int64), "axis")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert zoo.input_ranges(model) == {"ids": (0, 50), "types_in": (0, 2)}
    for seed in range(3):
        assert zoo.sample_inputs(model, seed=seed)["types_in"].max() <= 1
