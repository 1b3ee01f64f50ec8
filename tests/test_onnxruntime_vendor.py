"""The onnxruntime vendor takes whole graphs: small ONNX graphs in the shapes the torch exporter
writes (GELU, its tanh form with Pow, softmax guarded by IsNaN/Where, Conv1d, Slice, int64 index
arithmetic, GatherND, reductions...) each become one onnxruntime region and match onnxruntime on
the original graph. Also: what stays on the host says why, the opset-17 spelling TensorRT is given
agrees with the opset-20 one, and a region's IO binding is kept from run to run."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from tvm import relax
from tvm.relax import op as R

import byoc
from byoc.codegen_json import region_to_json
from byoc.codegen_json.to_onnx import LATEST_OPSET, OPSET, graph_to_onnx

from conftest import assert_fp32_close, onnxruntime_outputs
from graphs import one_input_module

RNG = np.random.default_rng(0)


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _model(nodes: list[onnx.NodeProto], inputs: dict[str, np.ndarray], outputs: list[str], constants=()) -> onnx.ModelProto:
    """A graph whose outputs' types come from onnx's shape inference (byoc needs static shapes)."""
    graph = helper.make_graph(
        nodes, "case",
        [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for name, a in inputs.items()],
        [helper.make_empty_tensor_value_info(name) for name in outputs], list(constants))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", LATEST_OPSET)])
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    model.graph.ClearField("output")
    model.graph.output.extend(inferred.graph.output)
    return model


def _floats(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _node(op: str, inputs: list[str], output: str, **attrs) -> onnx.NodeProto:
    return helper.make_node(op, inputs, [output], name=output, **attrs)


def _case_gelu():
    x = {"x": _floats(2, 8, 16)}
    nodes = [_node("MatMul", ["x", "w"], "m"), _node("Gelu", ["m"], "g"), _node("Gelu", ["m"], "t", approximate="tanh"),
             _node("Add", ["g", "t"], "y")]
    return _model(nodes, x, ["y"], [_const("w", _floats(16, 16))]), x


def _case_tanh_gelu_with_pow():
    """GPT-2's MLP as exported: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = {"x": _floats(1, 8, 16)}
    c = {"three": np.float32(3.0), "k": np.float32(0.044715), "s": np.float32(0.7978846), "one": np.float32(1.0), "half": np.float32(0.5)}
    nodes = [_node("MatMul", ["x", "w"], "m"), _node("Pow", ["m", "three"], "p"), _node("Mul", ["p", "k"], "pk"),
             _node("Add", ["m", "pk"], "a"), _node("Mul", ["a", "s"], "as"), _node("Tanh", ["as"], "th"),
             _node("Add", ["th", "one"], "t1"), _node("Mul", ["m", "half"], "mh"), _node("Mul", ["mh", "t1"], "y")]
    return _model(nodes, x, ["y"], [_const("w", _floats(16, 16)), *(_const(n, v) for n, v in c.items())]), x


def _case_guarded_softmax():
    """Attention's softmax as torch exports scaled_dot_product_attention: NaN rows become 0."""
    x = {"q": _floats(1, 2, 8, 4), "k": _floats(1, 2, 4, 8)}
    nodes = [_node("MatMul", ["q", "k"], "s"), _node("Softmax", ["s"], "p", axis=-1), _node("IsNaN", ["p"], "nan"),
             _node("Where", ["nan", "zero", "p"], "y")]
    return _model(nodes, x, ["y"], [_const("zero", np.float32(0.0))]), x


