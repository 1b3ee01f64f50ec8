"""numpy arrays that TVM refuses, where byoc hands numpy to TVM: the trial run of a region's
engine, the constant store (a C region's constants) and the reference engine's inputs at run
time. TVM's DLPack import takes dense, writable memory on a 64-byte boundary only, and its kernels
check the strides of an empty tensor, which numpy lays out otherwise (found by onnx's
RotaryEmbedding and CausalConvWithState node cases, whose regions take or hold a (..., 0) tensor)."""

from __future__ import annotations

import importlib

import numpy as np
import onnx.backend.test.case.node as onnx_node_cases
import pytest
import tvm
from onnx import TensorProto, helper
from onnx.backend.test.case.test_case import TestCase

from byoc.backend.arrays import ALIGNMENT
from byoc.backend.registry import get_backend
from byoc.codegen_json import tvm_engine
from byoc.onnx_backend import backend_for
from byoc.runtime_metadata.constants import ConstantStore
from byoc.testing.conformance import FORCED_OFFLOAD, run_case


def _at(offset: int, shape: tuple[int, ...], strides: tuple[int, ...] | None = None) -> np.ndarray:
    """A float32 array of `shape` starting `offset` bytes past a 64-byte boundary, holding 0, 1, 2, ..."""
    raw = np.empty(4 * int(np.prod(shape)) + 2 * ALIGNMENT, np.uint8)
    array = np.ndarray(shape, np.float32, buffer=raw, offset=-raw.ctypes.data % ALIGNMENT + offset, strides=strides)
    array[...] = np.arange(array.size, dtype=np.float32).reshape(shape)
    return array


def _tvm_layout(array: np.ndarray) -> bool:
    """Whether `array` is laid out as TVM lays out a tensor of its shape, the strides its kernels
    check (for an empty array too, where numpy's differ)."""
    return array.strides == np.from_dlpack(tvm.runtime.empty(array.shape, str(array.dtype))).strides


@pytest.fixture(scope="module")
def concat_engine():
    """The reference engine of a region that concatenates a (2, 3) input and a (2, 0) one: the
    shape of the rotary embedding regions, whose pass-through part is empty."""
    graph = {
        "symbol": "reference_0", "backend": "reference", "constants": {},
        "inputs": [{"name": "a", "shape": [2, 3], "dtype": "float32"}, {"name": "b", "shape": [2, 0], "dtype": "float32"}],
        "nodes": [{"id": 0, "name": "concat", "op": "relax.concat", "args": [{"tuple": [{"input": 0}, {"input": 1}]}],
                   "attrs_type": "relax.attrs.ConcatAttrs", "attrs": {"axis": 1},
                   "outputs": [{"shape": [2, 3], "dtype": "float32"}]}],
        "outputs": [{"node": 0}],
    }
    return tvm_engine.build_engine(graph, {}, {})


