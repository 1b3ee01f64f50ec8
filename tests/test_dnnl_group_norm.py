"""Group normalisation on dnnl (torch.export writes GroupNorm as relax.nn.group_norm: MobileViT
v2 had 21, each a cut between regions): a layer norm of each group's values, then the scale and
shift per channel. Checked against numpy's group normalisation, and after a convolution (whose
result oneDNN keeps in a blocked layout) against TVM's own kernels."""

from __future__ import annotations

import numpy as np
import pytest
from tvm import relax
from tvm.relax import op as R

import byoc

from conftest import FP32_ATOL, FP32_RTOL

RNG = np.random.default_rng(3)


def _group_norm_module(shape, groups: int, scale: bool, center: bool, conv_first: bool):
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    channels = shape[1]
    gamma_values, beta_values = (RNG.standard_normal(channels).astype(np.float32) for _ in range(2))
    gamma, beta = relax.const(gamma_values), relax.const(beta_values)
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            value = x
            if conv_first:
                weight = relax.const((RNG.standard_normal((channels, channels, 3, 3)) * 0.2).astype(np.float32))
                value = builder.emit(R.nn.conv2d(value, weight, padding=(1, 1)), "conv")
            value = builder.emit(R.nn.group_norm(value, gamma, beta, groups, 1, list(range(2, len(shape))), 1e-5, center, scale), "norm")
            value = builder.emit(R.nn.relu(value), "relu")
            out = builder.emit_output(value)
        builder.emit_func_output(out)
    return builder.get(), gamma_values, beta_values


def _numpy_group_norm(x, groups, gamma, beta, scale, center):
    grouped = x.reshape(x.shape[0], groups, -1).astype(np.float64)
    normal = (grouped - grouped.mean(-1, keepdims=True)) / np.sqrt(grouped.var(-1, keepdims=True) + 1e-5)
    y = normal.reshape(x.shape)
    channel = (1, -1) + (1,) * (x.ndim - 2)
    if scale:
        y = y * gamma.reshape(channel)
    if center:
        y = y + beta.reshape(channel)
    return np.maximum(y, 0).astype(np.float32)


@pytest.mark.parametrize("scale, center", [(True, True), (True, False), (False, True), (False, False)])
def test_group_norm_runs_in_one_dnnl_region_as_numpy_computes_it(scale, center):
    shape, groups = (2, 8, 5, 6), 4
    mod, gamma, beta = _group_norm_module(shape, groups, scale, center, conv_first=False)
    partitioned = byoc.partition_for(mod, "dnnl", fallback_without_macs=False)
    report = byoc.report(partitioned)
    assert [r.backend for r in report.regions] == ["dnnl"] and not report.host_ops, str(report)
    x = RNG.standard_normal(shape).astype(np.float32)
    got = byoc.build(partitioned, strict=True).run(x)[0]
    np.testing.assert_allclose(got, _numpy_group_norm(x, groups, gamma, beta, scale, center), rtol=FP32_RTOL, atol=FP32_ATOL)


def test_group_norm_after_a_convolution_matches_tvms_kernels():
    shape, groups = (1, 16, 7, 7), 8
    mod, _, _ = _group_norm_module(shape, groups, True, True, conv_first=True)
    partitioned = byoc.partition_for(mod, "dnnl")
    report = byoc.report(partitioned)
    assert [r.backend for r in report.regions] == ["dnnl"] and not report.host_ops, str(report)
    x = RNG.standard_normal(shape).astype(np.float32)
    got = byoc.build(partitioned, strict=True).run(x)[0]
    want = byoc.build(byoc.partition_for(mod, "reference")).run(x)[0]
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=FP32_RTOL, atol=FP32_ATOL * scale)


def test_group_norm_over_other_axes_stays_on_the_host_with_the_reason():
    x = relax.Var("x", relax.TensorType((2, 6, 4, 8), "float32"))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            gamma, beta = (relax.const(np.ones(8, np.float32)) for _ in range(2))
            out = builder.emit_output(builder.emit(R.nn.group_norm(x, gamma, beta, 2, 3, [1, 2]), "channels_last"))
        builder.emit_func_output(out)
    report = byoc.report(byoc.partition_for(builder.get(), "dnnl", fallback_without_macs=False))
    reasons = [reason for op in report.host_ops for reason in op.reasons]
    assert any("channels on axis 1 only" in reason for reason in reasons), str(report)