def _case_conv1d():
    """Whisper's front end: two Conv1d with GELU, the second strided."""
    x = {"x": _floats(1, 8, 20)}
    nodes = [_node("Conv", ["x", "w1", "b1"], "c1", pads=[1, 1]), _node("Gelu", ["c1"], "g1"),
             _node("Conv", ["g1", "w2", "b2"], "c2", pads=[1, 1], strides=[2], dilations=[1]), _node("Gelu", ["c2"], "g2"),
             _node("Conv", ["g2", "w3"], "c3", group=2, pads=[0, 2], dilations=[2]),
             _node("ConvTranspose", ["c3", "wt"], "y", strides=[2], output_padding=[1])]
    constants = [_const("w1", _floats(16, 8, 3)), _const("b1", _floats(16)), _const("w2", _floats(16, 16, 3)),
                 _const("b2", _floats(16)), _const("w3", _floats(8, 8, 3)), _const("wt", _floats(8, 4, 3))]
    return _model(nodes, x, ["y"], constants), x


def _case_conv_transpose_and_pools():
    x = {"x": _floats(1, 4, 8, 8)}
    nodes = [_node("ConvTranspose", ["x", "w"], "t", strides=[2, 2], pads=[1, 1, 0, 0], output_padding=[1, 1]),
             _node("MaxPool", ["t"], "m", kernel_shape=[2, 2], strides=[2, 2]), _node("Reshape", ["m", "shape"], "r"),
             _node("AveragePool", ["r"], "a", kernel_shape=[3], pads=[1, 1], count_include_pad=1),
             _node("MaxPool", ["a"], "y", kernel_shape=[2], strides=[2], ceil_mode=1)]
    return _model(nodes, x, ["y"], [_const("w", _floats(4, 6, 3, 3)), _const("shape", np.array([1, 6, -1]))]), x


def _case_slices_and_shapes():
    x = {"x": _floats(4, 6, 8)}
    starts, ends, axes, steps = ([0, -1, 1], [3, -7, 8], [0, 1, 2], [1, -2, 3])
    nodes = [_node("MatMul", ["x", "w"], "m"), _node("Slice", ["m", "starts", "ends", "axes", "steps"], "s"),
             _node("Unsqueeze", ["s", "ax0"], "u"), _node("Expand", ["u", "shape"], "e"), _node("Squeeze", ["e", "ax1"], "q"),
             _node("Flatten", ["q"], "f", axis=2), _node("Transpose", ["f"], "tr", perm=[1, 0]),
             _node("Trilu", ["tr"], "tl", upper=0), helper.make_node("Split", ["tl"], ["sp0", "sp1"], axis=1, num_outputs=2),
             _node("Concat", ["sp1", "tr", "sp0"], "y", axis=1)]
    constants = [_const("w", _floats(8, 8)), *(_const(n, np.array(v)) for n, v in
                 (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps), ("ax0", [0]), ("ax1", [1]), ("shape", [2, 1, 1, 1, 1])))]
    return _model(nodes, x, ["y"], constants), x


def _case_int64_embedding():
    """The embedding look-up torch exports: negative ids wrapped, then Gather; plus the int64
    arithmetic that position ids are made of."""
    x = {"ids": RNG.integers(-50, 50, (2, 6)).astype(np.int64)}
    nodes = [_node("Less", ["ids", "zero"], "neg"), _node("Add", ["ids", "vocab"], "wrapped"), _node("Where", ["neg", "wrapped", "ids"], "idx"),
             _node("Gather", ["table", "idx"], "emb"), _node("Div", ["ids", "seven"], "d"), _node("Mod", ["ids", "seven"], "md"),
             _node("Mul", ["d", "md"], "dm"), _node("Sub", ["dm", "ids"], "pos"), _node("CumSum", ["pos", "axis"], "cs", exclusive=1),
             _node("Abs", ["cs"], "ab"), _node("Min", ["ab", "cap"], "cp"), _node("Gather", ["ptable", "cp"], "pe"),
             _node("Add", ["emb", "pe"], "sum"), _node("MatMul", ["sum", "w"], "y")]
    constants = [_const("zero", np.int64(0)), _const("vocab", np.int64(50)), _const("seven", np.int64(7)), _const("axis", np.int64(1)),
                 _const("cap", np.int64(31)), _const("table", _floats(50, 8)), _const("ptable", _floats(32, 8)), _const("w", _floats(8, 8))]
    return _model(nodes, x, ["y", "cs"], constants), x


