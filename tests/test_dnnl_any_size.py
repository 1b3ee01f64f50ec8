"""Attention over a key/value cache whose length is new at every call, on dnnl with symbolic
shapes: its two products, small, run one oneDNN primitive for every length (GEMM with run-time
dimensions), the mask added in place after the first and the softmax computed by byoc's loops
(no primitive made for the length); large, the primitives made for the sizes (oneDNN's JIT
kernel; its GEMM on AVX2, which has no brgemm). Checked against numpy (fp32: 1e-5 of the
output's scale) and, with ONEDNN_VERBOSE, by which primitives ran and how many were made."""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import byoc
from byoc.codegen_c.generate import SETTLE_CALLS
from byoc.codegen_c.onednn.emitters import SIZED_PRODUCT_MACS

from conftest import onednn_verbose

HEADS, WIDTH = 4, 16
DIMS = {"batch": (1, 4), "sequence": (1, 64), "total": (1, 128)}


# torch's two ways of making a row masked whole by -inf give 0: the softmax's NaN replaced
# (torch.onnx), and the rows whose every score is -inf found and zeroed (torch.export's safe softmax).
_ZEROED_ROWS = {
    "nan_to_zero": [helper.make_node("IsNaN", ["probabilities"], ["undefined"]),
                    helper.make_node("Where", ["undefined", "zero", "probabilities"], ["weights"])],
    "masked_rows": [helper.make_node("Equal", ["masked", "minus_inf"], ["is_masked"]),
                    helper.make_node("Not", ["is_masked"], ["kept"]),
                    helper.make_node("Cast", ["kept"], ["kept_number"], to=TensorProto.INT32),
                    helper.make_node("ReduceMax", ["kept_number"], ["any_kept"], axes=[-1], keepdims=1),
                    helper.make_node("Cast", ["any_kept"], ["any_kept_bool"], to=TensorProto.BOOL),
                    helper.make_node("Not", ["any_kept_bool"], ["all_masked"]),
                    helper.make_node("Where", ["all_masked", "zero", "probabilities"], ["weights"])],
}
# The same nodes, the comparison with -inf written before the softmax, as torch.export writes them
# (CoAtNet through from_torch): the composite's first node is then not the softmax.
_ZEROED_ROWS["masked_rows_compared_first"] = _ZEROED_ROWS["masked_rows"]


def _attention(zeroed_rows: str | None = None) -> onnx.ModelProto:
    """softmax(q @ k^T * 0.25 + mask) @ v, as exporters write a decoder's attention; with
    `zeroed_rows`, a row masked whole by -inf made 0 in that form of `_ZEROED_ROWS`."""
    def tensor(name: str, *dims) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))

    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probabilities"], axis=-1),
        *(_ZEROED_ROWS[zeroed_rows] if zeroed_rows else [helper.make_node("Identity", ["probabilities"], ["weights"])]),
    ]
    if zeroed_rows == "masked_rows_compared_first":  # torch.export's order: the comparison before the softmax
        softmax = nodes.pop(4)
        nodes.insert(len(nodes) - 1, softmax)
    nodes.append(helper.make_node("MatMul", ["weights", "v"], ["out"]))
    graph = helper.make_graph(
        nodes, "attention",
        [tensor("q", "batch", HEADS, "sequence", WIDTH), tensor("k", "batch", HEADS, "total", WIDTH),
         tensor("v", "batch", HEADS, "total", WIDTH), tensor("mask", "batch", 1, "sequence", "total")],
        [tensor("out", "batch", HEADS, "sequence", WIDTH)],
        [helper.make_tensor("scale", TensorProto.FLOAT, [], [0.25]), helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
         helper.make_tensor("minus_inf", TensorProto.FLOAT, [], [-np.inf])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _inputs(batch: int, sequence: int, total: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    q, k, v = (rng.standard_normal((batch, HEADS, n, WIDTH)).astype(np.float32) for n in (sequence, total, total))
    mask = np.where(rng.random((batch, 1, sequence, total)) < 0.2, -1e4, 0.0).astype(np.float32)
    return {"q": q, "k": k, "v": v, "mask": mask}


def _expected(feeds: dict[str, np.ndarray]) -> np.ndarray:
    scores = feeds["q"] @ feeds["k"].transpose(0, 1, 3, 2) * np.float32(0.25) + feeds["mask"]
    with np.errstate(invalid="ignore"):  # a row masked whole: NaN, made 0 where the model says so
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        return np.nan_to_num(weights / weights.sum(-1, keepdims=True), nan=0.0) @ feeds["v"]


def _macs(batch: int, sequence: int, total: int) -> int:
    return batch * HEADS * sequence * total * WIDTH


SMALL = [(1, 1, total) for total in range(9, 17)] + [(2, 3, 40)]
LARGE = (4, 64, 128)


def test_sizes_either_side_of_the_limit():
    assert all(_macs(*shape) <= SIZED_PRODUCT_MACS for shape in SMALL) and _macs(*LARGE) > SIZED_PRODUCT_MACS


def test_every_length_in_and_out_of_the_limit_is_exact():
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(_attention(), dims=DIMS), "dnnl"))
    assert compiled.inspect()["shape_specialised"]["dnnl_0"]["symbolic"]
    for seed, shape in enumerate([*SMALL, LARGE, *SMALL[:2]]):  # small, then large, then small again: the kernel made again each way
        feeds = _inputs(*shape, seed)
        (got,) = compiled.run(feeds)
        want = _expected(feeds)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())), err_msg=str(shape))


