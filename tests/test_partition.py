"""Partitioning step by step: grouping, annotation, merging, splitting, fallback, priorities."""

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.relax import op as R
from tvm.relax.dpl import is_op, wildcard

import byoc
from byoc.annotate import fused_pattern
from byoc.errors import PartitionError, PredicateError, UnknownBackendError

from graphs import all_op_calls, chain_module, make_backend, op_calls, region_functions, registered, tensor

ELEMENTWISE = ("relax.add", "relax.multiply", "relax.nn.relu", "relax.tanh", "relax.matmul")


def test_region_functions_carry_codegen_and_symbol():
    with registered(make_backend("acc", ELEMENTWISE)):
        mod = byoc.partition_for(chain_module(["relu", "add", "tanh"]), "acc")
    regions = region_functions(mod)
    assert list(regions) == ["acc_0"]
    attrs = regions["acc_0"].attrs
    assert attrs["Codegen"] == "acc" and attrs["global_symbol"] == "acc_0"
    assert op_calls(mod["main"]) == []


def test_unsupported_op_splits_regions_and_records_the_reason():
    with registered(make_backend("acc", ELEMENTWISE)):
        mod = byoc.partition_for(chain_module(["relu", "sin", "tanh"]), "acc")
    report = byoc.report(mod)
    assert [r.ops for r in report.regions] == [["relax.nn.relu"], ["relax.tanh"]]
    (host,) = report.host_ops
    assert host.node == "sin1" and host.ops == ["relax.sin"]
    assert host.reasons == ["acc: no pattern or op rule for relax.sin"]


def test_predicate_reason_reaches_the_report():
    backend = make_backend("acc", ("relax.add",))
    backend.supports("relax.nn.relu", check=lambda call: "relu is disabled for this test")
    with registered(backend):
        report = byoc.report(byoc.partition_for(chain_module(["relu", "add"]), "acc"))
    assert report.host_reasons() == {"relu0": ["acc: relu is disabled for this test"]}


def test_a_check_answers_none_or_a_reason():
    """One way to declare op rules, on the backend; a check that answers anything but None or a
    reason (True, False, an empty string) is the vendor's error, named, not a silent verdict."""
    backend = make_backend("paper_acc")

    @backend.op("relax.tanh")
    def tanh(call):
        return None if call.args[0].ty.dtype == "float32" else "float32 only"

    with registered(backend):
        report = byoc.report(byoc.partition_for(chain_module(["tanh", "relu"]), "paper_acc"))
    assert [r.ops for r in report.regions] == [["relax.tanh"]]
    for answer in (True, False, ""):
        backend.supports("relax.tanh", check=lambda call, answer=answer: answer)
        with registered(backend), pytest.raises(PredicateError, match=f"backend 'paper_acc': the check of op relax.tanh at node "
                                                                       f"'tanh0' returned {answer!r}: a check returns None to accept"):
            byoc.partition_for(chain_module(["tanh", "relu"]), "paper_acc")


def test_declared_limits_reject_with_reason():
    backend = make_backend("acc", ELEMENTWISE)
    backend.limits = byoc.Limits(dtypes=("float16",))
    with registered(backend):
        report = byoc.report(byoc.partition_for(chain_module(["relu"]), "acc"))
    assert report.regions == []
    assert "dtype float32; supported: float16" in report.host_ops[0].reasons[0]


def test_pattern_becomes_a_composite_inside_the_region():
    pattern, annotations = fused_pattern("relax.matmul", activation="relax.nn.relu")
    backend = make_backend("acc", ("relax.add",), patterns=[("matmul_relu", pattern, annotations, None)])
    with registered(backend):
        mod = byoc.partition_for(chain_module(["matmul", "relu", "add"]), "acc")
    region = region_functions(mod)["acc_0"]
    locals_ = [b.value for blk in region.body.blocks for b in blk.bindings if isinstance(b.value, relax.Function)]
    assert [str(f.attrs["Composite"]) for f in locals_] == ["acc.matmul_relu"]
    assert byoc.report(mod).regions[0].patterns == {"acc.matmul_relu": 1}
    assert byoc.report(mod).regions[0].nodes == ["matmul0", "add2"]