def _case_gathers_and_masks():
    """BERT's pooler picks rows with GatherND and masks with And; int32 and bool arithmetic."""
    x = {"h": _floats(2, 5, 8), "rows": np.array([[3], [1]], np.int64), "cols": RNG.integers(0, 5, (2, 3, 8)).astype(np.int64),
         "mask": np.array([[1, 0, 1, 1, 0], [1, 1, 0, 0, 1]], np.int32)}
    nodes = [_node("MatMul", ["h", "w"], "m"), _node("GatherND", ["m", "rows"], "picked", batch_dims=1),
             _node("GatherElements", ["m", "cols"], "ge", axis=1), _node("Cast", ["mask", ], "mb", to=T.BOOL),
             _node("Mul", ["mask", "mask"], "m2"), _node("GreaterOrEqual", ["m2", "one"], "ge1"), _node("And", ["mb", "ge1"], "both"),
             _node("LessOrEqual", ["m2", "one"], "le1"), _node("Or", ["both", "le1"], "either"), _node("Xor", ["both", "either"], "x1"),
             _node("Not", ["x1"], "nx"), _node("Equal", ["mb", "nx"], "eq"), _node("Cast", ["eq"], "fm", to=T.FLOAT),
             _node("Unsqueeze", ["fm", "last"], "fm3"), _node("Mul", ["m", "fm3"], "masked"), _node("ArgMax", ["masked"], "am", axis=1, keepdims=0),
             _node("ArgMin", ["masked"], "an", axis=2, keepdims=1)]
    constants = [_const("w", _floats(8, 8)), _const("one", np.int32(1)), _const("last", np.array([2]))]
    return _model(nodes, x, ["picked", "ge", "masked", "am", "an"], constants), x


def _case_reductions_and_unary():
    """T5's RMS norm (Pow, ReduceMean, Sqrt, Reciprocal) and the reductions and unary ops left."""
    x = {"x": _floats(2, 4, 8)}
    nodes = [_node("MatMul", ["x", "w"], "m"), _node("Pow", ["m", "two"], "sq"), _node("ReduceMean", ["sq", "last"], "ms", keepdims=1),
             _node("Sqrt", ["ms"], "rt"), _node("Reciprocal", ["rt"], "inv"), _node("Mul", ["m", "inv"], "n"),
             _node("ReduceMax", ["n", "last"], "mx", keepdims=0), _node("ReduceMin", ["n"], "mn", keepdims=0),
             _node("ReduceSum", ["n", "mid"], "sm", keepdims=0), _node("ReduceProd", ["n", "last"], "pr", keepdims=1),
             _node("LeakyRelu", ["n"], "lr", alpha=0.2), _node("PRelu", ["lr", "slope"], "pl"), _node("LogSoftmax", ["pl"], "ls", axis=1),
             _node("Round", ["ls"], "ro"), _node("Sign", ["n"], "sg"), _node("Floor", ["n"], "fl"), _node("Ceil", ["n"], "ce"),
             _node("Sin", ["n"], "si"), _node("Cos", ["n"], "co"), _node("Neg", ["n"], "ng"), _node("Erf", ["n"], "er"),
             _node("Max", ["si", "co"], "sc"), _node("Exp", ["er"], "ex"), _node("Log", ["ex"], "lg"), _node("Sigmoid", ["lg"], "sgm"),
             _node("IsInf", ["inv"], "inf"), _node("Where", ["inf", "ng", "sgm"], "wh"), _node("Relu", ["wh"], "re"),
             _node("Clip", ["re", "lo", "hi"], "cl")]
    constants = [_const("w", _floats(8, 8)), _const("two", np.float32(2.0)), _const("last", np.array([-1])), _const("mid", np.array([1])),
                 _const("slope", _floats(4, 1)), _const("lo", np.float32(0.1)), _const("hi", np.float32(0.9))]
    return _model(nodes, x, ["mx", "mn", "sm", "pr", "ro", "sg", "fl", "ce", "sc", "cl"], constants), x


