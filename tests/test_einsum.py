"""Einsum becomes transposes, sums and one matrix product, which every backend takes and every
report counts (TVM's converter wrote a kernel no backend could take, whose MACs no report
counted). Each equation is checked against onnxruntime, on the host and on dnnl."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from tvm import relax

import byoc

from conftest import assert_fp32_close, onnxruntime_outputs

# equation, operand shapes (a name is a dynamic dimension)
EQUATIONS = [
    ("bhqd,bhkd->bhqk", [(2, 3, 5, 8), (2, 3, 7, 8)]),  # attention scores (MaxViT, Swin)
    ("bhqk,bhkd->bhqd", [(2, 3, 5, 7), (2, 3, 7, 8)]),
    ("ij,jk", [(4, 6), (6, 5)]),  # implicit result: ik
    ("bij,bjk->bik", [("batch", 4, 6), ("batch", 6, 5)]),
    ("nchw,nhwk->nck", [(1, 3, 4, 5), (1, 4, 5, 6)]),  # two contracted letters
    ("i,j->ij", [(4,), (5,)]),  # outer product
    ("bi,bi->b", [(3, 8), (3, 8)]),  # batched dot
    ("ijk,jl->lki", [(2, 3, 4), (3, 5)]),  # a result in another order
    ("abc,cd->abd", [(2, 3, 4), (4, 5)]),  # several letters of one operand
    ("ij,jk->k", [(3, 4), (4, 5)]),  # a letter only one operand has, summed
    ("ijk->kji", [(2, 3, 4)]),  # one operand: a transpose
    ("ijk->j", [(2, 3, 4)]),  # and a sum
]


def _model(equation: str, shapes: list[tuple]):
    inputs = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, list(shape)) for i, shape in enumerate(shapes)]
    node = helper.make_node("Einsum", [f"x{i}" for i in range(len(shapes))], ["y"], equation=equation, name="the_einsum")
    at = [[2 if d == "batch" else d for d in shape] for shape in shapes]
    result = list(np.einsum(equation, *(np.zeros(s, np.float32) for s in at)).shape)
    if any("batch" in shape for shape in shapes):  # the one such case keeps it first
        result[0] = "batch"
    graph = helper.make_graph([node], "einsum", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, result)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("equation, shapes", EQUATIONS, ids=[e for e, _ in EQUATIONS])
def test_einsum_as_matrix_products_matches_onnxruntime(equation, shapes):
    model = _model(equation, shapes)
    mod = byoc.from_onnx(model)
    ops = {str(binding.value.op.name) for block in mod["main"].body.blocks for binding in block.bindings
           if isinstance(binding.value, relax.Call) and hasattr(binding.value.op, "name")}
    assert "relax.call_tir" not in ops, ops
    rng = np.random.default_rng(0)
    for batch in (1, 3) if any("batch" in s for s in shapes) else (None,):
        feeds = {f"x{i}": rng.standard_normal([batch if d == "batch" else d for d in shape]).astype(np.float32)
                 for i, shape in enumerate(shapes)}
        want = onnxruntime_outputs(model, feeds)
        for compiled in (byoc.build(mod), byoc.build(byoc.partition_for(mod, "dnnl"))):
            assert_fp32_close(compiled.run(**feeds), want)


def test_the_report_counts_an_einsums_macs_where_they_run():
    report = byoc.report(byoc.partition_for(byoc.from_onnx(_model("bhqd,bhkd->bhqk", [(2, 3, 5, 8), (2, 3, 7, 8)])), "dnnl"))
    assert report.total_macs == 2 * 3 * 5 * 7 * 8 and report.offloaded_macs == report.total_macs


def test_a_diagonal_is_left_to_tvm():
    model = _model("ii->i", [(4, 4)])
    feeds = {"x0": np.random.default_rng(1).standard_normal((4, 4)).astype(np.float32)}
    assert_fp32_close(byoc.build(byoc.from_onnx(model)).run(**feeds), onnxruntime_outputs(model, feeds))