def test_patterns_are_matched_only_where_the_model_has_their_ops():
    """A pattern's ops are read off it, alternatives included; one whose ops the model lacks is
    left out of matching, which must not change what a pattern that can match takes."""
    from byoc.partition.group import required_ops

    relu_or_clip = (is_op("relax.nn.relu") | is_op("relax.clip"))(is_op("relax.add")(wildcard(), wildcard()))
    assert set(required_ops(relu_or_clip)) == {frozenset({"relax.nn.relu", "relax.clip"}), frozenset({"relax.add"})}
    either = is_op("relax.nn.relu")(is_op("relax.matmul")(wildcard(), wildcard())) | is_op("relax.nn.relu")(is_op("relax.nn.conv2d")(wildcard(), wildcard()))
    assert frozenset({"relax.nn.relu"}) in required_ops(either)
    assert frozenset({"relax.matmul", "relax.nn.conv2d"}) in required_ops(either)
    assert required_ops(wildcard()) == []
    conv, conv_annotations = fused_pattern("relax.nn.conv2d", activation="relax.nn.relu")
    dense, dense_annotations = fused_pattern("relax.matmul", activation="relax.nn.relu")
    backend = make_backend("acc", ("relax.add",), patterns=[("conv_relu", conv, conv_annotations, None),
                                                           ("matmul_relu", dense, dense_annotations, None)])
    with registered(backend):
        mod = byoc.partition_for(chain_module(["matmul", "relu", "add"]), "acc")
    assert byoc.report(mod).regions[0].patterns == {"acc.matmul_relu": 1}


def test_pattern_check_sees_named_parts_and_can_reject():
    seen = []

    def check(match):
        seen.append((match.backend, match.pattern, match.ops(), match["activation"].op.name))
        return "no fusion today"

    pattern, annotations = fused_pattern("relax.matmul", activation="relax.nn.relu")
    backend = make_backend("acc", (), patterns=[("matmul_relu", pattern, annotations, check)])
    with registered(backend):
        report = byoc.report(byoc.partition_for(chain_module(["matmul", "relu"]), "acc"))
    assert seen == [("acc", "matmul_relu", ["relax.matmul", "relax.nn.relu"], "relax.nn.relu")]
    assert "acc: pattern matmul_relu: no fusion today" in report.host_reasons()["matmul0"]


def test_raising_check_names_vendor_and_pattern_and_leaves_the_module():
    def broken(match):
        raise ValueError("boom")

    pattern, annotations = fused_pattern("relax.matmul", activation="relax.nn.relu")
    backend = make_backend("acc", (), patterns=[("matmul_relu", pattern, annotations, broken)])
    mod = chain_module(["matmul", "relu"])
    before = mod.script()
    with registered(backend), pytest.raises(PredicateError, match="'acc'.*'matmul_relu'.*ValueError: boom"):
        byoc.partition_for(mod, "acc")
    assert mod.script() == before


def test_raising_op_predicate_names_vendor_op_and_node():
    backend = make_backend("acc")
    backend.supports("relax.nn.relu", check=lambda call: 1 / 0)
    with registered(backend), pytest.raises(PredicateError, match="'acc'.*relax.nn.relu.*'relu0'.*ZeroDivisionError"):
        byoc.partition_for(chain_module(["relu"]), "acc")


def _diamond():
    """a = relu(x); h = sin(a) [host]; c = add(a, h): merging a and c would need h inside."""
    x = relax.Var("x", tensor())
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            a = builder.emit(R.nn.relu(x), "a")
            h = builder.emit(R.sin(a), "h")
            c = builder.emit(R.add(a, h), "c")
            out = builder.emit_output(R.tanh(c))
        builder.emit_func_output(out)
    return builder.get()


def test_merging_never_creates_a_cycle():
    with registered(make_backend("acc", ELEMENTWISE)):
        mod = byoc.partition_for(_diamond(), "acc")
    relax.analysis.well_formed(mod)
    regions = byoc.report(mod).regions
    assert [r.nodes[0] for r in regions] == ["a", "c"] and regions[1].num_ops == 2


def test_sibling_branches_merge_at_their_join():
    x = relax.Var("x", tensor())
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            left = builder.emit(R.nn.relu(x), "left")
            right = builder.emit(R.tanh(x), "right")
            out = builder.emit_output(R.add(left, right))
        builder.emit_func_output(out)
    with registered(make_backend("acc", ELEMENTWISE)):
        report = byoc.report(byoc.partition_for(builder.get(), "acc"))
    assert len(report.regions) == 1 and report.regions[0].num_ops == 3


@pytest.mark.parametrize("limit, expected", [(1, [1, 1, 1, 1]), (2, [2, 2]), (3, [3, 1]), (None, [4])])
def test_max_ops_per_region_splits(limit, expected):
    with registered(make_backend("acc", ELEMENTWISE)):
        report = byoc.report(byoc.partition_for(chain_module(["relu", "tanh", "relu", "tanh"]), "acc", max_ops_per_region=limit))
    assert [r.num_ops for r in report.regions] == expected


