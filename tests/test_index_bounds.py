"""Indices out of range are a clear error on every path, never garbage, NaN or a crash.

Each graph indexes with a run-time index tensor, followed by a MatMul so that the onnxruntime
vendor has a region to run (its Gather runs there; the other ops stay on the host). In-range
and negative in-range indices must match onnxruntime; an index of n, 5n, 1e8 or below -n must
raise `IndexOutOfRangeError` naming the node, the index and the valid range.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from legacy_export import legacy_gpt2
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc.errors import IndexOutOfRangeError, ModelLoadError

from conftest import assert_fp32_close, onnxruntime_outputs

VENDORS = ["reference", "dnnl", "onnxruntime"]
RNG = np.random.default_rng(0)


@dataclass(frozen=True)
class Case:
    """A graph whose node `node` indexes `data` with the run-time input `indices`."""

    model: onnx.ModelProto
    node: str
    op: str
    indices: np.ndarray  # valid, with negatives
    data: dict[str, np.ndarray]  # the other inputs
    bad_at: tuple[int, ...]  # where an out-of-range index is put
    size: int  # the size of the axis indexed there


def _case(op: str, node_inputs: list[str], attrs: dict, inputs: dict[str, np.ndarray], indices: np.ndarray,
          result_width: int, bad_at: tuple[int, ...], size: int, initializers: dict[str, np.ndarray] | None = None) -> Case:
    node = f"block/{op}"
    weight = RNG.standard_normal((result_width, 3)).astype(np.float32)
    nodes = [helper.make_node(op, node_inputs, ["picked"], name=node, **attrs),
             helper.make_node("MatMul", ["picked", "weight"], ["y"], name="head/MatMul")]
    declared = {**inputs, "indices": indices}
    graph = helper.make_graph(
        nodes, op,
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in declared.items()],
        [helper.make_empty_tensor_value_info("y")],
        [numpy_helper.from_array(a, n) for n, a in {"weight": weight, **(initializers or {})}.items()])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    model.ir_version = 9
    return Case(model, node, op, indices, inputs, bad_at, size)


def _cases() -> dict[str, Case]:
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    cube = RNG.standard_normal((4, 5, 6)).astype(np.float32)
    table = RNG.standard_normal((10, 4)).astype(np.float32)
    return {
        # An embedding: a constant table, as models have it.
        "gather_axis0": _case("Gather", ["table", "indices"], {"axis": 0}, {}, np.array([3, -1, 0, -10, 9], np.int64),
                              4, (0,), 10, {"table": table}),
        "gather_axis1": _case("Gather", ["x", "indices"], {"axis": 1}, {"x": x}, np.array([[0, -1], [5, -6]], np.int64),
                              2, (1, 0), 6),
        "gather_elements": _case("GatherElements", ["x", "indices"], {"axis": 1}, {"x": x},
                                 RNG.integers(-6, 6, (4, 3)).astype(np.int64), 3, (2, 1), 6),
        "gather_nd": _case("GatherND", ["cube", "indices"], {}, {"cube": cube},
                           np.array([[0, -1], [3, 4], [-4, -5]], np.int64), 6, (1, 1), 5),
        "scatter_nd": _case("ScatterND", ["x", "indices", "updates"], {}, {"x": x, "updates": RNG.standard_normal(3).astype(np.float32)},
                            np.array([[0, -1], [3, 4], [-3, 2]], np.int64), 6, (2, 1), 6),
        "scatter_elements": _case("ScatterElements", ["x", "indices", "updates"], {"axis": 0},
                                  {"x": x, "updates": RNG.standard_normal((2, 6)).astype(np.float32)},
                                  np.array([[0, -1, 2, 3, -4, 1], [1, 2, -1, 0, 0, 3]], np.int64), 6, (1, 3), 4),
    }


CASES = _cases()


@pytest.fixture(scope="module")
def compiled():
    built: dict[tuple[str, str], byoc.CompiledModel] = {}

    def get(case_name: str, vendor: str) -> byoc.CompiledModel:
        if (case_name, vendor) not in built:
            built[case_name, vendor] = byoc.build(byoc.partition_for(byoc.from_onnx(CASES[case_name].model), vendor))
        return built[case_name, vendor]

    return get


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_indices_in_range_with_negatives_match_onnxruntime(compiled, name, vendor):
    case = CASES[name]
    inputs = {**case.data, "indices": case.indices}
    assert (case.indices < 0).any()
    assert_fp32_close(compiled(name, vendor).run(**inputs), onnxruntime_outputs(case.model, inputs))


@pytest.mark.parametrize("vendor", VENDORS)
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("times", [1, 5, "1e8", "below"])
def test_index_out_of_range_names_node_index_and_range(compiled, name, vendor, times):
    case = CASES[name]
    bad = {1: case.size, 5: 5 * case.size, "1e8": 10**8, "below": -case.size - 1}[times]
    indices = case.indices.copy()
    indices[case.bad_at] = bad
    with pytest.raises(IndexOutOfRangeError) as error:
        compiled(name, vendor).run(**case.data, indices=indices)
    message = str(error.value)
    assert f"'{case.node}' ({case.op})" in message
    if not (vendor == "onnxruntime" and case.op == "GatherElements"):  # onnxruntime does not say which index
        assert f"index {bad} is out of range" in message
    assert f"{-case.size} to {case.size - 1}" in message


def test_the_model_still_runs_after_an_index_error(compiled):
    case = CASES["gather_axis0"]
    model = compiled("gather_axis0", "dnnl")
    with pytest.raises(IndexOutOfRangeError):
        model.run(indices=np.full_like(case.indices, case.size))
    assert_fp32_close(model.run(indices=case.indices), onnxruntime_outputs(case.model, {"indices": case.indices}))


def test_a_constant_index_out_of_range_is_refused_at_import():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])
    node = helper.make_node("Gather", ["x", "where"], ["y"], name="pick/Gather", axis=1)
    graph = helper.make_graph([node], "g", [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1])],
                              [numpy_helper.from_array(np.array([6], np.int64), "where")])
    with pytest.raises(ModelLoadError, match=r"'pick/Gather' \(Gather\).*index 6 is out of range for axis 1 of size 6"):
        byoc.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def test_an_exported_gpt2_with_an_id_equal_to_the_vocabulary_size(tmp_path):
    model, valid = legacy_gpt2(tmp_path, layers=1, width=32, vocab=100, length=8)
    compiled_model = byoc.build(byoc.partition_for(byoc.from_onnx(model), "dnnl"))
    assert_fp32_close(compiled_model.run(valid), onnxruntime_outputs(model, {"input_ids": valid}))
    gather = next(n.name for n in model.graph.node if n.op_type == "Gather" and "wte" in n.input[0])
    with pytest.raises(IndexOutOfRangeError, match=rf"'{gather}' \(Gather\): index 100 is out of range.*-100 to 99"):
        compiled_model.run(np.full_like(valid, 100))


@pytest.mark.parametrize("vendor", VENDORS)
def test_token_ids_of_any_batch_and_length_are_checked(vendor):
    """An embedding lookup whose ids have dynamic dimensions (as exporters write token ids):
    unchecked, an id past the table read other memory, on the host and with dnnl, at every
    shape in range."""
    table = RNG.standard_normal((10, 4)).astype(np.float32)
    weight = RNG.standard_normal((4, 3)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "ids"], ["picked"], name="embeddings/Gather", axis=0),
             helper.make_node("MatMul", ["picked", "weight"], ["y"], name="head/MatMul")]
    graph = helper.make_graph(nodes, "lookup", [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "sequence"])],
                              [helper.make_empty_tensor_value_info("y")],
                              [numpy_helper.from_array(table, "table"), numpy_helper.from_array(weight, "weight")])
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    model.ir_version = 9
    compiled_model = byoc.build(byoc.partition_for(byoc.from_onnx(model, dims={"batch": (1, 4), "sequence": (1, 16)}), vendor))
    for shape in ((1, 5), (3, 2)):
        ids = RNG.integers(-10, 10, shape).astype(np.int64)
        assert_fp32_close(compiled_model.run(ids), onnxruntime_outputs(model, {"ids": ids}))
        ids[-1, -1] = 10
        with pytest.raises(IndexOutOfRangeError, match=r"'embeddings/Gather' \(Gather\).*(index 10 is out of range|idx=10)"):
            compiled_model.run(ids)
