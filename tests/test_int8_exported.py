"""The int8 vendors (simulated Vitis-AI DPU, Ethos-U) on forms found in exported transformers:
a dense layer without a bias followed by a residual add (T5), and a residual stream whose class
token is a hundred times smaller than the patch tokens (ViT), against onnxruntime in float32."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import byoc
from byoc import models as zoo
from byoc.accuracy import measure_accuracy
from byoc.errors import CodegenError
from byoc.models import exported
from byoc.models.graph_builder import OnnxGraphBuilder
from byoc.processing.qkernels import QKernel, QTensor
from byoc.processing.quantize import QuantizationConfig
from byoc.processing.ranges import TensorRange
from byoc.testing.kit import evaluate, model_case

needs_torch = pytest.mark.skipif(exported.available() is not None, reason=exported.available() or "")
VENDORS = ("ethos_u", "vitis_ai")


@pytest.mark.parametrize("vendor", VENDORS)
def test_a_dense_layer_without_bias_then_a_residual_add_runs_as_two_kernels(vendor):
    """T5's projections have no bias: `matmul + residual` matched the dense-with-bias composite,
    whose emitter found no constant to add and raised StopIteration at code generation."""
    builder = OnnxGraphBuilder("t5_residual", seed=1)
    x = builder.input("x", [1, 8, 16])
    hidden = builder.relu(builder.op("Add", [builder.matmul(x, 16, 16, bias=False), x]))  # matched dense_bias_relu
    builder.output(builder.op("Add", [builder.matmul(hidden, 16, 16, bias=False), hidden]))  # matched dense_bias
    builder.output(builder.matmul(hidden, 16, 8))  # a real bias: still fused
    model = builder.build()
    samples = [zoo.sample_inputs(model, seed=s) for s in range(4)]
    report = byoc.report(byoc.partition_for(byoc.from_onnx(model), vendor, calibration=samples))
    patterns = Counter(p for region in report.regions for p, n in region.patterns.items() for _ in range(n))
    assert patterns[f"{vendor}.dense_bias"] == 1 and patterns[f"{vendor}.dense_bias_relu"] == 0, patterns
    assert report.offload_ratio_nodes == 1.0, report.to_table()
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model), vendor, calibration=samples), strict=True)
    assert measure_accuracy(compiled, model, samples).relative_l2 < 0.10


def test_an_emitter_handed_a_computed_add_says_so():
    matmul = {"id": 0, "op": "relax.matmul", "name": "linear"}
    add = {"id": 1, "op": "relax.add", "name": "residual"}
    tensor = QTensor(7, (1, 8, 16), 0.01, 0)
    kernel = QKernel(0, "vitis_ai.dense_bias", [matmul, add], tensor, {(0, 0): tensor, (1, 0): "internal", (1, 1): tensor})
    with pytest.raises(CodegenError, match="region r: node 'residual' adds a computed tensor, not a constant bias, to 'linear'"):
        kernel.bias("region r")
    kernel.operands[(1, 1)] = np.full(16, 0.5, np.float32)
    assert kernel.bias("region r").tolist() == [0.5] * 16


def _range(method: str, values: np.ndarray) -> list[float]:
    tensor = TensorRange(method, seed=0)
    tensor.add(values)
    return tensor.bounds()


def test_min_diffs_takes_a_finer_power_of_two_when_clipping_a_few_values_loses_less():
    rng = np.random.default_rng(0)
    bulk = rng.standard_normal(1 << 15).astype(np.float32) * 0.3  # most values well inside the range
    values = np.concatenate([bulk, [2.1, -2.05]]).astype(np.float32)  # two values set the largest
    config = QuantizationConfig(power_of_two=True)
    coarse, fine = (float(config.scale(max(abs(low), high))) for low, high in (_range("minmax", values), _range("min_diffs", values)))
    assert coarse == 2.0**-5 and fine == 2.0**-6  # 2.1 needs 2**-5; the bulk is better served finer

    def error(scale: float) -> float:
        return float(np.sum((np.clip(np.round(values / scale), -127, 127) * scale - values) ** 2))

    assert error(fine) < error(coarse)
    spread = rng.uniform(-1.9, 1.9, 4096).astype(np.float32)  # values fill the range: clipping costs more
    assert _range("min_diffs", spread) == _range("minmax", spread)


@needs_torch
@pytest.mark.parametrize("vendor", VENDORS)
def test_t5_encoder_builds_and_matches_onnxruntime(vendor):
    evaluation = evaluate(vendor, model_case("hf:t5_encoder"), samples=4, calibration_samples=4)  # as `byoc matrix` runs it
    assert evaluation.passed, evaluation.error or evaluation.violation
    assert evaluation.accuracy.relative_l2 < 0.06, evaluation.accuracy


@needs_torch
def test_vit_on_the_dpu_keeps_the_class_token_of_the_residual_stream_with_min_diffs():
    """The class token's values are about 0.03, the patch tokens' up to 2.5: with the step rounded
    up to 2**-5 (minmax, the default) the class token is a step or two of int8 and the last layer
    norm blows its error up to 47% (11.9% on the output); Vitis AI's min-diffs position (2**-6,
    `calibration_method="min_diffs"`) halves it."""
    evaluation = evaluate("vitis_ai", model_case("hf:vit"), {"calibration_method": "min_diffs"}, samples=4, calibration_samples=4)
    assert evaluation.passed, evaluation.error or evaluation.violation
    assert evaluation.accuracy.relative_l2 < 0.08, evaluation.accuracy
    reference, outputs = np.stack([r[0] for r in evaluation.reference]), np.stack([o[0] for o in evaluation.outputs])
    token = np.linalg.norm((outputs - reference)[..., 0, :]) / np.linalg.norm(reference[..., 0, :])
    assert token < 0.3, token