def test_max_macs_and_bytes_per_region_split():
    ops = ["matmul", "matmul", "matmul"]
    with registered(make_backend("acc", ELEMENTWISE)):
        by_macs = byoc.report(byoc.partition_for(chain_module(ops), "acc", max_macs_per_region=128))
        by_bytes = byoc.report(byoc.partition_for(chain_module(ops), "acc", max_bytes_per_region=600))
    assert [r.macs for r in by_macs.regions] == [128, 64]  # 64 MACs per (1x8)x(8x8) matmul
    # Each matmul brings a 256-byte weight and a 32-byte result: two fit in 600 bytes.
    assert [r.working_bytes for r in by_bytes.regions] == [576, 288]


def test_fallback_rules_send_regions_back_with_reasons():
    mod = chain_module(["relu", "sin", "matmul", "relu"])
    with registered(make_backend("acc", ELEMENTWISE)):
        no_macs = byoc.report(byoc.partition_for(mod, "acc", fallback_without_macs=True))
        too_small = byoc.report(byoc.partition_for(mod, "acc", min_ops_per_region=2))
        threshold = byoc.report(byoc.partition_for(mod, "acc", min_macs_per_region=10**6))
    assert [r.nodes for r in no_macs.regions] == [["matmul2", "relu3"]]
    assert no_macs.host_reasons()["relu0"] == ["acc: region has no MACs"]
    assert [r.nodes for r in too_small.regions] == [["matmul2", "relu3"]]
    assert "region too small: 1 op(s), the minimum is 2" in too_small.host_reasons()["relu0"][0]
    assert threshold.regions == [] and "under the threshold of 1,000,000" in threshold.host_reasons()["matmul2"][0]


def test_region_filter_is_a_user_cost_function():
    seen = []

    def keep_big(summary):
        seen.append(summary)
        return None if summary.num_ops >= 2 else f"only {summary.num_ops} op"

    with registered(make_backend("acc", ELEMENTWISE)):
        report = byoc.report(byoc.partition_for(chain_module(["relu", "sin", "tanh", "relu"]), "acc", region_filter=keep_big))
    assert [s.nodes for s in seen] == [("relu0",), ("tanh2", "relu3")]
    assert seen[1].input_bytes == 32 and seen[1].output_bytes == 32
    assert report.host_reasons()["relu0"] == ["acc: only 1 op"]


def test_host_ops_by_op_name_and_by_node_name():
    with registered(make_backend("acc", ELEMENTWISE)):
        by_op = byoc.report(byoc.partition_for(chain_module(["relu", "tanh", "relu"]), "acc", host_ops=["relax.tanh"]))
        by_node = byoc.report(byoc.partition_for(chain_module(["relu", "tanh", "relu"]), "acc", host_ops="relu2"))
    assert by_op.host_reasons() == {"tanh1": ["forced to the host by the host_ops option"]}
    assert list(by_node.host_reasons()) == ["relu2"]


def test_host_ops_that_match_nothing_are_named_with_the_closest():
    """A misspelt op or node kept nothing on the host, silently."""
    with registered(make_backend("acc", ELEMENTWISE)):
        with pytest.warns(UserWarning, match=r"host_ops \['relax.tanhh'\] match no op or node of the model \(did you mean 'relax.tanh'\?\)"):
            report = byoc.report(byoc.partition_for(chain_module(["relu", "tanh", "relu"]), "acc", host_ops=["relax.tanhh", "relu2"]))
    assert list(report.host_reasons()) == ["relu2"]


def test_higher_priority_backend_wins():
    low = make_backend("low", ELEMENTWISE, priority=1)
    high = make_backend("high", ("relax.tanh",), priority=5)
    with registered(low, high):
        report = byoc.report(byoc.partition_for(chain_module(["relu", "tanh", "relu"]), ["low", "high"]))
    placed = [(r.backend, r.ops) for r in report.regions]
    assert placed == [("low", ["relax.nn.relu"]), ("high", ["relax.tanh"]), ("low", ["relax.nn.relu"])]


def test_lower_priority_pattern_does_not_take_ops_a_higher_backend_accepts():
    pattern, annotations = fused_pattern("relax.matmul", activation="relax.nn.relu")
    low = make_backend("low", (), priority=0, patterns=[("matmul_relu", pattern, annotations, None)])
    high = make_backend("high", ("relax.matmul",), priority=9)
    with registered(low, high):
        report = byoc.report(byoc.partition_for(chain_module(["matmul", "relu"]), ["low", "high"]))
    assert [r.backend for r in report.regions] == ["high"]
    assert "low: pattern matmul_relu: relax.matmul goes to higher-priority backend high" in report.host_reasons()["relu1"]


def test_earlier_pattern_wins_where_patterns_overlap():
    long_pattern, long_annotations = fused_pattern("relax.matmul", bias=True, activation="relax.nn.relu")
    short = is_op("relax.add")(wildcard(), wildcard())
    backend = make_backend("acc", (), patterns=[("matmul_add_relu", long_pattern, long_annotations, None), ("add", short, {}, None)])
    mod = chain_module(["matmul", "add", "relu"])
    with registered(backend):
        report = byoc.report(byoc.partition_for(mod, "acc"))
    assert report.regions[0].patterns == {"acc.matmul_add_relu": 1}