def _case_scatters():
    x = {"x": _floats(4, 6), "upd": _floats(2, 6)}
    nodes = [_node("MatMul", ["x", "w"], "m"), _node("ScatterElements", ["m", "idx", "upd"], "se", axis=0, reduction="add"),
             _node("ScatterND", ["se", "nd", "upd"], "y")]
    constants = [_const("w", _floats(6, 6)), _const("idx", RNG.integers(0, 4, (2, 6))), _const("nd", np.array([[3], [0]]))]
    return _model(nodes, x, ["y"], constants), x


CASES = {name[len("_case_"):]: case for name, case in globals().items() if name.startswith("_case_")}


@pytest.mark.parametrize("name", sorted(CASES))
def test_graph_is_one_onnxruntime_region_matching_onnxruntime(name):
    model, inputs = CASES[name]()
    partitioned = byoc.partition_for(byoc.from_onnx(model), "onnxruntime", fallback_without_macs=False)
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and not report.host_ops, report.to_table()
    assert_fp32_close(byoc.build(partitioned, strict=True).run(**inputs), onnxruntime_outputs(model, inputs))


def test_a_transformer_block_is_one_region_under_the_default_cost_rules():
    """Embedding, attention with the guarded softmax, tanh-GELU MLP: nothing left between regions."""
    ids = {"ids": RNG.integers(0, 50, (1, 8)).astype(np.int64)}
    nodes = [_node("Gather", ["table", "ids"], "e"), _node("LayerNormalization", ["e", "g", "b"], "ln", axis=-1),
             _node("MatMul", ["ln", "wq"], "q"), _node("Transpose", ["ln"], "kt", perm=[0, 2, 1]), _node("MatMul", ["q", "kt"], "s"),
             _node("Softmax", ["s"], "p", axis=-1), _node("IsNaN", ["p"], "nan"), _node("Where", ["nan", "zero", "p"], "pz"),
             _node("MatMul", ["pz", "ln"], "att"), _node("Add", ["att", "e"], "r"), _node("MatMul", ["r", "w1"], "h"),
             _node("Gelu", ["h"], "gh", approximate="tanh"), _node("MatMul", ["gh", "w2"], "o"), _node("Add", ["o", "r"], "y")]
    constants = [_const("table", _floats(50, 16)), _const("g", _floats(16)), _const("b", _floats(16)), _const("wq", _floats(16, 16)),
                 _const("zero", np.float32(0.0)), _const("w1", _floats(16, 32)), _const("w2", _floats(32, 16))]
    model = _model(nodes, ids, ["y"], constants)
    partitioned = byoc.partition_for(byoc.from_onnx(model), "onnxruntime")
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and report.offload_ratio_nodes == 1.0, report.to_table()
    assert_fp32_close(byoc.build(partitioned).run(**ids), onnxruntime_outputs(model, ids))


def _relax_module(build) -> tvm.IRModule:
    return one_input_module(build, (2, 4, 6))


def _relax_only_ops(builder: relax.BlockBuilder, x: relax.Expr) -> relax.Expr:
    """Relax ops byoc's frontend does not make from ONNX, though other producers may."""
    w = relax.const(RNG.standard_normal((6, 6)).astype("float32"))
    m = builder.emit(R.matmul(x, w))
    stats = [relax.const(RNG.uniform(0.5, 1.5, 4).astype("float32")) for _ in range(4)]
    normalised = builder.emit(relax.TupleGetItem(R.nn.batch_norm(m, *stats, axis=1, training=False), 0))
    unary = builder.emit(R.add(R.rsqrt(R.abs(normalised)), R.square(R.nn.silu(normalised))))
    masked = builder.emit(R.flip(R.where(R.not_equal(unary, relax.const(0.0)), unary, m), axis=1))
    integers = builder.emit(R.floor_mod(R.astype(masked, "int64"), relax.const(5, "int64")))
    bits = builder.emit(R.bitwise_xor(R.bitwise_and(integers, relax.const(3, "int64")), R.bitwise_not(R.bitwise_or(integers, relax.const(8, "int64")))))
    return builder.emit(R.cumsum(bits, axis=2, dtype="int32"))


