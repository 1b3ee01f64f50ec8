"""Dense layers of a model with dynamic dimensions, on dnnl: a kernel made again for a new number
of rows keeps the weights it reordered into its primitive's layout where that layout is the same
(`byoc_weights_init`). Made again with the kernel, the weights were reordered at every change of
sequence length: BERT-base's twelve (56 MB) took 10-15 ms, more than its whole run at short
lengths. Checked against numpy at each length, and with ONEDNN_VERBOSE by what ran."""

from __future__ import annotations

import os
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import byoc

from conftest import onednn_verbose

WIDTH, HIDDEN = 64, 96
DIMS = {"batch": (1, 4), "sequence": (1, 64)}
RNG = np.random.default_rng(0)
W1 = RNG.standard_normal((WIDTH, HIDDEN)).astype(np.float32) / 8
B1 = RNG.standard_normal(HIDDEN).astype(np.float32)
W2 = RNG.standard_normal((HIDDEN, WIDTH)).astype(np.float32) / 8
LENGTHS = [(1, 8), (1, 9), (2, 5), (1, 1), (1, 8), (1, 9)]  # met for the first time, then again


def _mlp() -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
             helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["y"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", WIDTH])],
        [numpy_helper.from_array(a, n) for n, a in (("w1", W1), ("b1", B1), ("w2", W2))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _input(batch: int, sequence: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, sequence, WIDTH)).astype(np.float32)


def test_every_length_is_exact_with_the_weights_kept():
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(_mlp(), dims=DIMS), "dnnl"))
    for seed, shape in enumerate(LENGTHS):
        x = _input(*shape, seed)
        (got,) = compiled.run(x)
        want = np.maximum(x @ W1 + B1, 0) @ W2
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()), err_msg=str(shape))


_VERBOSE_RUN = r"""
import sys
import byoc
sys.path.insert(0, sys.argv[1])
from test_dnnl_weights_kept import DIMS, _input, _mlp
compiled = byoc.build(byoc.partition_for(byoc.from_onnx(_mlp(), dims=DIMS), "dnnl"))
compiled.run(_input(1, 8, 0))
print("FIRST", flush=True)
compiled.run(_input(1, 9, 0))
print("AGAIN", flush=True)
compiled.run(_input(1, 8, 0))
compiled.run(_input(1, 9, 0))
print("END", flush=True)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="oneDNN's verbose output is read on Linux")
def test_a_new_number_of_rows_reorders_no_weights():
    stdout = onednn_verbose(_VERBOSE_RUN, [os.path.dirname(__file__)])
    first, rest = stdout.split("FIRST")[0], stdout.split("FIRST")[1]
    again = rest.split("AGAIN")[1].split("END")[0]

    def executed(part: str, primitive: str) -> list[str]:
        return [line for line in part.splitlines() if line.startswith("onednn_verbose,exec") and f",{primitive}," in line]

    def weight_reorders(part: str) -> list[str]:  # a reorder of a weight's shape: 64x96 or 96x64
        return [line for line in executed(part, "reorder") if line.split(",")[-2] in (f"{WIDTH}x{HIDDEN}", f"{HIDDEN}x{WIDTH}")]

    # The dense layers run at each length: made again for the new number of rows, their weights
    # reordered at most once, when the kernel was first made (none where the primitive takes
    # them plain, as oneDNN's GEMM does on AVX2).
    assert len(executed(again, "matmul")) == 4, again
    assert len(weight_reorders(first)) <= 2, "\n".join(weight_reorders(first))
    assert not weight_reorders(rest), "\n".join(weight_reorders(rest))
