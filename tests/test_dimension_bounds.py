"""A dimension the model itself bounds (a position table read at every position up to it) is
narrowed to that bound with a warning, so that a call past it is an InputError before anything
runs: TVM's take would wrap the position and read another row without a word, where onnxruntime
refuses the Gather."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc.errors import DimensionBoundWarning, InputError
from byoc.ir.dims import dims_of

from conftest import assert_fp32_close, onnxruntime_outputs


def _positions(rows: int = 128) -> onnx.ModelProto:
    """Token and position embeddings, the positions arange(seq) + 0 as exporters write them."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Shape", ["ids"], ["shape"]), helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
             helper.make_node("Range", ["zero", "seq", "one"], ["positions"]),
             helper.make_node("Gather", ["pos_table", "positions"], ["pos"], axis=0, name="position_embedding"),
             helper.make_node("Gather", ["tok_table", "ids"], ["tok"], axis=0), helper.make_node("Add", ["tok", "pos"], ["y"])]
    initializers = [numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array(0, np.int64), "zero"),
                    numpy_helper.from_array(rng.standard_normal((rows, 16)).astype(np.float32), "pos_table"),
                    numpy_helper.from_array(rng.standard_normal((1000, 16)).astype(np.float32), "tok_table")]
    graph = helper.make_graph(nodes, "positions", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 16])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("vendor", ["onnxruntime", "dnnl"])
def test_a_range_past_the_position_table_is_narrowed_and_a_call_past_it_refused(vendor):
    model = _positions()
    with pytest.warns(DimensionBoundWarning, match="dimension 'seq' can be at most 128: node 'position_embedding' reads a table of "
                                                    "128 rows at every position up to it; dims allowed up to 256, narrowed to 1..128"):
        mod = byoc.from_onnx(model, dims={"batch": (1, 2), "seq": (1, 64, 256)})
    assert str(dims_of(mod)["seq"]) == "1..128" and dims_of(mod)["seq"].opt == 64
    compiled = byoc.build(byoc.partition_for(mod, vendor))
    for seq in (1, 57, 128):
        ids = np.random.default_rng(seq).integers(0, 1000, (2, seq), dtype=np.int64)
        assert_fp32_close(compiled.run(ids), onnxruntime_outputs(model, {"ids": ids}))
    for seq in (129, 200):  # onnxruntime refuses these too; byoc would have read other rows
        with pytest.raises(InputError, match=f"dim 1 \\(seq\\) is {seq}, outside the range 1..128"):
            compiled.run(np.zeros((2, seq), np.int64))


def test_a_range_within_the_table_is_kept_without_a_word(recwarn):
    mod = byoc.from_onnx(_positions(), dims={"batch": (1, 2), "seq": (1, 100)})
    assert str(dims_of(mod)["seq"]) == "1..100"
    assert not [w for w in recwarn if issubclass(w.category, DimensionBoundWarning)]


def _sliced_positions(rows: int = 512) -> onnx.ModelProto:
    """Positions sliced from a buffer of `rows` (`position_ids[:, :seq]`), as BERT exports write them."""
    rng = np.random.default_rng(1)
    nodes = [helper.make_node("Shape", ["ids"], ["shape"]), helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
             helper.make_node("Unsqueeze", ["seq", "zero_axis"], ["end"]),
             helper.make_node("Slice", ["position_ids", "zero_1d", "end", "one_1d"], ["positions"], name="position_slice"),
             helper.make_node("Gather", ["pos_table", "positions"], ["pos"], axis=0),
             helper.make_node("Gather", ["tok_table", "ids"], ["tok"], axis=0), helper.make_node("Add", ["tok", "pos"], ["y"])]
    initializers = [numpy_helper.from_array(np.array(1, np.int64), "one"), numpy_helper.from_array(np.array([0], np.int64), "zero_axis"),
                    numpy_helper.from_array(np.array([0], np.int64), "zero_1d"), numpy_helper.from_array(np.array([1], np.int64), "one_1d"),
                    numpy_helper.from_array(np.arange(rows, dtype=np.int64)[None], "position_ids"),
                    numpy_helper.from_array(rng.standard_normal((rows, 16)).astype(np.float32), "pos_table"),
                    numpy_helper.from_array(rng.standard_normal((1000, 16)).astype(np.float32), "tok_table")]
    graph = helper.make_graph(nodes, "sliced", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 16])], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_slice_of_a_position_buffer_bounds_the_dimension():
    model = _sliced_positions(64)
    mod = byoc.from_onnx(model)  # open: bounded quietly
    assert str(dims_of(mod)["seq"]) == "1..64"
    with pytest.warns(DimensionBoundWarning, match="dimension 'seq' can be at most 64: node 'position_slice' slices an axis of 64 up "
                                                    "to it; dims allowed up to 100, narrowed to 1..64"):
        mod = byoc.from_onnx(model, dims={"batch": (1, 2), "seq": (1, 100)})
    compiled = byoc.build(byoc.partition_for(mod, "onnxruntime"))
    ids = np.random.default_rng(0).integers(0, 1000, (2, 64), dtype=np.int64)
    assert_fp32_close(compiled.run(ids), onnxruntime_outputs(model, {"ids": ids}))
    with pytest.raises(InputError, match=r"dim 1 \(seq\) is 65, outside the range 1..64"):
        compiled.run(np.zeros((2, 65), np.int64))
