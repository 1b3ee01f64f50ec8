"""Synthetic Relax graphs for partitioner benchmarks and property tests."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

WIDTH = 16
# Ops the reference backend takes (matmul, relu, add, multiply, tanh) and one it does not (sin).
_SUPPORTED = ("matmul", "relu", "add", "multiply", "tanh")


def _op(kind: str, last: relax.Expr, other: relax.Expr, weight: relax.Expr) -> relax.Expr:
    if kind == "matmul":
        return R.matmul(last, weight)
    if kind in ("add", "multiply"):
        return getattr(R, kind)(last, other)
    if kind == "relu":
        return R.nn.relu(last)
    return getattr(R, kind)(last)


def random_dag(num_ops: int, seed: int = 0, unsupported_fraction: float = 0.15, fan_in_window: int = 8) -> tvm.IRModule:
    """A random DAG of `num_ops` element-wise and matmul ops on (1, WIDTH) tensors; each binary
    op reads the previous op and one of the `fan_in_window` before it."""
    rng = np.random.default_rng(seed)
    x = relax.Var("x", relax.TensorType((1, WIDTH), "float32"))
    weight = relax.const(rng.standard_normal((WIDTH, WIDTH)).astype("float32") * 0.25)
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            values = [x]
            for index in range(num_ops):
                last = values[-1]
                other = values[int(rng.integers(max(0, len(values) - fan_in_window), len(values)))]
                kind = "sin" if rng.random() < unsupported_fraction else _SUPPORTED[int(rng.integers(len(_SUPPORTED)))]
                values.append(builder.emit(_op(kind, last, other, weight), f"n{index}"))
            output = builder.emit_output(values[-1])
        builder.emit_func_output(output)
    return builder.get()
