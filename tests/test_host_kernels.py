"""byoc's host kernels (`byoc.host`) against onnxruntime: NonMaxSuppression, built through the
public API with everything on the host, on random boxes and scores."""

from __future__ import annotations

import functools
import math

import numpy as np
import onnx
import pytest
import tvm
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

import byoc
from byoc.host import HOST_LEGALIZATIONS

from conftest import onnxruntime_outputs

BATCH, CLASSES, BOXES = 2, 3, 40


def _nms_model(max_boxes: int | None, iou: float | None, score: float | None, center_point_box: int = 0) -> onnx.ModelProto:
    """One NonMaxSuppression; a None operand is left out (ONNX's default applies)."""
    names, constants = ["boxes", "scores"], []
    for name, value, dtype in (("max_boxes", max_boxes, np.int64), ("iou", iou, np.float32), ("score", score, np.float32)):
        names.append("" if value is None else name)
        if value is not None:
            constants.append(numpy_helper.from_array(np.array([value], dtype), name))
    graph = helper.make_graph(
        [helper.make_node("NonMaxSuppression", names, ["selected"], name="nms", center_point_box=center_point_box)], "nms",
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [BATCH, BOXES, 4]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [BATCH, CLASSES, BOXES])],
        [helper.make_tensor_value_info("selected", TensorProto.INT64, [None, 3])], constants)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@functools.cache
def _compiled(max_boxes: int | None, iou: float | None, score: float | None, center_point_box: int = 0):
    model = _nms_model(max_boxes, iou, score, center_point_box)
    return model, byoc.build(byoc.from_onnx(model))


def _boxes(rng: np.random.Generator) -> np.ndarray:
    """Corners in [0, 10), some boxes given with their corners swapped (ONNX allows either)."""
    corners = rng.uniform(0, 10, (BATCH, BOXES, 4)).astype(np.float32)
    flipped = rng.random((BATCH, BOXES)) < 0.3
    corners[flipped] = corners[flipped][:, [2, 3, 0, 1]]
    return corners


CONFIGS = [
    (5, 0.5, 0.3),  # the usual: a threshold, a few boxes per class
    (100, 0.3, 0.0),  # more boxes allowed than there are: every survivor comes out
    (4, 0.0, 0.2),  # any overlap suppresses
    (6, 0.6, 0.95),  # a threshold few scores pass, some classes keep none
    (3, None, None),  # ONNX's defaults: IoU 0, no score threshold (negative scores count)
    (0, 0.5, 0.1),  # no box kept
]


@pytest.mark.parametrize("max_boxes,iou,score", CONFIGS)
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), ties=st.booleans())
def test_non_max_suppression_matches_onnxruntime(max_boxes, iou, score, seed, ties):
    model, compiled = _compiled(max_boxes, iou, score)
    rng = np.random.default_rng(seed)
    scores = rng.uniform(-0.5, 1.0, (BATCH, CLASSES, BOXES)).astype(np.float32)
    if ties:  # equal scores: both keep the lower box index first
        scores = np.round(scores * 4) / 4
    inputs = {"boxes": _boxes(rng), "scores": scores}
    np.testing.assert_array_equal(compiled.run(**inputs)[0], onnxruntime_outputs(model, inputs)[0])


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_non_max_suppression_of_boxes_given_by_centre_and_size(seed):
    model, compiled = _compiled(5, 0.4, 0.2, center_point_box=1)
    rng = np.random.default_rng(seed)
    centres, sizes = rng.uniform(0, 10, (BATCH, BOXES, 2)), rng.uniform(0.5, 4, (BATCH, BOXES, 2))
    inputs = {"boxes": np.concatenate([centres, sizes], axis=2).astype(np.float32),
              "scores": rng.random((BATCH, CLASSES, BOXES)).astype(np.float32)}
    np.testing.assert_array_equal(compiled.run(**inputs)[0], onnxruntime_outputs(model, inputs)[0])


def test_non_max_suppression_runs_byocs_kernel():
    """The host takes byoc's kernel for ONNX NonMaxSuppression, TVM's where it was not written
    for the case (no box kept)."""
    def prim_funcs(model: onnx.ModelProto) -> str:
        mod = relax.transform.LegalizeOps(HOST_LEGALIZATIONS)(byoc.from_onnx(model))
        return "\n".join(str(f) for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))

    assert "non_max_suppression_select" in prim_funcs(_nms_model(3, None, None))
    assert "non_max_suppression_select" not in prim_funcs(_nms_model(0, 0.5, 0.1))


def test_erf_on_the_host_is_the_vectorized_approximation_and_within_fp32_error():
    """Exporters' erf GELU left on the host (a quantized BERT's, between its int8 kernels) ran
    libm's erf per element: 3 ms per layer. The host takes TVM's rational approximation."""
    assert "relax.erf" in HOST_LEGALIZATIONS
    x = np.linspace(-6.0, 6.0, 4001, dtype=np.float32).reshape(1, -1)
    graph = helper.make_graph([helper.make_node("Erf", ["x"], ["y"], name="erf")], "erf",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    got = byoc.build(byoc.from_onnx(model)).run(x)[0]  # everything on the host
    exact = np.vectorize(math.erf)(x.astype(np.float64))
    assert np.max(np.abs(got - exact)) < 1e-6
    np.testing.assert_allclose(got, onnxruntime_outputs(model, {"x": x})[0], atol=1e-6)


def _cast_on_host(shape, source: str, target: str):
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, source))
    with builder.function("main", [x]):
        with builder.dataflow():
            y = builder.emit_output(relax.op.astype(x, target))
        builder.emit_func_output(y)
    return byoc.build(builder.get())  # everything on the host


def test_float16_casts_on_the_host_are_exact_for_every_value():
    """A float16 model computed in float32 casts its inputs and outputs on the host, which TVM
    does by a library call per element (no F16C on the host's target): byoc's kernel converts
    in integer arithmetic, as IEEE rounds (to nearest even, subnormals, infinities, NaN)."""
    assert "relax.astype" in HOST_LEGALIZATIONS
    every_half = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    wide = _cast_on_host(every_half.shape, "float16", "float32").run(every_half)[0]
    finite = ~np.isnan(every_half)
    np.testing.assert_array_equal(wide[finite].view(np.uint32), every_half[finite].astype(np.float32).view(np.uint32))
    assert np.isnan(wide[~finite]).all()

    rng = np.random.default_rng(0)
    edges = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x477FE000, 0x477FF000, 0x477FEFFF, 0x38800000,
                      0x387FFFFF, 0x33800000, 0x33000000, 0x33000001, 0x337FFFFF], np.uint32)  # ties, overflow, subnormals
    values = np.concatenate([rng.integers(0, 1 << 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
                             edges.view(np.float32), every_half.astype(np.float32),
                             every_half.astype(np.float32) * np.float32(1 + 2 ** -11)])  # halfway between neighbours
    narrow = _cast_on_host(values.shape, "float32", "float16").run(values)[0]
    with np.errstate(over="ignore"):
        expected = values.astype(np.float16)
    finite = ~np.isnan(expected)
    np.testing.assert_array_equal(narrow[finite].view(np.uint16), expected[finite].view(np.uint16))
    assert np.isnan(narrow[~finite]).all()
