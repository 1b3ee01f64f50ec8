"""The forms torch.export's decompositions write, as TVM's PyTorch frontend imports them: each
must run on dnnl in one region, exact against numpy. Built in Relax, so no torch is needed:
- a dense layer on 3-D activations as an identity broadcast and a batched matmul against the
  weight broadcast per batch (torch's `expand`, `bmm`);
- torch's safe softmax: a row whose scores are all -inf gives 0;
- RMSNorm with `rsqrt`;
- position ids from an arange of constants.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

import byoc
from byoc.frontend.cleanup import cleanup

RNG = np.random.default_rng(0)


def _module(params: dict[str, tuple], body) -> tvm.IRModule:
    builder = relax.BlockBuilder()
    variables = [relax.Var(name, relax.TensorType(shape, "float32")) for name, shape in params.items()]
    with builder.function("main", variables):
        with builder.dataflow():
            out = builder.emit_output(body(builder, *variables))
        builder.emit_func_output(out)
    return cleanup(builder.get())


def _const(array: np.ndarray) -> relax.Expr:
    return relax.const(array, str(array.dtype))


def _one_dnnl_region(mod, inputs: dict, want: np.ndarray) -> byoc.report:
    partitioned = byoc.partition_for(mod, "dnnl")
    report = byoc.report(partitioned)
    assert [r.backend for r in report.regions] == ["dnnl"] and not report.host_ops, str(report)
    got = byoc.build(partitioned, strict=True).run(**inputs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return report


def test_a_weight_broadcast_per_batch_is_one_dense_weight():
    weight = (RNG.standard_normal((8, 16)) * 0.2).astype(np.float32)
    bias = RNG.standard_normal(16).astype(np.float32)

    def body(bb, x):
        same = bb.emit(relax.op.broadcast_to(x, (2, 4, 8)))  # torch's expand to the tensor's own shape
        per_batch = relax.op.broadcast_to(_const(weight), (2, 8, 16))  # folded into a 3-D constant
        return bb.emit(relax.op.add(bb.emit(relax.op.matmul(same, per_batch)), _const(bias)))

    mod = _module({"x": (2, 4, 8)}, body)
    assert "broadcast_to" not in mod["main"].script()
    x = RNG.standard_normal((2, 4, 8)).astype(np.float32)
    _one_dnnl_region(mod, {"x": x}, x @ weight + bias)


def test_torch_safe_softmax_zeroes_rows_masked_whole():
    mask = np.zeros((2, 1, 4, 4), np.float32)
    mask[0, :, :, 2:] = -np.inf  # padding: two keys masked
    mask[1, :, 3, :] = -np.inf  # one query row masked whole

    def body(bb, q, k):
        scores = bb.emit(relax.op.add(bb.emit(relax.op.matmul(q, k)), _const(mask)))
        probabilities = bb.emit(relax.op.nn.softmax(scores, axis=-1))
        kept = bb.emit(relax.op.logical_not(bb.emit(relax.op.equal(scores, _const(np.array(-np.inf, np.float32))))))
        any_kept = bb.emit(relax.op.max(bb.emit(relax.op.astype(kept, "int8")), axis=[-1], keepdims=True))
        masked = bb.emit(relax.op.logical_not(bb.emit(relax.op.astype(any_kept, "bool"))))
        return bb.emit(relax.op.where(masked, _const(np.zeros((2, 3, 4, 4), np.float32)), probabilities))

    mod = _module({"q": (2, 3, 4, 8), "k": (2, 3, 8, 4)}, body)
    q, k = (RNG.standard_normal(s).astype(np.float32) for s in [(2, 3, 4, 8), (2, 3, 8, 4)])
    scores = q @ k + mask
    with np.errstate(invalid="ignore"):
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))
        want = np.nan_to_num(e / e.sum(axis=-1, keepdims=True), nan=0.0)
    assert np.all(want[1, :, 3] == 0) and np.all(want[0, :, :, 2:] == 0)
    _one_dnnl_region(mod, {"q": q, "k": k}, want)


def test_rmsnorm_with_rsqrt():
    weight = (RNG.standard_normal((16, 16)) * 0.2).astype(np.float32)

    def body(bb, x):
        h = bb.emit(relax.op.matmul(x, _const(weight)))
        mean = bb.emit(relax.op.mean(bb.emit(relax.op.power(h, _const(np.array(2.0, np.float32)))), axis=[-1], keepdims=True))
        scale = bb.emit(relax.op.rsqrt(bb.emit(relax.op.add(mean, _const(np.array(1e-6, np.float32))))))
        return bb.emit(relax.op.matmul(bb.emit(relax.op.multiply(h, scale)), _const(weight)))

    x = RNG.standard_normal((4, 16)).astype(np.float32)
    h = x @ weight
    want = (h / np.sqrt((h * h).mean(axis=-1, keepdims=True) + 1e-6)) @ weight
    report = _one_dnnl_region(_module({"x": (4, 16)}, body), {"x": x}, want)
    assert report.regions[0].patterns.get("dnnl.rms_normalized") == 1, report.regions[0].patterns


def test_position_ids_from_an_arange_of_constants_are_a_constant():
    table = RNG.standard_normal((10, 8)).astype(np.float32)

    def body(bb, x):
        ids = bb.emit(relax.op.astype(bb.emit(relax.op.arange(0, 6, 1, "int64")), "int32"))
        return bb.emit(relax.op.add(x, bb.emit(relax.op.take(_const(table), ids, axis=0))))

    mod = _module({"x": (6, 8)}, body)
    assert "arange" not in mod["main"].script() and "take" not in mod["main"].script()
    x = RNG.standard_normal((6, 8)).astype(np.float32)
    np.testing.assert_allclose(byoc.build(byoc.partition_for(mod, "dnnl")).run(x=x)[0], x + table[:6], rtol=1e-6)


def test_with_a_dynamic_batch_the_broadcast_weight_and_the_filled_zeros_go_too():
    """What cannot be folded when the batch is symbolic: a weight broadcast to (batch, K, N),
    and the zeros of the safe softmax as `full_like` of the scores."""
    batch = tvm.tirx.Var("batch", "int64")
    weight = (RNG.standard_normal((8, 16)) * 0.2).astype(np.float32)
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([batch, 4, 8], "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            dense = builder.emit(relax.op.matmul(x, builder.emit(relax.op.broadcast_to(_const(weight), (batch, 8, 16)))))
            scores = builder.emit(relax.op.nn.softmax(dense, axis=-1))
            zeros = builder.emit(relax.op.full_like(scores, _const(np.array(0.0, np.float32))))
            out = builder.emit_output(relax.op.where(builder.emit(relax.op.isnan(scores)), zeros, scores))
        builder.emit_func_output(out)
    text = cleanup(builder.get())["main"].script()
    assert "broadcast_to" not in text and "full_like" not in text, text


def test_a_padding_mask_in_booleans_runs_whole_on_onnxruntime():
    """transformers' padding mask as torch.export writes it: `&` of booleans (bitwise_and) and
    `any` along the keys as booleans cast to int8, their max, and a cast back. Neither ONNX's
    BitwiseAnd nor the vendors' int8 (quantized data only) takes those; the logical op and the
    max in int32 are the same values."""
    builder = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 3, 5], "float32"))
    with builder.function("main", [x]):
        with builder.dataflow():
            both = builder.emit(relax.op.bitwise_and(builder.emit(relax.op.greater(x, _const(np.float32(0.0)))),
                                                     builder.emit(relax.op.less(x, _const(np.float32(1.0))))))
            widened = builder.emit(relax.op.max(builder.emit(relax.op.astype(both, "int8")), axis=[-1], keepdims=True))
            any_ = builder.emit(relax.op.astype(widened, "bool"))
            out = builder.emit_output(relax.op.where(any_, x, _const(np.float32(-1.0))))
        builder.emit_func_output(out)
    mod = cleanup(builder.get())
    text = mod["main"].script()
    assert "bitwise" not in text and "int8" not in text, text
    partitioned = byoc.partition_for(mod, "onnxruntime", fallback_without_macs=False)
    report = byoc.report(partitioned)
    assert len(report.regions) == 1 and not report.host_ops, str(report)
    data = RNG.uniform(-1.0, 2.0, (2, 3, 5)).astype(np.float32)
    want = np.where(((data > 0) & (data < 1)).any(axis=-1, keepdims=True), data, -1.0)
    np.testing.assert_array_equal(byoc.build(partitioned, strict=True).run(x=data)[0], want)
