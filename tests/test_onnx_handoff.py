"""The ONNX hand-off (`byoc.codegen_json.graph_to_onnx`) as vendor API: its op table covers every op
the checks do and names the ONNX ops actually written; what it cannot write is refused naming the
op, the node and why; pooling in onnx's own node cases matches onnxruntime at opsets 17 and 20 in
models onnx's checker accepts; the docs show the generated table."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
import tvm
from tvm import relax
from tvm.relax import op as R

import byoc
from byoc.backend import Backend, CostRules, Limits
from byoc.backend.arrays import aligned
from byoc.codegen_json import JsonRuntime, onnx_checks, onnx_op_table, op_table_markdown, region_to_json
from byoc.codegen_json.to_onnx import LATEST_OPSET, OPSET, graph_to_onnx
from byoc.errors import CodegenError
from byoc.testing.conformance import node_case
from byoc.vendors.onnxruntime import SessionEngine

from conftest import REPO, assert_fp32_close, onnxruntime_outputs
from graphs import one_input_module

RNG = np.random.default_rng(0)
BOTH = (OPSET, LATEST_OPSET)


def _module(build, shape=(1, 2, 6, 6)) -> tvm.IRModule:
    return one_input_module(build, shape)


def _graph(build, shape=(1, 2, 6, 6)):
    return region_to_json(_module(build, shape)["main"], "region", "plugin")


def _onnx_vendor(opset: int) -> Backend:
    """A vendor that consumes ONNX as docs/onnx-handoff.md says: every op claimed with its check at
    `opset`, the engine an onnxruntime session on `graph_to_onnx(graph, constants, opset)`; MAC-less
    regions offloaded too."""
    vendor = Backend(name=f"onnx{opset}", limits=Limits(dtypes=("float32", "int32", "int64", "bool")),
                     cost=CostRules(fallback_without_macs=False),
                     codegen=JsonRuntime(build_engine=lambda graph, constants, settings: SessionEngine(
                         graph_to_onnx(graph, constants, opset).SerializeToString()), version=f"onnx-{opset}"))
    for op_name, check in onnx_checks(opset).items():
        vendor.supports(op_name, check=check)
    return vendor


# ---------------------------------------------------------------- the op table
@pytest.mark.parametrize("opset", BOTH)
def test_the_op_table_lists_every_op_the_checks_cover_with_conditions_and_opsets(opset):
    table = onnx_op_table(opset)
    assert [e.relax_op for e in table] == sorted(onnx_checks(opset))
    for entry in table:
        assert entry.onnx_ops and entry.condition and entry.dtypes, entry
        assert OPSET <= entry.opsets[0] <= entry.opsets[1] == LATEST_OPSET, entry
    by_op = {e.relax_op: e for e in table}
    assert by_op["relax.bitwise_and"].opsets == (18, 20)
    assert "dilated: from opset 19" in by_op["relax.nn.avg_pool2d"].condition
    assert "layout NCHW/OIHW to NCHW" in by_op["relax.nn.conv2d"].condition
    assert by_op["relax.add"].condition == "any call" and "float32" in by_op["relax.add"].dtypes
    assert by_op["relax.logical_and"].dtypes == ("bool",)
    assert by_op["relax.nn.gelu"].onnx_ops == (("Gelu",) if opset >= 20 else ("Div", "Erf", "Add", "Mul"))


def _stats():
    return [relax.const(RNG.uniform(0.5, 1.5, 2).astype("float32")) for _ in range(4)]


WRITTEN = {
    "relax.nn.gelu": lambda b, x: R.nn.gelu(x),
    "relax.nn.gelu_tanh": lambda b, x: R.nn.gelu_tanh(x),
    "relax.nn.silu": lambda b, x: R.nn.silu(x),
    "relax.rsqrt": lambda b, x: R.rsqrt(x),
    "relax.not_equal": lambda b, x: R.not_equal(x, relax.const(0.0)),
    "relax.nn.prelu": lambda b, x: R.nn.prelu(x, relax.const(np.full(2, 0.1, "float32"))),
    "relax.nn.batch_norm": lambda b, x: relax.TupleGetItem(b.emit(R.nn.batch_norm(x, *_stats(), axis=1, training=False)), 0),
    "relax.cumsum": lambda b, x: R.cumsum(x, axis=1, dtype="float64"),
    "relax.nn.avg_pool2d": lambda b, x: R.nn.avg_pool2d(x, pool_size=2, padding=1, ceil_mode=True),
    "relax.index_tensor": lambda b, x: R.index_tensor(x, relax.Tuple([relax.const(np.zeros((2, 1), "int64"), "int64"),
                                                                        relax.const(np.array([1, -2], "int64"), "int64")])),
}


@pytest.mark.parametrize("opset", BOTH)
@pytest.mark.parametrize("op_name", sorted(WRITTEN))
def test_the_table_names_the_onnx_ops_written(op_name, opset):
    graph, constants = _graph(WRITTEN[op_name])
    model = graph_to_onnx(graph, constants, opset)
    onnx.checker.check_model(model, full_check=True)
    entry = next(e for e in onnx_op_table(opset) if e.relax_op == op_name)
    assert {n.op_type for n in model.graph.node} == set(entry.onnx_ops)


def test_the_docs_show_the_generated_table():
    with open(os.path.join(REPO, "docs", "onnx-handoff.md")) as doc:
        assert op_table_markdown() in doc.read(), "regenerate the table in docs/onnx-handoff.md: see its op table section"


# ---------------------------------------------------------------- what it cannot write
def test_an_op_without_a_translation_is_refused_naming_op_node_and_where_to_look():
    def build(builder, x):
        return builder.emit(R.nn.softplus(x), name_hint="smooth")

    # A vendor that claimed an op the hand-off cannot write: its region reaches graph_to_onnx.
    plugin = Backend(name="plugin", cost=CostRules(fallback_without_macs=False),
                     codegen=JsonRuntime(build_engine=lambda graph, constants, options: graph_to_onnx(graph, constants),
                                              version="plugin-1"))
    plugin.supports("relax.nn.softplus")
    partitioned = byoc.partition_for(_module(build), plugin)
    with pytest.raises(Exception) as failed:
        byoc.build(partitioned, backends={"plugin": plugin}, strict=True)
    causes = [failed.value]
    while causes[-1].__cause__ is not None:
        causes.append(causes[-1].__cause__)
    assert any(isinstance(c, CodegenError) and "relax.nn.softplus (node 'smooth')" in str(c) for c in causes), causes
    (symbol, region), = ((gv.name_hint, f) for gv, f in partitioned.functions.items() if f.attrs and "Codegen" in f.attrs)
    graph, constants = region_to_json(region, symbol, "plugin")
    for opset in BOTH:
        with pytest.raises(CodegenError) as refused:
            graph_to_onnx(graph, constants, opset)
        message = str(refused.value)
        assert f"region {symbol} (plugin): relax.nn.softplus (node 'smooth') has no ONNX translation" in message
        assert "byoc.codegen_json.onnx_op_table()" in message and f"onnx_checks({opset})" in message


def test_an_op_claimed_without_its_check_is_refused_with_the_checks_reason():
    graph, constants = _graph(lambda b, x: b.emit(R.nn.avg_pool2d(x, pool_size=2, dilation=2), name_hint="pool"))
    with pytest.raises(CodegenError, match=r"relax\.nn\.avg_pool2d \(node 'pool'\) cannot be written at ONNX opset 17: "
                                           r"ONNX AveragePool takes this form from opset 19"):
        graph_to_onnx(graph, constants, OPSET)
    onnx.checker.check_model(graph_to_onnx(graph, constants, LATEST_OPSET), full_check=True)


@pytest.mark.parametrize("opset", [16, 21])
def test_an_opset_outside_17_to_20_is_refused(opset):
    graph, constants = _graph(lambda b, x: R.nn.relu(x))
    with pytest.raises(CodegenError, match=f"ONNX opset {opset}: byoc's hand-off writes opsets 17 to 20"):
        graph_to_onnx(graph, constants, opset)
    with pytest.raises(CodegenError, match="writes opsets 17 to 20"):
        onnx_checks(opset)


def test_an_undilated_average_pool_writes_no_dilations():
    graph, constants = _graph(lambda b, x: R.nn.avg_pool2d(x, pool_size=3, strides=2, padding=1))
    for opset in BOTH:
        model = graph_to_onnx(graph, constants, opset)
        onnx.checker.check_model(model, full_check=True)
        (pool,) = model.graph.node
        assert "dilations" not in {a.name for a in pool.attribute}


# ---------------------------------------------------------------- pooling: onnx's node cases
# Before the fix: the two ceil-mode cases whose last window starts in the end padding were
# written in ceil mode with Relax's smaller output shape, which onnx's checker refuses at 17 and
# 20 (onnxruntime's kernel dropped the window anyway); dilated average pooling at 17 failed in
# the emitter with no op or hint.
POOL_CASES = ["test_averagepool_2d_ceil_last_window_starts_on_pad", "test_maxpool_2d_ceil_output_size_reduce_by_one",
              "test_averagepool_2d_ceil", "test_maxpool_2d_ceil", "test_averagepool_2d_dilations",
              "test_averagepool_3d_dilations_small", "test_maxpool_2d_dilations"]


@pytest.mark.parametrize("opset", BOTH)
@pytest.mark.parametrize("name", POOL_CASES)
def test_pooling_node_cases_match_onnxruntime_at_both_opsets(name, opset):
    case = node_case(name)
    vendor = _onnx_vendor(opset)
    partitioned = byoc.partition_for(byoc.from_onnx(case.model), vendor)
    report = byoc.report(partitioned)
    dilated_average = "averagepool" in name and "dilations" in name
    if dilated_average and opset < 19:
        assert not report.regions and any("from opset 19" in r for h in report.host_ops for r in h.reasons), report.to_table()
    else:
        assert len(report.regions) == 1 and not report.host_ops, report.to_table()
        (symbol, region), = ((gv.name_hint, f) for gv, f in partitioned.functions.items() if f.attrs and "Codegen" in f.attrs)
        onnx.checker.check_model(graph_to_onnx(*region_to_json(region, symbol, vendor.name), opset), full_check=True)
    compiled = byoc.build(partitioned, backends={vendor.name: vendor}, strict=True)
    names = [i.name for i in case.model.graph.input]
    for inputs, expected in case.data_sets:
        feed = dict(zip(names, inputs))
        got = compiled.run(**feed)
        assert_fp32_close(got, list(expected))
        assert_fp32_close(got, onnxruntime_outputs(case.model, feed))


def test_a_ceil_mode_pooling_onnx_cannot_express_stays_on_the_host_with_the_reason():
    """Height drops its last window (Relax, as PyTorch), width keeps one reaching past its end
    padding: floor mode would lose the width's window, ceil mode (before opset 22) keeps the height's."""
    mod = _module(lambda b, x: R.nn.max_pool2d(x, pool_size=(1, 2), strides=2, ceil_mode=True), shape=(1, 2, 2, 5))
    assert tuple(int(d) for d in mod["main"].ret_ty.shape.values) == (1, 2, 1, 3)
    for opset in BOTH:
        vendor = _onnx_vendor(opset)
        report = byoc.report(byoc.partition_for(mod, vendor))
        assert not report.regions and any("ceil_mode" in r for h in report.host_ops for r in h.reasons), report.to_table()


# ---------------------------------------------------------------- symbolic shapes
def _symbolic_region() -> relax.Function:
    """Reshapes whose shapes the hand-off writes with 0/-1 and computes from the inputs, a
    slice ending at an expression of a dimension, and a Range over it."""
    batch, seq = tvm.tirx.Var("batch", "int64"), tvm.tirx.Var("seq", "int64")
    x = relax.Var("x", relax.TensorType([batch, seq, 8], "float32"))
    weight = relax.const(RNG.standard_normal((8, 8)).astype(np.float32))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            rows = builder.emit(R.reshape(x, relax.ShapeExpr([batch * seq, 8])))
            product = builder.emit(R.matmul(rows, weight))
            back = builder.emit(R.reshape(product, relax.ShapeExpr([batch, seq, 8])))
            heads = builder.emit(R.reshape(back, relax.ShapeExpr([batch, seq, 2, 4])))
            cut = builder.emit(R.strided_slice(heads, axes=[1], begin=[0], end=[seq - 1], assume_inbound=True))
            positions = builder.emit(R.expand_dims(R.arange(0, seq - 1, 1, "float32"), axis=[1, 2]))
            out = builder.emit_output(builder.emit(R.add(cut, positions)))
        builder.emit_func_output(out)
    return builder.get()["main"], weight.value.numpy()


def test_a_symbolic_graph_is_one_onnx_model_for_every_shape():
    from byoc.ir.dims import DimRange

    func, weight = _symbolic_region()
    graph, constants = region_to_json(func, "region", "plugin", {"batch": DimRange(1, 8, 2), "seq": DimRange(2, 64, 16)})
    assert graph["inputs"][0]["shape"] == ["batch", "seq", 8]
    assert graph["dims"] == {"batch": {"low": 1, "high": 8, "opt": 2}, "seq": {"low": 2, "high": 64, "opt": 16}}
    assert graph["nodes"][-1]["outputs"][0]["shape"] == ["batch", "seq - 1", 2, 4]
    model = graph_to_onnx(graph, constants, LATEST_OPSET)
    onnx.checker.check_model(model, full_check=True)
    assert [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim][:2] == ["batch", "seq"]
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("Shape") == 2  # each dimension read once, by the reshape that needs both and the slice
    # One session for every shape; the buffers sit at the same addresses whatever the shape, so
    # each shape needs a binding of its own (a binding is named by addresses and shapes).
    session = SessionEngine(model.SerializeToString())
    source, result = aligned(np.zeros(3 * 17 * 8, np.float32)), aligned(np.zeros(3 * 16 * 8, np.float32))
    for batch, seq in [(2, 5), (1, 3), (3, 17), (2, 5)]:
        x = source[: batch * seq * 8].reshape(batch, seq, 8)
        x[...] = RNG.standard_normal((batch, seq, 8))
        want = (x.reshape(-1, 8) @ weight).reshape(batch, seq, 2, 4)[:, : seq - 1] + np.arange(seq - 1, dtype=np.float32)[:, None, None]
        got = result[: want.size].reshape(want.shape)
        session.run([x], [got])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_symbolic_dimensions_are_checked():
    from byoc.codegen_json.schema import validate_graph
    from byoc.codegen_json.symbolic_dims import SymbolicDimError, dim_text, dim_value
    from byoc.errors import JsonGraphError
    from byoc.ir.dims import DimRange

    seq = tvm.tirx.Var("seq", "int64")
    assert dim_text(tvm.tirx.floordiv(seq - 1, 2) * 3) == "((seq - 1) // 2) * 3"
    assert dim_value("((seq - 1) // 2) * 3", {"seq": 9}) == 12
    for bad in ("seq ** 2", "max(seq, 1)", "seq + 1.5", "seq +"):
        with pytest.raises(SymbolicDimError):
            dim_value(bad, {"seq": 9})
    with pytest.raises(SymbolicDimError, match="no symbolic form"):
        dim_text(tvm.tirx.max(seq, 1))
    graph, _ = region_to_json(_symbolic_region()[0], "region", "plugin", {"batch": DimRange(1, 8, 2), "seq": DimRange(2, 64, 16)})
    undeclared = {**graph, "dims": {"batch": graph["dims"]["batch"]}}
    with pytest.raises(JsonGraphError, match=r"input 'x' reads dimension\(s\) \['seq'\], which the graph's dims do not declare"):
        validate_graph(undeclared, "region r (plugin)")
    with pytest.raises(JsonGraphError, match="constants are static"):
        validate_graph({**graph, "constants": {"region.c0": {"shape": ["seq", 8], "dtype": "float32"}}}, "region r (plugin)")


def test_advanced_indexing_is_one_gather_for_every_shape():
    """x[rows, columns] with indices of other shapes, broadcast together, negative ones
    included (transformers' padding masks index so, with a dynamic batch)."""
    from byoc.ir.dims import DimRange

    batch = tvm.tirx.Var("batch", "int64")
    x = relax.Var("x", relax.TensorType([batch, 6, 3], "float32"))
    rows = relax.Var("rows", relax.TensorType([batch, 1], "int64"))
    columns = relax.Var("columns", relax.TensorType([1, 4], "int64"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x, rows, columns]):
        with builder.dataflow():
            out = builder.emit_output(builder.emit(R.index_tensor(x, relax.Tuple([rows, columns]))))
        builder.emit_func_output(out)
    graph, constants = region_to_json(builder.get()["main"], "region", "plugin", {"batch": DimRange(1, 8, 2)})
    model = graph_to_onnx(graph, constants, LATEST_OPSET)
    onnx.checker.check_model(model, full_check=True)
    session = SessionEngine(model.SerializeToString())
    for count in (1, 5):
        data = RNG.standard_normal((count, 6, 3)).astype(np.float32)
        index_rows = np.arange(count, dtype=np.int64)[:, None] - count  # negative: from the end
        index_columns = np.array([[0, 5, -1, 2]], np.int64)
        want = data[index_rows, index_columns]
        got = aligned(np.zeros(want.shape, np.float32))
        session.run([aligned(data), aligned(index_rows), aligned(index_columns)], [got])
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mode, numpy_mode", [("constant", "constant"), ("reflect", "reflect"), ("replicate", "edge")])
def test_padding_is_written_in_each_mode(mode, numpy_mode):
    graph, constants = _graph(lambda b, x: R.nn.pad(x, [0, 0, 0, 1, 2, 1, 1, 3], mode, 0.25))
    model = graph_to_onnx(graph, constants, OPSET)
    onnx.checker.check_model(model, full_check=True)
    x = RNG.standard_normal((1, 2, 6, 6)).astype(np.float32)
    extra = {"constant_values": 0.25} if mode == "constant" else {}
    want = np.pad(x, [(0, 0), (0, 1), (2, 1), (1, 3)], mode=numpy_mode, **extra)
    got = aligned(np.zeros(want.shape, np.float32))
    SessionEngine(model.SerializeToString()).run([aligned(x)], [got])
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", ["test_resize_upsample_scales_nearest", "test_resize_downsample_sizes_linear_pytorch_half_pixel",
                                  "test_resize_upsample_sizes_cubic", "test_resize_upsample_sizes_nearest_floor_align_corners"])
