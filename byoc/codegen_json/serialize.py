"""Region function -> JSON graph (paper section 3.3, option 1).

A node is one op call with its name (the model node it came from), op, attributes, arguments
and output types. Arguments refer to region inputs by position, to other nodes' outputs, to
named constants, or carry literal values (shapes, scalars, tuples of those). Ops that came from a
pattern carry the composite they belong to, so an engine can map the whole pattern onto one
kernel. Constants leave the graph: they are returned separately, by name, to be stored once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tvm
from tvm import relax

from byoc.codegen_json.references import dimension_uses
from byoc.codegen_json.schema import FORMAT_NAME, FORMAT_VERSION, validate_graph
from byoc.codegen_json.symbolic_dims import SymbolicDimError, dim_text, names_in
from byoc.errors import CodegenError
from byoc.ir.attrs import attrs_to_dict, attrs_type_key
from byoc.ir.dims import DimRange
from byoc.ir.types import constant_array, dtype_name, is_tensor_constant, static_dim, static_shape, tensor_types

Ref = dict[str, Any]


class _Serializer:
    def __init__(self, func: relax.Function, symbol: str, backend: str, dims: Mapping[str, DimRange] | None) -> None:
        self.func = func
        self.symbol = symbol
        self.backend = backend
        self.dims = dims  # symbolic shapes over these dimensions (see byoc.codegen_json.symbolic_dims), or static ones
        self.nodes: list[dict[str, Any]] = []
        self.refs: dict[int, Ref] = {}  # variable id -> reference
        self.constants: dict[str, np.ndarray] = {}
        self.constant_names: dict[int, str] = {}  # constant object handle -> name
        self.composites = 0

    def run(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        inputs = []
        # A last parameter of shape type gives the region its dimensions (see
        # byoc.partition.outline); the graph is written for their values, and takes tensors only.
        params = [p for p in self.func.params if not isinstance(p.ty, relax.ShapeType)]
        for position, param in enumerate(params):
            if not isinstance(param.ty, relax.TensorType):
                raise CodegenError(f"region {self.symbol} ({self.backend}): input {param.name!r} is not a tensor ({param.ty})")
            inputs.append({"name": str(param.name), **self._type_entry(param.ty, f"input {param.name!r}")})
            self.refs[param.id_] = {"input": position}
        locals_: dict[int, relax.Function] = {}
        for block in self.func.body.blocks:
            for binding in block.bindings:
                self._binding(binding, locals_, None)
        result = self.func.body.body
        outputs = [self._ref(e) for e in (result.fields if isinstance(result, relax.Tuple) else [result])]
        graph = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "symbol": self.symbol,
            "backend": self.backend,
            "inputs": inputs,
            "outputs": outputs,
            "constants": {name: {"shape": list(a.shape), "dtype": str(a.dtype)} for name, a in self.constants.items()},
            "nodes": self.nodes,
        }
        if self.dims is not None:
            read = set().union(*(names_in(d) for _, d in dimension_uses(graph) if isinstance(d, str)))
            graph["dims"] = {name: {"low": r.low, "high": r.high, "opt": r.opt} for name, r in sorted(self.dims.items()) if name in read}
        validate_graph(graph, f"region {self.symbol} ({self.backend})")
        return graph, self.constants

    def _binding(self, binding: relax.Binding, locals_: dict[int, relax.Function], composite: dict | None) -> None:
        value = binding.value
        var = binding.var
        if isinstance(value, relax.Function):
            locals_[var.id_] = value
        elif isinstance(value, relax.Call) and isinstance(value.op, relax.Var) and value.op.id_ in locals_:
            self.refs[var.id_] = self._composite(locals_[value.op.id_], list(value.args), var.name)
        elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
            self.refs[var.id_] = self._op(composite["node"] if composite else var.name, value, composite)
        elif isinstance(value, (relax.Var, relax.TupleGetItem, relax.Tuple)) or is_tensor_constant(value):
            self.refs[var.id_] = self._ref(value)
        else:
            raise CodegenError(
                f"region {self.symbol} ({self.backend}): node {var.name!r} holds a {type(value).__name__}, "
                "which the JSON graph cannot express"
            )

    def _composite(self, func: relax.Function, args: list[relax.Expr], name: str) -> Ref:
        # Ops inside a composite are named after the composite's node: the function body may
        # be shared by several matches and carry another match's names.
        composite = {"id": self.composites, "pattern": str(func.attrs["Composite"]), "node": name}
        self.composites += 1
        for param, arg in zip(func.params, args):
            self.refs[param.id_] = self._ref(arg)
        for block in func.body.blocks:
            for binding in block.bindings:
                self._binding(binding, {}, composite)
        return self._ref(func.body.body)

    def _op(self, name: str, call: relax.Call, composite: dict | None) -> Ref:
        node_id = len(self.nodes)
        what = f"output of node {name!r}"
        node: dict[str, Any] = {
            "id": node_id,
            "name": str(name),  # plain str, not TVM's String: JSON validators and writers take only JSON's types
            "op": str(call.op.name),
            "args": [self._ref(arg) for arg in call.args],
            "attrs": attrs_to_dict(call.attrs),
            "outputs": [self._type_entry(t, what) for t in tensor_types(call.ty)],
        }
        if call.attrs is not None:
            node["attrs_type"] = attrs_type_key(call.attrs)
        if composite is not None:
            node["composite"] = {"id": composite["id"], "pattern": composite["pattern"]}
        if isinstance(call.ty, relax.TupleType):
            node["tuple_output"] = True
        self.nodes.append(node)
        return {"node": node_id, "index": 0} if not isinstance(call.ty, relax.TupleType) else {"node": node_id}

    def _ref(self, expr: relax.Expr) -> Ref:
        if isinstance(expr, relax.Var) and (expr.id_ in self.refs or not isinstance(expr.ty, tvm.ir.PrimType)):
            return self.refs[expr.id_]
        if is_tensor_constant(expr):
            return {"const": self._constant(expr)}
        if isinstance(expr, relax.TupleGetItem):
            inner = self._ref(expr.tuple_value)
            if "tuple" in inner:
                return inner["tuple"][expr.index]
            return {"node": inner["node"], "index": int(expr.index)}
        if isinstance(expr, relax.Tuple):
            return {"tuple": [self._ref(f) for f in expr.fields]}
        if isinstance(expr, relax.ShapeExpr):
            return {"shape": [self._dim(d, f"region {self.symbol}: a shape") for d in expr.values]}
        if isinstance(expr, tvm.ir.prim.expr.IntImm):
            return {"prim": int(expr.value), "dtype": str(expr.ty)}
        if isinstance(expr, tvm.ir.prim.expr.FloatImm):
            return {"prim": float(expr.value), "dtype": str(expr.ty)}
        if isinstance(expr, tvm.ir.expr.StringImm):
            return {"string": str(expr.value)}
        if tvm.ir.is_prim_expr(expr) and str(expr.ty).startswith("int"):  # a dimension (`sequence`), specialised
            return {"prim": self._dim(expr, f"region {self.symbol}: a value"), "dtype": str(expr.ty)}
        raise CodegenError(f"region {self.symbol} ({self.backend}): cannot express argument {type(expr).__name__} {expr}")

    def _type_entry(self, ty: relax.TensorType, what: str) -> dict[str, Any]:
        if self.dims is None:
            return {"shape": list(static_shape(ty, what)), "dtype": dtype_name(ty)}
        if ty.shape is None:
            raise CodegenError(f"region {self.symbol} ({self.backend}): {what} has no known shape")
        return {"shape": [self._dim(d, what) for d in ty.shape.values], "dtype": dtype_name(ty)}

    def _dim(self, dim, what: str) -> int | str:
        if self.dims is None:
            return static_dim(dim, what)
        try:
            text = dim_text(dim)
        except SymbolicDimError as error:
            raise CodegenError(f"region {self.symbol} ({self.backend}): {what}: {error}") from None
        unknown = sorted(names_in(text) - set(self.dims))
        if unknown:
            raise CodegenError(f"region {self.symbol} ({self.backend}): {what} reads {unknown}, which are no named dimensions")
        return text

    def _constant(self, expr: relax.Expr) -> str:
        key = expr.id_
        if key not in self.constant_names:
            name = f"{self.symbol}.c{len(self.constant_names)}"
            self.constant_names[key] = name
            self.constants[name] = constant_array(expr)
        return self.constant_names[key]


def region_to_json(func: relax.Function, symbol: str, backend: str,
                   dims: Mapping[str, DimRange] | None = None) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The JSON graph of a region function and its constants by name: every shape static
    (dimensions at the representative values in force, see byoc.ir.dims), or, given the
    model's `dims`, symbolic (see byoc.codegen_json.symbolic_dims)."""
    return _Serializer(func, symbol, backend, dims).run()
