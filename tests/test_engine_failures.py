"""A vendor's engine that fails, at build: the region falls back to the host with a warning that
names the vendor, the region, its first node and the cost, or the build fails under `strict`;
the vendor's whole message and traceback are kept."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import tvm
from broken_vendors import Stale
from tvm import relax
from tvm.script import relax as R

import byoc
from byoc.codegen_json import JsonRuntime, tvm_engine
from byoc.errors import CodegenError, EngineError

from graphs import chain_module, registered

OPS = ["matmul", "relu", "matmul"]


def _vendor(name: str, build_engine, **runtime) -> byoc.Backend:
    backend = byoc.Backend(name=name, codegen=JsonRuntime(build_engine=build_engine, version="t", **runtime))
    backend.supports("relax.matmul", "relax.nn.relu")
    return backend


def _raises(graph, constants, options):
    raise RuntimeError("compiling the network failed\n  stage 2 of 4\n  layer 'fc1'\n  cause: no kernel for this shape")


class _Half:
    """Writes the first half of each output only."""

    def __init__(self, graph, constants, options):
        self.inner = tvm_engine.build_engine(graph, constants, options)

    def run(self, inputs, outputs):
        full = [np.empty_like(o) for o in outputs]
        self.inner.run(inputs, full)
        for out, value in zip(outputs, full):
            out.reshape(-1)[: out.size // 2] = value.reshape(-1)[: out.size // 2]


def _refuses(graph, constants, options):
    raise CodegenError(f"region {graph['symbol']} (faulty): relax.nn.relu (node 'relu1') cannot be written at ONNX opset 17")


FAULTS = {
    "raises": (_raises, r"building the engine \(build_engine\) failed: RuntimeError: compiling the network failed\n(?s:.*)"
                        r"cause: no kernel for this shape"),
    # byoc's own error from a vendor's code (its ONNX hand-off refusing an op) is a vendor failure too
    "codegen_error": (_refuses, r"building the engine \(build_engine\) failed: CodegenError: region faulty_0 \(faulty\): "
                                r"relax.nn.relu \(node 'relu1'\) cannot be written"),
    "not_an_engine": (lambda graph, constants, options: object(), "the vendor returned a builtins.object, which is not an engine"),
    "never_writes": (lambda graph, constants, options: Stale(), r"left 8 of 8 elements of output 0 \(1, 8\) unwritten"),
    "writes_half": (_Half, r"left 4 of 8 elements of output 0 \(1, 8\) unwritten"),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_failing_engine_falls_back_at_build_with_the_whole_story(fault):
    build_engine, message = FAULTS[fault]
    mod = chain_module(OPS)
    x = np.random.default_rng(0).standard_normal((1, 8)).astype("float32")
    with registered(_vendor("faulty", build_engine)):
        partitioned = byoc.partition_for(mod, "faulty")
        with pytest.warns(UserWarning, match=f"byoc: region faulty_0 \\(faulty\\): (?s:.*){message}(?s:.*)"
                                             "the region falls back to the host: its 3 op\\(s\\) from node 'matmul0' on and 128 MACs"), \
                pytest.warns(UserWarning, match=r"every region fell back to the host at build \(faulty_0\): the model runs on the "
                                                r"host alone, 0 of 128 MACs offloaded"):
            compiled = byoc.build(partitioned)
        np.testing.assert_allclose(compiled.run(x)[0], byoc.build(mod).run(x)[0], rtol=1e-5, atol=1e-6)
        assert compiled.artifacts == [] and compiled.build_fallbacks.keys() == {"faulty_0"}
        assert compiled.store.names() == {}  # the region's weights went with it: the host carries its own
        report = compiled.report()
        assert not report.regions and all(any("faulty_0" in r or "engine" in r for r in host.reasons) for host in report.host_ops)
        with pytest.raises(EngineError, match=f"region faulty_0 \\(faulty\\): (?s:.*){message}") as raised:
            byoc.build(partitioned, strict=True)
    if fault == "codegen_error":
        assert isinstance(raised.value.__cause__, CodegenError)
    if fault == "raises":
        assert isinstance(raised.value.__cause__, RuntimeError)  # the vendor's own traceback
        assert "_raises" in "".join(__import__("traceback").format_tb(raised.value.__cause__.__traceback__))


def test_only_the_failing_region_falls_back():
    """Two regions (a host op between them); the one whose engine fails goes to the host."""
    calls = []

    def second_fails(graph, constants, options):
        calls.append(graph)
        if len(calls) == 2:
            raise RuntimeError("out of device memory")
        return tvm_engine.build_engine(graph, constants, options)

    mod = chain_module(["matmul", "relu", "sigmoid", "matmul"])
    x = np.ones((1, 8), "float32")
    with registered(_vendor("flaky_second", second_fails)):
        partitioned = byoc.partition_for(mod, "flaky_second")
        assert len(byoc.report(partitioned).regions) == 2
        with pytest.warns(UserWarning, match="region flaky_second_1 .*out of device memory"):
            compiled = byoc.build(partitioned)
    assert [a.symbol for a in compiled.artifacts] == ["flaky_second_0"] and list(compiled.build_fallbacks) == ["flaky_second_1"]
    np.testing.assert_allclose(compiled.run(x)[0], byoc.build(mod).run(x)[0], rtol=1e-5, atol=1e-6)


def test_lazy_engines_skip_the_check_and_fail_at_the_first_run_with_the_cause_kept():
    x = np.ones((1, 8), "float32")
    with registered(_vendor("late", _raises)):
        compiled = byoc.build(byoc.partition_for(chain_module(OPS), "late"), engines="lazy")
        with pytest.raises(EngineError, match="region late_0 \\(late\\): building the engine \\(build_engine\\) failed: (?s:.*)cause: no kernel") as raised:
            compiled.run(x)
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_a_save_engine_that_fails_costs_the_cache_only(tmp_path):
    def broken_save(engine):
        raise OSError("disk full")

    vendor = _vendor("unsaved", tvm_engine.build_engine, save_engine=broken_save, load_engine=lambda blob, g, c, o: None)
    x = np.ones((1, 8), "float32")
    with registered(vendor):
        with pytest.warns(UserWarning, match=r"region unsaved_0 \(unsaved\): saving the engine for the cache \(save_engine\) failed: "
                                             r"OSError: disk full; it will be built again next time"):
            compiled = byoc.build(byoc.partition_for(chain_module(OPS), "unsaved"), cache_dir=tmp_path)
    assert [a.symbol for a in compiled.artifacts] == ["unsaved_0"] and not compiled.build_fallbacks
    compiled.run(x)


def test_a_custom_format_that_cannot_load_its_binary_says_so():
    from custom_vendor import make_custom_backend

    backend = make_custom_backend("unloadable")
    backend.codegen = dataclasses.replace(backend.codegen, deserialize=lambda payload, options: 1 / 0)
    with registered(backend):
        partitioned = byoc.partition_for(chain_module(OPS), "unloadable")
        with pytest.raises(EngineError, match=r"region unloadable_0 \(unloadable\): loading the vendor's binary \(blobby.deserialize\) "
                                              r"failed: ZeroDivisionError"):
            byoc.build(partitioned, strict=True)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            compiled = byoc.build(partitioned)
    assert any("falls back to the host" in str(w.message) for w in said) and compiled.artifacts == []


def test_a_region_that_divides_by_an_input_passes_the_trial():
    """Integer division by zero raises in onnxruntime: the trial runs again on ones."""
    from byoc.testing import conformance

    result = conformance.check_case(conformance.node_case("test_div_int32_trunc"), "onnxruntime")
    assert result.status == conformance.PASS, result


def _edge_module(op: str, dtype: str) -> tvm.IRModule:
    x = relax.Var("x", relax.TensorType((4, 6), dtype))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            value = builder.emit(R.add(x, x) if op == "add" else R.tanh(x))
            out = builder.emit_output(R.multiply(value, value))  # a host op after the region
        builder.emit_func_output(out)
    return builder.get()


@pytest.mark.parametrize("vendor, op, dtype, x, finding", [
    ("narrow", "add", "int64", np.full((4, 6), 2**40 + 7, "int64"), r"past the int32 range\), the engine's output 0 \(4, 6\) "
                                                                     r"differs from TVM's code for the region: \d+ of 24 values differ"),
    ("naive", "tanh", "float32", np.full((4, 6), 50.0, "float32"), r"large and small floats and NaN\), the engine's output 0 \(4, 6\) "
                                                                   r"differs from TVM's code for the region: \d+ of 24 values are infinite or NaN"),
])
def test_an_engine_wrong_on_edge_values_falls_back_at_build(vendor, op, dtype, x, finding):
    """Right on zeros and ones, wrong on the values the trial adds (int64 past the int32 range,
    large floats): the region falls back, and the model gives the host's right result."""
    from broken_vendors import naive, narrow

    mod = _edge_module(op, dtype)
    with registered(narrow(), naive()):
        partitioned = byoc.partition_for(mod, vendor)
        assert [r.symbol for r in byoc.report(partitioned).regions] == [f"{vendor}_0"]
        with pytest.warns(UserWarning, match=f"region {vendor}_0 \\({vendor}\\): on edge values \\((?s:.*){finding}"):
            compiled = byoc.build(partitioned)
        assert compiled.artifacts == [] and list(compiled.build_fallbacks) == [f"{vendor}_0"]
        np.testing.assert_array_equal(compiled.run(x)[0], byoc.build(mod).run(x)[0])
        with pytest.raises(EngineError, match=finding):
            byoc.build(partitioned, strict=True)