def test_a_resize_is_written_as_onnx_resize_and_runs_on_onnxruntime(case):
    """Resize (YOLO's and MobileViT's upsampling) is handed off, where it stayed on the host between
    regions: onnx's own cases, taken by onnxruntime strictly and equal to its reference outputs."""
    from byoc.testing import conformance

    result = conformance.check_case(conformance.node_case(case), "onnxruntime")
    assert result.status == conformance.PASS, result


def test_hard_activations_are_handed_off_as_the_ops_the_model_had():
    """TVM's importer writes HardSwish as x * Clip(x + 3, 0, 6) / 6 and HardSigmoid as
    Clip(x * alpha + beta, 0, 1); written back as HardSwish and HardSigmoid, onnxruntime fuses
    them into the convolutions before them (MobileNetV3 ran its 29 of them as 4 ops each)."""
    import json

    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    weights = [onnx.numpy_helper.from_array(rng.standard_normal((8, 8, 3, 3)).astype("float32") * 0.3, name) for name in ("w1", "w2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]), helper.make_node("HardSwish", ["c1"], ["a"]),
             helper.make_node("Conv", ["a", "w2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("HardSigmoid", ["c2"], ["s"], alpha=0.2, beta=0.4), helper.make_node("Mul", ["s", "a"], ["y"])]
    graph = helper.make_graph(nodes, "hard", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), "onnxruntime"), strict=True)
    artifact, = compiled.artifacts
    written = graph_to_onnx(json.loads(artifact.payload), compiled.store.subset(artifact.constants))
    ops = [node.op_type for node in written.graph.node]
    assert ops.count("HardSwish") == 1 and ops.count("HardSigmoid") == 1 and "Clip" not in ops, ops
    hard_sigmoid = next(node for node in written.graph.node if node.op_type == "HardSigmoid")
    assert {a.name: round(a.f, 6) for a in hard_sigmoid.attribute} == {"alpha": 0.2, "beta": 0.4}
    x = {"x": rng.standard_normal((1, 8, 6, 6)).astype("float32") * 3}
    assert_fp32_close(compiled.run(x), onnxruntime_outputs(model, x))