def _readonly(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


A_INPUTS = {
    "host buffer": lambda: _at(0, (2, 3)),
    "transposed": lambda: _at(0, (3, 2)).T,
    "strided slice": lambda: _at(0, (2, 6))[:, ::2],
    "unaligned": lambda: _at(4, (2, 3)),
    "read-only": lambda: _readonly(_at(0, (2, 3))),
}
B_INPUTS = {
    "empty, numpy's strides": lambda: _at(0, (2, 0), strides=(0, 0)),
    "empty, unaligned": lambda: _at(4, (2, 0)),
    "empty, TVM's layout": lambda: np.from_dlpack(tvm.runtime.empty((2, 0), "float32")),
}


@pytest.mark.parametrize("b", sorted(B_INPUTS))
@pytest.mark.parametrize("a", sorted(A_INPUTS))
def test_reference_engine_runs_on_any_numpy_input(concat_engine, a, b):
    x, empty = A_INPUTS[a](), B_INPUTS[b]()
    out = np.full((2, 3), np.nan, np.float32)
    concat_engine.run([x, empty], [out])
    np.testing.assert_array_equal(out, np.concatenate([x, empty], axis=1))


@pytest.mark.parametrize("shape", [(2, 3, 4, 0), (2, 4, 0), (0,), (0, 3)])
def test_an_empty_constant_is_stored_as_tvm_takes_it(shape):
    """A C region's constants reach TVM from the store (dnnl's CausalConvWithState of kernel size
    one holds a (2, 4, 0) state)."""
    store = ConstantStore()
    store.add("numpy", np.zeros(shape, np.float32))
    store.add("unaligned", _at(4, shape))
    store.put("read", np.zeros(shape, np.float32))  # as an artifact's constants are loaded
    store.bind("read", "read")
    for name in ("numpy", "unaligned", "read"):
        array = store.get(name)
        assert array.ctypes.data % ALIGNMENT == 0 and _tvm_layout(array), (name, array.strides)
        assert tvm.runtime.from_dlpack(array).shape == shape


def _empty_pass_through_model():
    """y = concat(x + x, x[:, 8:]): the slice (empty) stays on the host, the region takes it."""
    nodes = [
        helper.make_node("Add", ["x", "x"], ["sum"]),
        helper.make_node("Slice", ["x", "start", "end", "axis"], ["rest"]),
        helper.make_node("Concat", ["sum", "rest"], ["y"], axis=1),
    ]
    constants = [helper.make_tensor(name, TensorProto.INT64, [1], [value]) for name, value in (("start", 8), ("end", 8), ("axis", 1))]
    graph = helper.make_graph(nodes, "empty_pass_through", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])], constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def strict_reference_rep():
    """Built strictly: the region's engine passes its trial run (inputs made by byoc, the empty
    one included) or the build fails."""
    return backend_for(["reference"], strict=True, **FORCED_OFFLOAD).prepare(_empty_pass_through_model())


INPUTS = {
    "dense": lambda: np.arange(16, dtype=np.float32).reshape(2, 8),
    "transposed": lambda: np.arange(16, dtype=np.float32).reshape(8, 2).T,
    "strided slice": lambda: np.arange(32, dtype=np.float32).reshape(2, 16)[:, ::2],
    "unaligned": lambda: _at(4, (2, 8)),
    "read-only": lambda: _readonly(np.arange(16, dtype=np.float32).reshape(2, 8)),
}


@pytest.mark.parametrize("kind", sorted(INPUTS))
def test_a_strict_build_with_an_empty_region_input_runs_on_any_numpy_input(strict_reference_rep, kind):
    compiled = strict_reference_rep.compiled([INPUTS["dense"]()])
    assert [a.backend for a in compiled.artifacts] == ["reference"] and not compiled.build_fallbacks
    x = INPUTS[kind]()
    (y,) = strict_reference_rep.run([x])
    np.testing.assert_array_equal(y, x + x)


def _node_case(module: str, name: str) -> TestCase:
    """One of onnx's node cases, made alone: importing the module that defines an op's cases
    makes them (`load_node_model_tests` makes all of them, in seconds, these included)."""
    importlib.import_module(f"onnx.backend.test.case.node.{module}")
    return next(case for case in onnx_node_cases._NodeTestCases if case.name == name)


@pytest.mark.parametrize(("vendor", "module", "case"), [
    ("reference", "rotaryembedding", "test_rotary_embedding"),
    ("reference", "rotaryembedding", "test_rotary_embedding_no_position_ids_expanded"),
    ("dnnl", "causal_conv_with_state", "test_causal_conv_with_state_kernel_size_one_expanded"),
])
def test_onnx_node_cases_with_empty_tensors_pass_strictly(vendor, module, case):
    missing = get_backend(vendor).missing_part()
    if missing:
        pytest.skip(f"{vendor} cannot build here: {missing}")
    run_case(_node_case(module, case), vendor)