def test_onnxruntime_agrees_with_tvm_on_edge_values():
    """The trial does not fault a right engine: onnxruntime's on integer and float arithmetic."""
    from byoc.testing import conformance

    for case in ("test_max_int64", "test_mod_mixed_sign_int64", "test_div_int32_trunc", "test_tanh", "test_exp", "test_where_long_example"):
        result = conformance.check_case(conformance.node_case(case), "onnxruntime")
        assert result.status == conformance.PASS, result


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_integer_sums_and_products_stay_in_range_on_edge_values(dtype):
    """ONNX leaves integer overflow undefined (onnxruntime sums int64 through doubles, and gave
    INT64_MIN where TVM wrapped): a region that adds or multiplies integers gets values whose sums
    and products fit, so onnxruntime's right engine is taken, strictly."""
    x = relax.Var("x", relax.TensorType((4, 6), dtype))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(R.sum(R.multiply(x, x), axis=[1]))
        builder.emit_func_output(out)
    every_region = dataclasses.replace(byoc.get_backend("onnxruntime"), name="ort_every_region", cost=byoc.CostRules())
    with registered(every_region):
        compiled = byoc.build(byoc.partition_for(builder.get(), "ort_every_region"), strict=True)
    assert [a.symbol for a in compiled.artifacts] == ["ort_every_region_0"]