@pytest.mark.parametrize("zeroed_rows", sorted(_ZEROED_ROWS))
def test_a_row_masked_whole_gives_zeros_at_every_length(zeroed_rows):
    """torch's attention: the softmax of a row whose every score is -inf is NaN, made 0. byoc's
    loops (small lengths) and oneDNN's softmax (large) give numpy's result, zeros in that row."""
    partitioned = byoc.partition_for(byoc.from_onnx(_attention(zeroed_rows), dims=DIMS), "dnnl")
    assert len(byoc.report(partitioned).regions) == 1
    compiled = byoc.build(partitioned, strict=True)  # on oneDNN, not the host after a fall-back
    for seed, shape in enumerate([*SMALL[:3], LARGE, SMALL[0]]):
        feeds = _inputs(*shape, seed)
        feeds["mask"][:, :, 0, :] = -np.inf  # every query's first row masked whole
        (got,) = compiled.run(feeds)
        want = _expected(feeds)
        assert not np.any(got[:, :, 0]), str(shape)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())), err_msg=str(shape))


_VERBOSE_RUN = r"""
import sys
import numpy as np, byoc
sys.path.insert(0, sys.argv[1])
from test_dnnl_any_size import DIMS, LARGE, SMALL, _attention, _inputs
compiled = byoc.build(byoc.partition_for(byoc.from_onnx(_attention(), dims=DIMS), "dnnl"))
compiled.run(_inputs(*SMALL[0], 0))
print("SMALL", flush=True)
for seed, shape in enumerate(SMALL[1:]):
    compiled.run(_inputs(*shape, seed))
print("LARGE", flush=True)
compiled.run(_inputs(*LARGE, 0))
print("END", flush=True)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="oneDNN's verbose output is read on Linux")
def test_small_products_make_no_primitive_per_length():
    stdout = onednn_verbose(_VERBOSE_RUN, [os.path.dirname(__file__)])
    small = stdout.split("SMALL")[1].split("LARGE")[0].splitlines()
    large = stdout.split("LARGE")[1].split("END")[0].splitlines()

    def lines(part: list[str], kind: str, primitive: str) -> list[str]:
        return [line for line in part if line.startswith(f"onednn_verbose,{kind}") and f",{primitive}," in line]

    def sized(line: str) -> bool:  # run-time dimensions print as *: 1x4x1x16:1x4x16x*
        return "*" in line.split(",")[-2]

    ran = lines(small, "exec", "matmul")
    assert len(ran) == 2 * len(SMALL[1:]) and all(",gemm:jit" in line and sized(line) for line in ran), "\n".join(ran)
    # The same primitive for every length: oneDNN's cache hands it back, nothing is made anew.
    assert not lines(small, "create:cache_miss", "matmul"), "\n".join(lines(small, "create:cache_miss", "matmul"))
    # The mask's sum and the softmax are byoc's loops at these sizes: no primitive made or run.
    assert not [line for line in small if ",binary," in line or ",softmax," in line], "\n".join(small)
    # Made for these sizes: oneDNN's JIT kernel (brgemm) where the CPU has AVX-512, its GEMM on AVX2.
    ran = lines(large, "exec", "matmul")
    assert len(ran) == 2 and not any(sized(line) for line in ran), "\n".join(ran)
    assert any("binary_add" in line for line in ran)  # the mask a post-op of the product
    assert len(lines(large, "exec", "softmax")) == 1


def test_a_shape_that_stays_settles_exactly():
    """Repeated, one small shape settles (`SETTLE_CALLS`): the products are made for its sizes,
    the mask fused; a new length goes back to run-time dimensions. Exact on every call."""
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(_attention(), dims=DIMS), "dnnl"))
    for seed, shape in enumerate([SMALL[0]] * (SETTLE_CALLS + 2) + [SMALL[1], SMALL[0]]):
        feeds = _inputs(*shape, seed)
        (got,) = compiled.run(feeds)
        want = _expected(feeds)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1.0, float(np.abs(want).max())), err_msg=f"call {seed}")


_SETTLING_RUN = r"""
import sys
import byoc
from byoc.codegen_c.generate import SETTLE_CALLS
sys.path.insert(0, sys.argv[1])
from test_dnnl_any_size import DIMS, SMALL, _attention, _inputs
compiled = byoc.build(byoc.partition_for(byoc.from_onnx(_attention(), dims=DIMS), "dnnl"))
feeds = _inputs(*SMALL[0], 0)
for _ in range(SETTLE_CALLS):  # the first makes the region for the shape, the others hold it
    compiled.run(feeds)
