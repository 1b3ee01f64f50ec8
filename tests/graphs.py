"""Small hand-built Relax graphs and test backends for partitioner tests."""

from __future__ import annotations

import contextlib

import numpy as np
import tvm
from tvm import relax
from tvm.relax import op as R

import byoc
from byoc.codegen_json import JsonRuntime, tvm_engine

WIDTH = 8


def tensor(shape=(1, WIDTH), dtype="float32") -> relax.TensorType:
    return relax.TensorType(shape, dtype)


def chain_module(ops: list[str], width: int = WIDTH) -> tvm.IRModule:
    """x -> op0 -> op1 -> ... ; binary ops take (previous, x); matmul uses a constant weight."""
    rng = np.random.default_rng(0)
    x = relax.Var("x", tensor((1, width)))
    weight = relax.const(rng.standard_normal((width, width)).astype("float32") * 0.3)
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            value = x
            for index, op in enumerate(ops):
                if op == "matmul":
                    expr = R.matmul(value, weight)
                elif op in ("add", "multiply", "subtract"):
                    expr = getattr(R, op)(value, x)
                elif op == "relu":
                    expr = R.nn.relu(value)
                else:
                    expr = getattr(R, op)(value)
                value = builder.emit(expr, f"{op}{index}")
            out = builder.emit_output(value)
        builder.emit_func_output(out)
    return builder.get()


def make_backend(name: str, ops=(), priority: int = 0, patterns=(), **cost) -> byoc.Backend:
    """A JSON backend whose regions run on the reference (TVM) engine."""
    backend = byoc.Backend(
        name=name,
        priority=priority,
        cost=byoc.CostRules(**cost),
        codegen=JsonRuntime(build_engine=tvm_engine.build_engine, version="test"),
    )
    backend.supports(*ops)
    for pattern_name, pattern, parts, check in patterns:
        backend.pattern(pattern_name, pattern, parts, check)
    return backend


@contextlib.contextmanager
def registered(*backends: byoc.Backend):
    for backend in backends:
        byoc.register_backend(backend, override=True)
    try:
        yield backends
    finally:
        for backend in backends:
            byoc.unregister_backend(backend.name)


def region_functions(mod: tvm.IRModule) -> dict[str, relax.Function]:
    return {gv.name_hint: f for gv, f in mod.functions.items() if f.attrs is not None and "Codegen" in f.attrs}


def op_calls(func: relax.Function) -> list[str]:
    """Op names called in a function, composites and local functions included."""
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op):
            found.append(expr.op.name)
        if isinstance(expr, relax.Function):
            for block in expr.body.blocks:
                for binding in block.bindings:
                    visit(binding.value)

    visit(func)
    return found


def all_op_calls(mod: tvm.IRModule) -> list[str]:
    calls = op_calls(mod["main"])
    for func in region_functions(mod).values():
        calls += op_calls(func)
    return sorted(calls)


def run_module(mod: tvm.IRModule, *inputs: np.ndarray) -> list[np.ndarray]:
    vm = relax.VirtualMachine(relax.build(mod, target="llvm"), tvm.cpu())
    result = vm["main"](*[tvm.runtime.tensor(i) for i in inputs])
    return [result.numpy()] if isinstance(result, tvm.runtime.Tensor) else [r.numpy() for r in result]


def one_input_module(build, shape=(1, WIDTH), dtype: str = "float32") -> tvm.IRModule:
    """`main(x)` returning `build(builder, x)`, emitted in one dataflow block."""
    x = relax.Var("x", relax.TensorType(shape, dtype))
    builder = relax.BlockBuilder()
    with builder.function("main", [x]):
        with builder.dataflow():
            out = builder.emit_output(build(builder, x))
        builder.emit_func_output(out)
    return builder.get()
