"""Property tests: random DAGs of supported and unsupported ops, random cost rules."""

import numpy as np
import tvm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tvm import relax
from tvm.relax import op as R

import byoc

from graphs import all_op_calls, make_backend, op_calls, region_functions, registered, run_module, tensor

SUPPORTED = ("relax.matmul", "relax.nn.relu", "relax.add", "relax.multiply", "relax.tanh")
KINDS = ("matmul", "relu", "add", "multiply", "tanh", "sin", "exp")


@st.composite
def dags(draw):
    count = draw(st.integers(1, 18))
    ops = []
    for index in range(count):
        kind = draw(st.sampled_from(KINDS))
        # Each op reads the previous value and, for binary ops, any earlier one (0 is the input).
        other = draw(st.integers(0, index))
        ops.append((kind, other))
    extra_output = draw(st.one_of(st.none(), st.integers(0, count)))
    return ops, extra_output


def build_dag(ops, extra_output) -> tvm.IRModule:
    rng = np.random.default_rng(0)
    x = relax.Var("x", tensor())
    weight = relax.const((rng.standard_normal((8, 8)) * 0.3).astype("float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            values = [x]
            for index, (kind, other) in enumerate(ops):
                last, second = values[-1], values[other]
                if kind == "matmul":
                    expr = R.matmul(last, weight)
                elif kind in ("add", "multiply"):
                    expr = getattr(R, kind)(last, second)
                elif kind == "relu":
                    expr = R.nn.relu(last)
                elif kind == "exp":
                    expr = R.exp(R.tanh(last))  # tanh keeps exp from overflowing
                else:
                    expr = getattr(R, kind)(last)
                values.append(builder.emit(expr, f"n{index}"))
            outputs = [values[-1]] + ([values[extra_output]] if extra_output is not None else [])
            result = builder.emit_output(outputs[0] if len(outputs) == 1 else relax.Tuple(outputs))
        builder.emit_func_output(result)
    return builder.get()


options = st.fixed_dictionaries(
    {
        "max_ops_per_region": st.sampled_from([None, 1, 2, 3]),
        "min_ops_per_region": st.sampled_from([1, 2]),
        "fallback_without_macs": st.booleans(),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(), options)
def test_partition_is_acyclic_and_keeps_every_op_once(dag, opts):
    mod = build_dag(*dag)
    with registered(make_backend("prop", SUPPORTED)):
        partitioned = byoc.partition_for(mod, "prop", **opts)
    relax.analysis.well_formed(partitioned)  # raises on a use before definition, i.e. a cycle
    assert all_op_calls(partitioned) == all_op_calls(mod)
    report = byoc.report(partitioned)
    for name, func in region_functions(partitioned).items():
        assert set(op_calls(func)) <= set(SUPPORTED), name
        assert opts["max_ops_per_region"] is None or len(op_calls(func)) <= opts["max_ops_per_region"]
        assert len(op_calls(func)) >= opts["min_ops_per_region"]
    assert 0.0 <= report.offload_ratio_nodes <= 1.0 and 0.0 <= report.offload_ratio_macs <= 1.0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(), options)
def test_partitioned_results_equal_the_unpartitioned_model(dag, opts):
    mod = build_dag(*dag)
    x = np.random.default_rng(1).standard_normal((1, 8)).astype("float32")
    with registered(make_backend("prop", SUPPORTED)):
        compiled = byoc.build(byoc.partition_for(mod, "prop", **opts))
        got = compiled.run(x)
    expected = run_module(mod, x)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
