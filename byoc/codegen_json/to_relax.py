"""JSON graph -> Relax function: the way back, for engines that compile with TVM.

Every node becomes a generic `relax.Call` of the named op with its attributes rebuilt, so any
op Relax knows round-trips without a per-op table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tvm
from tvm import relax

from byoc.codegen_json.symbolic_dims import dim_expr
from byoc.errors import JsonGraphError
from byoc.ir.attrs import dict_to_attrs


def graph_to_relax(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> relax.Function:
    where = f"region {graph['symbol']} ({graph['backend']})"
    variables: dict = {}  # a symbolic graph's dimensions, one variable each (see byoc.codegen_json.symbolic_dims)

    def shape(dims) -> list:
        return [dim_expr(d, variables) if isinstance(d, str) else d for d in dims]

    params = [relax.Var(i["name"], relax.TensorType(shape(i["shape"]), i["dtype"])) for i in graph["inputs"]]
    # The dtype is given: without it relax.const narrows int64 to int32 and float64 to float32.
    bound_constants = {name: relax.const(constants[name], str(constants[name].dtype)) for name in graph["constants"]}
    values: list[relax.Expr] = []

    def expr(ref: Mapping[str, Any]) -> relax.Expr:
        if "input" in ref:
            return params[ref["input"]]
        if "node" in ref:
            value = values[ref["node"]]
            return relax.TupleGetItem(value, ref["index"]) if "index" in ref and isinstance(value.ty, relax.TupleType) else value
        if "const" in ref:
            return bound_constants[ref["const"]]
        if "tuple" in ref:
            return relax.Tuple([expr(item) for item in ref["tuple"]])
        if "shape" in ref:
            return relax.ShapeExpr(shape(ref["shape"]))
        if "prim" in ref:
            dtype = ref["dtype"]
            is_float = dtype.startswith(("float", "bfloat"))
            if isinstance(ref["prim"], str):
                return relax.prim_value(dim_expr(ref["prim"], variables))
            immediate = tvm.tirx.FloatImm(dtype, ref["prim"]) if is_float else tvm.tirx.IntImm(dtype, int(ref["prim"]))
            return relax.prim_value(immediate)
        if "string" in ref:
            return relax.StringImm(ref["string"])
        raise JsonGraphError(f"{where}: unknown reference {ref}")

    builder = relax.BlockBuilder()
    with builder.function("main", params=params):
        with builder.dataflow():
            for node in graph["nodes"]:
                try:
                    op = tvm.ir.Op.get(node["op"])
                    attrs = dict_to_attrs(node["attrs_type"], node["attrs"]) if "attrs_type" in node else None
                    call = relax.Call(op, [expr(a) for a in node["args"]], attrs)
                    values.append(builder.emit(call, node["name"]))
                except Exception as error:
                    raise JsonGraphError(f"{where}: cannot rebuild node {node['name']!r} ({node['op']}): {error}") from error
            outputs = [expr(o) for o in graph["outputs"]]
            result = builder.emit_output(outputs[0] if len(outputs) == 1 else relax.Tuple(outputs))
        builder.emit_func_output(result)
    return builder.get()["main"]


def constants_as_inputs(graph: Mapping[str, Any]) -> dict[str, Any]:
    """The graph with its constants read as extra inputs of the same types, after its own: code
    made from it holds no weight (the ONNX hand-off's checks read types, not values; a TVM
    engine takes the constants from byoc's store at run time)."""
    position = {name: len(graph["inputs"]) + i for i, name in enumerate(graph["constants"])}

    def ref(r: Mapping[str, Any]) -> Mapping[str, Any]:
        if "const" in r:
            return {"input": position[r["const"]]}
        return {"tuple": [ref(item) for item in r["tuple"]]} if "tuple" in r else r

    return {**graph, "constants": {},
            "inputs": [*graph["inputs"], *({"name": name, **spec} for name, spec in graph["constants"].items())],
            "nodes": [{**node, "args": [ref(arg) for arg in node["args"]]} for node in graph["nodes"]],
            "outputs": [ref(output) for output in graph["outputs"]]}