def test_relax_only_ops_match_the_host():
    mod = _relax_module(_relax_only_ops)
    partitioned = byoc.partition_for(mod, "onnxruntime")
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and not report.host_ops, report.to_table()
    x = RNG.standard_normal((2, 4, 6)).astype("float32")
    assert_fp32_close(byoc.build(partitioned, strict=True).run(x), byoc.build(mod).run(x))


def _host_reasons(build) -> set[str]:
    report = byoc.report(byoc.partition_for(_relax_module(build), "onnxruntime", fallback_without_macs=False))
    return {reason for host in report.host_ops for reason in host.reasons}


@pytest.mark.parametrize("build, reason", [
    (lambda b, x: R.isnan(R.astype(x, "int32")), "input 0 has dtype int32, which ONNX IsNaN does not take"),
    (lambda b, x: R.floor_mod(x, relax.const(2.0)), "floor_mod of float32; ONNX Mod floors only integers"),
    (lambda b, x: R.nn.relu(R.astype(x, "int64")), "onnxruntime's CPU provider has no relax.nn.relu kernel for int64"),
    (lambda b, x: R.where(R.less(x, relax.const(0.0)), R.less(x, relax.const(1.0)), R.less(x, relax.const(2.0))),
     "onnxruntime's CPU provider has no relax.where kernel for bool"),
    (lambda b, x: R.add(R.astype(x, "bool"), R.astype(x, "bool")), "input 0 has dtype bool, which ONNX Add does not take"),
    (lambda b, x: R.cumsum(x), "relax.cumsum over the flattened tensor"),
    (lambda b, x: R.astype(x, "float64"), "output 0 has dtype float64; supported: float32, float16, int32, int64, bool"),
])
def test_what_stays_on_the_host_says_why(build, reason):
    reasons = _host_reasons(build)
    assert any(reason in r for r in reasons), reasons


def test_opset_17_spelling_matches_opset_20():
    """TensorRT's parser is given opset 17: GELU in its Erf and tanh forms, reduction axes as
    attributes. Both spellings run in onnxruntime to the same values."""

    def build(builder, x):
        g = builder.emit(R.add(R.nn.gelu(x), R.nn.gelu_tanh(x)))
        return builder.emit(R.add(R.mean(g, axis=[2], keepdims=True), R.max(g, axis=[1, 2], keepdims=True)))

    graph, constants = region_to_json(_relax_module(build)["main"], "case", "onnxruntime")
    x = RNG.standard_normal((2, 4, 6)).astype("float32")
    results = {}
    for opset in (OPSET, LATEST_OPSET):
        model = graph_to_onnx(graph, constants, opset)
        onnx.checker.check_model(model, full_check=True)
        results[opset] = onnxruntime_outputs(model, {"input0": x})
        assert ("Gelu" in {n.op_type for n in model.graph.node}) == (opset >= 20)
    assert_fp32_close(results[OPSET], results[LATEST_OPSET])


def test_a_regions_io_bindings_are_kept_and_made_only_for_new_buffers():
    model, inputs = _case_gelu()
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), "onnxruntime"))
    want = onnxruntime_outputs(model, inputs)
    for _ in range(3):
        assert_fp32_close(compiled.run(**inputs), want)
    engine = compiled.regions["onnxruntime_0"].record.engine
    # Steady state: the VM hands the region the same buffers (the output alternates between
    # two), so the bindings made in the first runs serve every later one.
    kept = dict(engine.bindings())
    assert 1 <= len(kept) <= 2, kept
    for _ in range(3):
        compiled.run(**inputs)
    assert engine.bindings() == kept and all(engine.bindings()[k] is io for k, io in kept.items())
    # Other buffers get a binding of their own, and the results land in them.
    x, out = inputs["x"].copy(), np.zeros((2, 8, 16), np.float32)
    engine.run([x], [out])
    assert len(engine.bindings()) == len(kept) + 1
    assert_fp32_close([out], want)
    # Each thread has its own bindings (an IOBinding is not thread-safe).
    seen = []
    thread = threading.Thread(target=lambda: seen.append((compiled.run(**inputs), engine.bindings())))
    thread.start()
    thread.join()
    assert_fp32_close(seen[0][0], want)
    assert seen[0][1] is not engine.bindings() and not set(seen[0][1].values()) & set(engine.bindings().values())


