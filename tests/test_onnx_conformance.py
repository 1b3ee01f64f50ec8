"""onnx's backend test suite (`onnx.backend.test.BackendTest`) through byoc, per float vendor,
onnx's model test cases (PyTorch exports and sequence graphs), and onnx's real-network light
graphs against onnxruntime.

`make test` runs a representative slice; `make conformance` (BYOC_CONFORMANCE=all) runs every
float32 node case, every model test case and every light graph. The pass rate per vendor is printed at the end.
"""

from __future__ import annotations

import os

import pytest

from byoc.testing import conformance
from byoc.testing.backend_test import onnx_backend_test
from byoc.testing.kit import evaluate, model_case
from byoc.testing.onnx_models import light_model_names

FULL = os.environ.get("BYOC_CONFORMANCE") == "all"
FLOAT_VENDORS = ("reference", "dnnl", "onnxruntime")
# One case or a few per kind of fix and per class of op: convolutions and matrix products,
# scalar inputs (Gemm's bias, Clip's bounds), shape-deciding inputs (Reshape, Resize, reduction
# axes), optional statistics outputs (LayerNormalization), function expansion (Attention),
# Shape as a constant, normalisation, pooling, element-wise and layout ops.
SLICE = "^test_(" + "|".join([
    "conv_with_strides_padding", "convtranspose_output_shape", "gemm_default_scalar_bias", "matmul_2d",
    "clip_splitbounds", "relu", "softmax_axis_1", "layer_normalization_4d_axis1", "maxpool_2d_pads",
    "averagepool_2d_pads", "globalaveragepool", "batchnorm_example", "concat_2d_axis_0", "transpose_default",
    "reshape_negative_dim", "resize_upsample_scales_linear", "reduce_mean_keepdims_example", "attention_4d",
    "shape_start_1", "add_bcast", "sigmoid", "slice", "erf", "dropout_default",
]) + ")$"
LIGHT = light_model_names() if FULL else ["squeezenet"]

for _vendor in FLOAT_VENDORS:
    globals().update(onnx_backend_test(_vendor, pattern=None if FULL else SLICE))


@pytest.mark.parametrize("vendor", FLOAT_VENDORS)
@pytest.mark.parametrize("light", LIGHT)
def test_light_graph_matches_onnxruntime(vendor, light, byoc_results):
    """Imports, partitions, runs, and matches onnxruntime within the vendor's tolerance (fp32:
    1e-4 of the output's scale, tighter than the 1e-3 of its range that is the target)."""
    result = evaluate(vendor, model_case(f"light_{light}"), samples=1)
    byoc_results.append(result)
    assert result.error is None, result.error
    assert result.violation is None, f"{result.violation}\n{result.report}"
    assert result.report.offload_ratio_macs == 1.0, result.report.to_table()


# onnx's model test cases (PyTorch modules and operators as its exporter wrote them, mostly at
# opset 6, and hand-written graphs of sequences): all of them under BYOC_CONFORMANCE=all, one per
# kind of fix in `make test` (opset-6 Slice and PRelu, negative sequence positions, a sequence
# bound to a variable, and a convolution).
MODEL_SLICE = ("test_operator_index", "test_PReLU_2d_multiparam", "test_sequence_model3", "test_sequence_model6", "test_Conv2d")
MODEL_CASES = [case.name for case in conformance.model_cases()] if FULL else list(MODEL_SLICE)


@pytest.mark.parametrize("vendor", FLOAT_VENDORS)
@pytest.mark.parametrize("name", MODEL_CASES)
def test_onnx_model_case(vendor, name):
    """Matches onnx's expected outputs within the case's tolerance, the vendor taking every op it
    claims; a case whose ops the frontend refuses up front (strings, gradients) is refused, and a
    listed failure fails with its reason."""
    _passes_or_is_refused(conformance.model_case(name), vendor)


# onnx's node cases on other types (float16, bfloat16, float64, small and unsigned integers;
# float8, sub-byte and string tensors are refused up front): all under BYOC_CONFORMANCE=all, in
# `make test` one per kind of fix (bfloat16 outputs, bfloat16 Elu, an int8 Clip without bounds,
# EyeLike's dtype, float16 attention, bfloat16 attention computed in float32 with fully masked
# rows, a float8 refusal, a float64 maximum).
OTHER_SLICE = ("test_cast_FLOAT_to_BFLOAT16", "test_celu_bfloat16", "test_clip_default_int8_inbounds", "test_eyelike_with_dtype",
               "test_attention_4d_fp16", "test_attention_4d_causal_padded_kv_bf16", "test_cast_FLOAT_to_FLOAT8E4M3FN",
               "test_max_float64")
OTHER_CASES = [case.name for case in conformance.other_type_node_cases()] if FULL else list(OTHER_SLICE)


@pytest.mark.parametrize("vendor", FLOAT_VENDORS)
@pytest.mark.parametrize("name", OTHER_CASES)
def test_onnx_other_type_node_case(vendor, name):
    """As the model cases: a pass, a refusal up front, or a listed failure, never another error."""
    _passes_or_is_refused(conformance.node_case(name), vendor)


def _passes_or_is_refused(case, vendor):
    result = conformance.check_case(case, vendor)
    if conformance.not_handled_reason(case) is not None:
        assert result.status == conformance.NOT_HANDLED
    elif conformance.expected_failure(case.name, vendor):
        assert result.status in (conformance.EXPECTED, conformance.NOT_HANDLED), result
    else:
        assert result.status in (conformance.PASS, conformance.NOT_TAKEN), result.detail