print("HELD", flush=True)
compiled.run(feeds)
print("NEW", flush=True)
compiled.run(_inputs(*SMALL[1], 0))
print("END", flush=True)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="oneDNN's verbose output is read on Linux")
def test_a_shape_that_stays_runs_the_products_made_for_it():
    """A server's run of one request shape, a benchmark: after SETTLE_CALLS calls the products
    run as a static compile's do (made for the sizes, the mask a post-op), not GEMM with run-time
    dimensions and the mask a pass of its own (at most 1.5x slower a call, and a primitive more)."""
    stdout = onednn_verbose(_SETTLING_RUN, [os.path.dirname(__file__)])
    unsettled = stdout.split("HELD")[0].splitlines()
    settled = stdout.split("HELD")[1].split("NEW")[0].splitlines()
    new = stdout.split("NEW")[1].split("END")[0].splitlines()

    def ran(part: list[str], primitive: str) -> list[str]:
        return [line for line in part if line.startswith("onednn_verbose,exec") and f",{primitive}," in line]

    def sized(line: str) -> bool:
        return "*" in line.split(",")[-2]

    assert all(sized(line) for line in ran(unsettled, "matmul")[-2:]), "\n".join(ran(unsettled, "matmul"))
    products = ran(settled, "matmul")
    assert len(products) == 2 and not any(sized(line) for line in products), "\n".join(products)
    assert "binary_add" in products[0] and not ran(settled, "binary"), "\n".join(settled)
    assert all(sized(line) for line in ran(new, "matmul")), "\n".join(ran(new, "matmul"))


def test_a_kernel_that_fails_to_settle_runs_on_as_it_was():
    """Settling only makes faster what runs already: a kernel whose making fails once settled
    leaves the region as it was at that shape, and every call is still answered, right."""
    import dataclasses

    from byoc.codegen_c.onednn import emitters, onednn_library

    from graphs import registered

    def refuses_to_settle(call):
        code = emitters.eltwise(call)
        return dataclasses.replace(code, init='if (byoc_settled) BYOC_FAIL("refuses to settle");\n' + code.init, reads_settled=True)

    backend = byoc.Backend(name="onednn_unsettled", codegen=onednn_library(), limits=byoc.Limits(dtypes=("float32",)),
                           symbolic_shapes=True)
    backend.supports("relax.nn.relu", emit=refuses_to_settle)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with registered(backend):
        compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model, dims={"batch": (1, 8)}), "onednn_unsettled"))
        assert compiled.inspect()["shape_specialised"]["onednn_unsettled_0"]["symbolic"]
        for call, batch in enumerate([3] * (2 * SETTLE_CALLS) + [2, 3]):
            x = np.random.default_rng(call).standard_normal((batch, 16)).astype(np.float32)
            np.testing.assert_array_equal(compiled.run(x)[0], np.maximum(x, 0), err_msg=f"call {call}")


def test_a_softmax_that_is_the_models_output_at_every_batch():
    """A classifier's last softmax over a dynamic batch, written into the region's output by
    byoc's loops (small) or oneDNN's primitive (once the batch settles): numpy's result at each."""
    weights = np.random.default_rng(0).standard_normal((16, 10)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["logits"]), helper.make_node("Softmax", ["logits"], ["p"], axis=-1)], "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["batch", 10])],
        [helper.make_tensor("w", TensorProto.FLOAT, [16, 10], weights.reshape(-1).tolist())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(model, dims={"batch": (1, 64)}), "dnnl"))
    for call, batch in enumerate([3, 1, 5, *[2] * (SETTLE_CALLS + 2), 64, 3]):
        x = np.random.default_rng(call).standard_normal((batch, 16)).astype(np.float32)
        logits = x @ weights
        want = np.exp(logits - logits.max(-1, keepdims=True))
        want /= want.sum(-1, keepdims=True)
        (got,) = compiled.run(x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"call {call}, batch {batch}")