def test_each_op_stays_in_exactly_one_place():
    mod = chain_module(["matmul", "relu", "sin", "tanh", "add", "sin", "multiply"])
    with registered(make_backend("acc", ELEMENTWISE)):
        partitioned = byoc.partition_for(mod, "acc", max_ops_per_region=2)
    assert all_op_calls(partitioned) == all_op_calls(mod)


def test_options_and_inputs_are_checked():
    with registered(make_backend("acc", ELEMENTWISE)):
        with pytest.raises(PartitionError, match="unknown partition option.*max_op"):
            byoc.partition_for(chain_module(["relu"]), "acc", max_op=3)
        with pytest.raises(PartitionError, match="at least 1"):
            byoc.partition_for(chain_module(["relu"]), "acc", max_ops_per_region=0)
        with pytest.raises(PartitionError, match="no Relax function 'main'"):
            byoc.partition_for(tvm.IRModule({}), "acc")
        with pytest.raises(PartitionError, match="more than once"):
            byoc.partition_for(chain_module(["relu"]), ["acc", "acc"])
    with pytest.raises(UnknownBackendError, match="unknown backend 'nope'; registered backends: .*reference"):
        byoc.partition_for(chain_module(["relu"]), "nope")


def test_report_ratios_and_formats():
    mod = chain_module(["matmul", "sin", "matmul", "relu"])
    with registered(make_backend("acc", ("relax.matmul",))):
        report = byoc.report(byoc.partition_for(mod, "acc"))
    assert report.total_ops == 4 and report.offload_ratio_nodes == 0.5
    assert report.offload_ratio_macs == 1.0
    data = report.to_dict()
    assert data["offload_ratio_nodes"] == 0.5 and len(data["regions"]) == 2
    table = report.to_table()
    assert "offload ratio: 50.0% of 4 ops, 100.0% of 128 MACs, in 2 region(s)" in table
    assert "sin1" in table and "relu3" in table


def test_report_needs_a_partitioned_module():
    with pytest.raises(PartitionError, match="partition it with byoc.partition_for"):
        byoc.report(chain_module(["relu"]))


def test_pictures_of_the_partitioned_graph():
    import xml.etree.ElementTree as ET

    from byoc.partition.visualize import to_dot, to_svg

    with registered(make_backend("acc", ELEMENTWISE)):
        mod = byoc.partition_for(chain_module(["relu", "sin", "tanh"]), "acc")
    dot = to_dot(mod)
    assert 'subgraph "cluster_acc_0"' in dot and 'subgraph "cluster_acc_1"' in dot and 'label="sin"' in dot
    svg = ET.fromstring(to_svg(mod))
    texts = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert {"acc", "host", "nn.relu", "sin", "tanh"} <= set(texts)


def test_partitioned_module_runs_like_the_original():
    from graphs import run_module

    mod = chain_module(["matmul", "relu", "sin", "tanh", "add"])
    x = np.random.default_rng(0).standard_normal((1, 8)).astype("float32")
    with registered(make_backend("acc", ELEMENTWISE)):
        compiled = byoc.build(byoc.partition_for(mod, "acc"))
        np.testing.assert_allclose(compiled.run(x)[0], run_module(mod, x)[0], rtol=1e-5, atol=1e-6)


def test_region_symbols_are_the_function_names_with_many_multi_output_regions():
    """Region 1 has two outputs and there are more than 11 regions: the variable holding region
    1's outputs must not take the name `<backend>_11` from region 11's function."""
    x = relax.Var("x", tensor())
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            value = builder.emit(R.sin(x), "start")
            for index in range(14):
                first = builder.emit(R.exp(value), f"exp{index}")
                second = builder.emit(R.negative(first), f"neg{index}")
                value = builder.emit(R.sin(R.add(first, second)) if index % 2 else R.add(first, second), f"join{index}")
            out = builder.emit_output(value)
        builder.emit_func_output(out)
    mod = builder.get()
    with registered(make_backend("twin", ops=["relax.exp", "relax.negative"])):
        partitioned = byoc.partition_for(mod, "twin")
        regions = region_functions(partitioned)
        assert len(regions) >= 12
        assert all(str(f.attrs["global_symbol"]) == name for name, f in regions.items())
        sample = np.random.default_rng(0).standard_normal((1, 8)).astype("float32")
        from graphs import run_module
        np.testing.assert_allclose(byoc.build(partitioned).run(sample)[0], run_module(mod, sample)[0], rtol=1e-5, atol=1e-6)