def _spinning_entries(compiled: byoc.CompiledModel, symbol: str = "onnxruntime_0") -> tuple[str | None, ...]:
    compiled.create_engines()
    session_options = compiled.regions[symbol].record.engine.session.get_session_options()
    got = []
    for key in ("session.intra_op.allow_spinning", "session.force_spinning_stop"):
        try:
            got.append(session_options.get_session_config_entry(key))
        except Exception:  # onnxruntime raises for an entry never set
            got.append(None)
    return tuple(got)


@pytest.mark.parametrize("spinning, entries", [(True, ("1", "1")), ("always", ("1", "0")), (False, ("0", None))])
def test_threads_spin_as_told(spinning, entries):
    model, inputs = _case_gelu()
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), "onnxruntime"),
                          backend_options={"onnxruntime": {"allow_spinning": spinning}})
    assert _spinning_entries(compiled) == entries
    assert_fp32_close(compiled.run(**inputs), onnxruntime_outputs(model, inputs))


def test_by_default_threads_keep_spinning_between_runs_only_where_the_region_is_all_the_model_computes(tmp_path):
    model, inputs = _case_gelu()
    alone = byoc.build(byoc.partition_for(byoc.from_onnx(model), "onnxruntime"))
    assert _spinning_entries(alone) == ("1", "0")
    # Also after a reload: the fact comes from the partition record the artifact carries.
    alone.export(tmp_path / "alone.byoc")
    assert _spinning_entries(byoc.load(tmp_path / "alone.byoc")) == ("1", "0")
    # Host code after the region (cumsum over the flattened tensor stays on the host): the
    # threads stop spinning when the region returns, leaving the cores to the host.
    mod = _relax_module(lambda b, x: R.cumsum(b.emit(R.matmul(x, relax.const(_floats(6, 6)))), axis=None))
    partitioned = byoc.partition_for(mod, "onnxruntime")
    assert byoc.report(partitioned).host_ops
    followed = byoc.build(partitioned)
    assert _spinning_entries(followed) == ("1", "1")
    x = _floats(2, 4, 6)
    assert_fp32_close(followed.run(x), byoc.build(mod).run(x))
    # The context exists only while an engine is created.
    assert byoc.backend.engine.engine_context() is None


def test_an_unknown_spinning_mode_is_refused():
    model, _ = _case_gelu()
    partitioned = byoc.partition_for(byoc.from_onnx(model), "onnxruntime")
    with pytest.raises(byoc.errors.OptionError, match="vendor 'onnxruntime': setting allow_spinning='sometimes' is not one of True, False, auto, always"):
        byoc.build(partitioned, backend_options={"onnxruntime": {"allow_spinning": "sometimes"}})


def test_a_form_that_needs_a_newer_opset_stays_on_the_host_of_an_older_one():
    """AveragePool takes dilations from opset 19: onnxruntime's regions (opset 20) take a dilated
    average pooling, the opset-17 checks TensorRT reads keep it on the host."""
    from byoc.codegen_json.to_onnx import ONNX_CHECKS, onnx_checks

    x = relax.Var("x", relax.TensorType((1, 2, 8, 8), "float32"))
    dilated = R.nn.avg_pool2d(x, pool_size=2, dilation=2)
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        call = builder.normalize(dilated)
        builder.emit_func_output(x)
    assert onnx_checks(LATEST_OPSET)["relax.nn.avg_pool2d"](call) is None
    assert ONNX_CHECKS["relax.nn.avg_pool2d"](call) == "ONNX AveragePool takes this form from opset 19; the region is written at 17"
