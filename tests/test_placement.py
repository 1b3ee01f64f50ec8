"""Measured placement: segments, the cheapest cover, the measurement cache, the worker, and a
search over a TVM RPC tracker with two device servers started here on loopback."""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc
from byoc.errors import PlacementError
from byoc.partition.coverage import backend_coverage
from byoc.partition.pipeline import partition_graph
from byoc.placement.auto import segment_backends
from byoc.placement.measure import LocalMeasurer
from byoc.placement.search import cheapest_cover
from byoc.placement.segments import Segment, cut_segments, extract

from conftest import assert_fp32_close, onnxruntime_outputs, small_model, small_module

BACKENDS = ["dnnl", "onnxruntime"]


def test_cheapest_cover_pays_for_each_switch():
    costs = [{"a": 1.0, "b": 2.0}, {"a": 1.5, "b": 1.0}, {"a": 1.0, "b": 2.0}]
    # Switching is free: each segment takes its cheapest backend.
    assert cheapest_cover(costs, {}) == (["a", "b", "a"], 3.0)
    # Going from b back to a costs more than b saves: stay on a.
    chosen, total = cheapest_cover(costs, {("b", "a"): 1.0})
    assert chosen == ["a", "a", "a"] and total == pytest.approx(3.5)
    # Entering a from the host costs enough that b from the start wins.
    assert cheapest_cover(costs, {("host", "a"): 3.0, ("b", "a"): 3.0}) == (["b", "b", "b"], 5.0)
    with pytest.raises(PlacementError, match="segment s1"):
        cheapest_cover([{"a": 1.0}, {}], {}, ["s0", "s1"])


def test_segments_cover_the_model_and_extract_to_the_same_results():
    mod = small_module("resnet18")
    coverages = [backend_coverage(mod, byoc.get_backend(b)) for b in BACKENDS]
    segments = cut_segments(mod, coverages, pieces=6)
    bindings = mod["main"].body.blocks[0].bindings
    assert segments[0].start == 0 and segments[-1].end == len(bindings)
    assert all(a.end == b.start for a, b in zip(segments, segments[1:]))
    assert len(segments) >= 4
    # Running the segments one after the other on the host gives the model's outputs.
    inputs = byoc.models.sample_inputs(small_model("resnet18"))
    values = dict(inputs)
    for segment in segments:
        piece = extract(mod, segment)
        outputs = byoc.build(piece.mod).run(*[values[n] for n in piece.inputs])
        values.update(zip(piece.outputs, outputs))
    assert_fp32_close([values[piece.outputs[0]]], onnxruntime_outputs(small_model("resnet18"), inputs))


def _split_heads_model():
    """q, k and v split from one product, then each projected: the split's parts are bound
    while their first reader converts, so all three take that reader's name (as exported
    attention's do)."""
    rng = np.random.default_rng(0)

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "w_qkv"], ["qkv"], name="qkv_proj"),
        helper.make_node("Split", ["qkv"], ["q", "k", "v"], name="split", axis=2, num_outputs=3),
        helper.make_node("Reshape", ["q", "heads"], ["q4"], name="view"),
        helper.make_node("Reshape", ["q4", "rows"], ["q3"], name="view_back"),
        *(helper.make_node("MatMul", [t, f"w_{t}"], [f"p_{t}"], name=f"proj_{t}") for t in ("q3", "k", "v")),
        helper.make_node("Add", ["p_q3", "p_k"], ["qk"], name="add_qk"),
        helper.make_node("Add", ["qk", "p_v"], ["y"], name="out"),
    ]
    graph = helper.make_graph(
        nodes, "split_heads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 48])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16])],
        [weight("w_qkv", 48, 48), *(weight(f"w_{t}", 16, 16) for t in ("q3", "k", "v")),
         numpy_helper.from_array(np.array([1, 8, 4, 4], np.int64), "heads"), numpy_helper.from_array(np.array([1, 8, 16], np.int64), "rows")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_values_sharing_a_node_name_cross_a_cut_apart():
    model = _split_heads_model()
    mod = byoc.from_onnx(model)
    bindings = list(mod["main"].body.blocks[0].bindings)
    parts = [p for p, b in enumerate(bindings) if b.var.name == "view"]
    assert len(parts) == 3  # the split's three parts, all named after their first reader
    cut = parts[-1] + 1
    segments = [Segment(0, 0, cut, [], 0, ["host"], {}), Segment(1, cut, len(bindings), [], 0, ["host"], {})]
    first, second = (extract(mod, s) for s in segments)
    assert len(set(first.outputs)) == 3 and first.outputs == second.inputs
    inputs = {"x": np.random.default_rng(1).standard_normal((1, 8, 48)).astype(np.float32)}
    values = dict(inputs)
    for piece in (first, second):
        values.update(zip(piece.outputs, byoc.build(piece.mod).run(*[values[n] for n in piece.inputs])))
    assert_fp32_close([values[second.outputs[0]]], onnxruntime_outputs(model, inputs))


def test_auto_placement_runs_like_onnxruntime_and_second_search_measures_nothing(tmp_path):
    mod = small_module("mlp")
    inputs = byoc.models.sample_inputs(small_model("mlp"))
    cold = byoc.partition_for(mod, BACKENDS, placement="auto", placement_inputs=inputs, placement_cache_dir=str(tmp_path))
    report = byoc.placement_report(cold)
    assert report.measured > 0 and report.measured_ms is not None
    for row in report.rows:
        assert row.chosen in row.costs
    assert_fp32_close(byoc.build(cold).run(**inputs), onnxruntime_outputs(small_model("mlp"), inputs))
    # Every op left on the host says why.
    assert all(op.reasons for op in byoc.report(cold).host_ops)
    warm = byoc.placement_report(
        byoc.partition_for(mod, BACKENDS, placement="auto", placement_inputs=inputs, placement_cache_dir=str(tmp_path)))
    assert warm.measured == 0 and warm.cached == report.measured + report.cached
    assert [r.chosen for r in warm.rows] == [r.chosen for r in report.rows]


def test_measurement_decides_on_segments_without_macs(tmp_path):
    """Between two products, a chain of element-wise ops forms segments without MACs. dnnl's rule
    sends such a region back to the host under priority placement; measured placement times it
    on dnnl all the same. Given that rule explicitly, the search keeps it, and its cached
    measurements do not answer for the search without it (cost options are part of the key)."""
    rng = np.random.default_rng(0)
    chain = ["Sigmoid", "Tanh", "Sigmoid", "Tanh", "Sigmoid", "Tanh", "Sigmoid", "Tanh"]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h0"], name="first")]
    nodes += [helper.make_node(op, [f"h{i}"], [f"h{i + 1}"], name=f"{op.lower()}{i}") for i, op in enumerate(chain)]
    nodes.append(helper.make_node("MatMul", [f"h{len(chain)}", "w1"], ["y"], name="second"))
    weights = [numpy_helper.from_array((rng.standard_normal((64, 64)) * 0.1).astype(np.float32), f"w{i}") for i in range(2)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    mod = byoc.from_onnx(model)
    inputs = {"x": rng.standard_normal((8, 64)).astype(np.float32)}
    measured = byoc.placement_report(byoc.partition_for(mod, ["dnnl"], placement="auto", placement_inputs=inputs,
                                                        placement_cache_dir=str(tmp_path)))
    without_macs = [row for row in measured.rows if row.macs == 0]
    assert without_macs and all("dnnl" in row.costs for row in without_macs), measured.to_table()
    ruled = byoc.placement_report(byoc.partition_for(mod, ["dnnl"], placement="auto", placement_inputs=inputs,
                                                     placement_cache_dir=str(tmp_path), fallback_without_macs=True))
    for row in (row for row in ruled.rows if row.macs == 0):
        assert "dnnl" not in row.costs and "no MACs" in row.notes["dnnl"], ruled.to_table()


def test_the_report_says_where_each_segment_runs_in_the_partition_kept():
    """When the end-to-end comparison keeps one backend alone, each row says where its segment
    runs in that partition, measured or not (a row without times once read "host")."""
    mod = small_module("mlp")
    segments = cut_segments(mod, [backend_coverage(mod, byoc.get_backend(b)) for b in BACKENDS], pieces=4)
    unknown = ["?"] * len(segments)
    for backend in BACKENDS:
        assert segment_backends(partition_graph(mod, [backend]), segments, unknown) == [backend] * len(segments)
    on_host = partition_graph(mod, ["dnnl"], host_ops=["relax.matmul", "relax.add", "relax.nn.relu", "relax.nn.softmax"])
    assert segment_backends(on_host, segments, unknown) == ["host"] * len(segments)


def test_a_spent_budget_places_the_rest_by_priority(tmp_path):
    mod = small_module("mlp")
    inputs = byoc.models.sample_inputs(small_model("mlp"))
    # One backend: the end-to-end comparison is then between two equal partitions, whichever it keeps.
    placed = byoc.partition_for(mod, ["dnnl"], placement="auto", budget_s=0, placement_inputs=inputs,
                                placement_cache_dir=str(tmp_path))
    report = byoc.placement_report(placed)
    for row in report.rows:  # nothing timed: each segment where priority puts it, and the report says so
        assert row.chosen == "dnnl" and not row.costs and row.notes["dnnl"].endswith("placed by priority")
    assert report.predicted_ms is None and "not predicted" in report.to_table()
    assert_fp32_close(byoc.build(placed).run(**inputs), onnxruntime_outputs(small_model("mlp"), inputs))


def test_placement_options_are_checked():
    mod = small_module("mlp")
    with pytest.raises(byoc.errors.PartitionError, match="placement must be one of"):
        byoc.partition_for(mod, "dnnl", placement="fastest")
    with pytest.raises(byoc.errors.PartitionError, match="placement='auto' only"):
        byoc.partition_for(mod, "dnnl", budget_s=10)
    with pytest.raises(byoc.errors.PartitionError, match="budget_s is the time allowed for measuring, in seconds: it must be at least 0, not -3"):
        byoc.partition_for(mod, "dnnl", placement="auto", budget_s=-3)
    with pytest.raises(byoc.errors.PartitionError, match="min_ops_per_region must be at least 0, not -1"):
        byoc.partition_for(mod, "dnnl", min_ops_per_region=-1)
    with pytest.raises(byoc.errors.UnknownBackendError, match="no_such_vendor"):
        byoc.partition_for(mod, ["dnnl", "no_such_vendor"], placement="auto")


def test_worker_reports_a_broken_candidate_and_carries_on(tmp_path):
    broken = tmp_path / "broken.byoc"
    broken.write_bytes(b"not an artifact")
    inputs = tmp_path / "inputs.npz"
    np.savez(inputs, np.zeros(1, np.float32))
    measurer = LocalMeasurer()
    try:
        failed = measurer.measure(str(broken), str(inputs))
        assert failed.ms is None and "ArtifactError" in failed.error
        worker = measurer.workers["mixed"]
        assert worker.alive()  # the same worker serves the next candidate
        worker.process.kill()  # a crash: the next candidate gets a new worker
        worker.process.wait()
        again = measurer.measure(str(broken), str(inputs))
        assert "ArtifactError" in again.error and measurer.workers["mixed"] is not worker
    finally:
        measurer.close()


@pytest.fixture(scope="module")
def farm():
    """A TVM RPC tracker and two byoc device servers on loopback."""
    import tvm.rpc.tracker

    from byoc.placement.remote import start_server

    tracker = tvm.rpc.tracker.Tracker("127.0.0.1", port=9190, port_end=9290, silent=True)
    address = f"127.0.0.1:{tracker.port}"
    servers = [start_server(address, "byoc-test", port=9300, port_end=9400) for _ in range(2)]
    session = tvm.rpc.connect_tracker("127.0.0.1", tracker.port)
    deadline = time.time() + 30
    while len(session.summary()["server_info"]) < 2 and time.time() < deadline:
        time.sleep(0.2)
    yield address
    for server in servers:
        server.terminate()
    tracker.terminate()


def test_search_over_rpc_tracker(farm, tmp_path):
    mod = small_module("mlp")
    inputs = byoc.models.sample_inputs(small_model("mlp"))
    placed = byoc.partition_for(mod, BACKENDS, placement="auto", placement_inputs=inputs, rpc_tracker=farm,
                                rpc_key="byoc-test", placement_cache_dir=str(tmp_path))
    report = byoc.placement_report(placed)
    assert "RPC key byoc-test" in report.where and report.measured > 0
    assert_fp32_close(byoc.build(placed).run(**inputs), onnxruntime_outputs(small_model("mlp"), inputs))


def test_rpc_errors_name_the_tracker_and_key(farm, tmp_path):
    mod = small_module("mlp")
    with pytest.raises(PlacementError, match="127.0.0.1:1 does not answer"):
        byoc.partition_for(mod, "dnnl", placement="auto", rpc_tracker="127.0.0.1:1", rpc_key="byoc-test")
    with pytest.raises(PlacementError, match="key 'gpu-farm'.*keys there: byoc-test"):
        byoc.partition_for(mod, "dnnl", placement="auto", rpc_tracker=farm, rpc_key="gpu-farm")
    with pytest.raises(PlacementError, match="HOST:PORT"):
        byoc.partition_for(mod, "dnnl", placement="auto", rpc_tracker="nowhere", rpc_key="byoc-test")
    with pytest.warns(UserWarning, match="measuring on this machine instead"):
        placed = byoc.partition_for(mod, "dnnl", placement="auto", rpc_tracker=farm, rpc_key="gpu-farm",
                                    rpc_fallback_local=True, placement_cache_dir=str(tmp_path))
    assert byoc.placement_report(placed).where.startswith("this machine")


def test_cli_partition_with_measured_placement(tmp_path, monkeypatch, capsys):
    from byoc.cli import main

    monkeypatch.setenv("BYOC_PLACEMENT_CACHE_DIR", str(tmp_path))
    assert main(["partition", "mlp", "--small", "--vendor", "dnnl,onnxruntime", "--placement", "auto"]) == 0
    out = capsys.readouterr().out
    assert "measured placement over dnnl, onnxruntime, host" in out and "end to end:" in out
    assert main(["partition", "mlp", "--small", "--vendor", "dnnl", "--rpc-key", "k"]) == 2
    assert "--placement auto only" in capsys.readouterr().err


def test_simulated_accelerator_is_placed_by_its_cost_model(tmp_path):
    mod = small_module("mlp")
    inputs = byoc.models.sample_inputs(small_model("mlp"))
    placed = byoc.partition_for(mod, ["vitis_ai"], placement="auto", placement_inputs=inputs, calibration=[inputs],
                                placement_cache_dir=str(tmp_path))
    report = byoc.placement_report(placed)
    assert any(row.chosen == "vitis_ai" for row in report.rows)
    # The DPU is simulated: its candidates are its estimate, and the whole model is not timed.
    assert report.measured_ms is None and "only estimated" in report.decision
    assert byoc.report(placed).regions


def _dense_chain(width: int = 512, rows: int = 64, layers: int = 4):
    """Dense layers large enough that int8 products are measurably faster than float32 ones."""
    rng = np.random.default_rng(3)
    nodes, weights, x = [], [], "x"
    for i in range(layers):
        nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"p{i}"], name=f"dense{i}"),
                  helper.make_node("Relu", [f"p{i}"], [f"h{i}"], name=f"relu{i}")]
        weights.append(numpy_helper.from_array((rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32), f"w{i}"))
        x = f"h{i}"
    graph = helper.make_graph(nodes, "dense_chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, width])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [rows, width])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_error_budget_chooses_each_segments_backend_and_precision(tmp_path):
    """placement='auto' with max_rel_l2: each segment gets int8 options (byoc's quantization on
    the backends that compute it), timed with the rest; the model kept is within the budget when
    measured here against the fp32 model, and the report's error is that measured error."""
    model = _dense_chain()
    mod = byoc.from_onnx(model)
    rng = np.random.default_rng(0)
    samples = [{"x": rng.standard_normal((64, 512)).astype(np.float32)} for _ in range(3)]
    fp32 = byoc.build(byoc.partition_for(mod, "dnnl"))
    want = [fp32.run(**s)[0] for s in samples]
    for budget in (0.5, 1e-6):
        placed = byoc.partition_for(mod, ["dnnl"], placement="auto", max_rel_l2=budget, calibration=samples,
                                    placement_inputs=samples[0], placement_cache_dir=str(tmp_path))
        report = byoc.placement_report(placed)
        table = report.to_table()
        assert report.budget == budget and report.samples == 3 and "precision under an error budget" in table, table
        dense = [row for row in report.rows if row.macs]
        assert len(dense) == 4 and all("dnnl:int8" in row.costs for row in dense), table  # a dense layer a segment
        int8_rows = [row for row in report.rows if row.chosen == "dnnl:int8"]
        quantized = sum(n for r in byoc.report(placed).regions for p, n in r.patterns.items() if p.startswith("dnnl.qdense"))
        assert quantized == len(int8_rows), (quantized, table)
        got = [byoc.build(placed).run(**s)[0] for s in samples]
        error = float(np.sqrt(sum(np.sum((g - w) ** 2) for g, w in zip(got, want)) / sum(np.sum(w ** 2) for w in want)))
        assert error <= budget and abs(error - report.rel_l2) < 1e-4, (error, table)
        if budget < 1e-3:
            assert not int8_rows, table
        elif all(row.costs["dnnl:int8"] < row.costs["dnnl"] for row in dense):  # int8 faster everywhere
            assert len(int8_rows) == len(dense), table


def test_choosing_precision_keeps_the_fastest_choice_within_the_budget():
    """The search over options with the errors given (squared errors adding up, as independent
    ones do): the fastest cover when it is within the budget; else int8 segments by time saved
    per squared error, each addition measured, none that would exceed the budget."""
    from byoc.placement.joint import Switch, choose

    options = [{"dnnl": 1.0, "dnnl:int8": 0.5}, {"dnnl": 1.0, "dnnl:int8": 0.2}, {"dnnl": 1.0, "dnnl:int8": 0.9},
               {"dnnl": 1.0, "dnnl:int8": 1.5}]
    alone = {0: 0.01, 1: 0.02, 2: 0.001, 3: 0.0}

    class Errors:  # each int8 segment's error, adding in squares
        def __init__(self) -> None:
            self.measured = 0

        def error(self, choice):
            self.measured += 1
            return float(np.sqrt(sum(alone[i] ** 2 for i, o in choice.items() if o.endswith(":int8"))))

    by_name = {"dnnl": byoc.get_backend("dnnl")}
    for budget, want in ((0.05, [0, 1, 2]), (0.0205, [1, 2]), (0.015, [0, 2]), (0.0005, [])):
        probe = Errors()
        chosen, error, errors = choose(options, Switch({}), by_name, probe, budget, ["a", "b", "c", "d"], None)
        assert [i for i, o in enumerate(chosen) if o == "dnnl:int8"] == want, (budget, chosen)
        assert error <= budget and error == probe.error(dict(enumerate(chosen)))
        assert 3 not in {i for i, _ in errors}  # slower in int8: never measured


def test_every_segment_quantized_alone_is_one_int8_region():
    """A segment's quantized value that a later segment reads is an output of its piece: it gets a
    dequantize of its own, so the int8 convolution reading it still fuses the other. Sharing one
    sent that convolution to the host (28 ms instead of 1.3 on a ResNet-50 segment)."""
    from byoc.placement.joint import quantized_piece, segment_layers
    from byoc.runtime_metadata.calibration import value_ranges

    model = small_model("resnet18")
    mod = small_module("resnet18")
    samples = [byoc.models.sample_inputs(model, seed=s) for s in range(2)]
    dnnl = byoc.get_backend("dnnl")
    segments = cut_segments(mod, [backend_coverage(mod, dnnl)], pieces=8)
    layers = segment_layers(mod, segments)
    known = {}

    def ranges(ids):
        known.update(value_ranges(mod, [i for i in ids if i not in known], samples, backends=[dnnl]))
        return known

    handed_out = 0
    for segment, held in zip(segments, layers):
        if not held:
            continue
        piece = extract(mod, segment)
        report = byoc.report(partition_graph(quantized_piece(piece, held, ranges), [dnnl]))
        assert report.offload_ratio_macs == 1.0 and len(report.regions) == 1, report.to_table()
        handed_out += len(piece.outputs) > 1
    assert handed_out  # some segment hands a residual on


def test_a_model_with_dynamic_dimensions_is_timed_at_its_representative_shape(tmp_path):
    """Candidates are timed at each dimension's opt; the placement found there partitions the
    model for every shape in range, and the report says where it was timed."""
    model = onnx.ModelProto()
    model.CopyFrom(small_model("mlp"))  # the fixture's model is shared: its shapes stay as they are
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.shape.dim[0].dim_param = "batch"
    mod = byoc.from_onnx(model, dims={"batch": (1, 4, 16)})
    placed = byoc.partition_for(mod, ["dnnl"], placement="auto", placement_cache_dir=str(tmp_path))
    table = byoc.placement_report(placed).to_table()
    assert "timed at batch=4 (each dynamic dimension at its range's opt)" in table, table
    report = byoc.report(placed)
    assert report.offload_ratio_macs == 1.0 and "batch 1..16 (opt 4; given)" in report.to_table()
    compiled = byoc.build(placed)
    for batch in (1, 4, 16):
        x = np.random.default_rng(batch).standard_normal((batch, 64)).astype(np.float32)
        inputs = {model.graph.input[0].name: x}
        assert_fp32_close(compiled.run(**inputs), onnxruntime_outputs(model, inputs))
