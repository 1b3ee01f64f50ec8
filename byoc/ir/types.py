"""Reading shapes, dtypes and constants off Relax expressions.

In TVM 0.27 a tensor constant is a `GenericConst` while scalar PrimValues (`FloatImm`,
`IntImm`) are also `tvm.ir.Constant`s, so "is this a weight?" needs the narrower test below.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from byoc.errors import DynamicShapeError
from byoc.ir.dims import evaluate

TensorConstant = tvm.ir.expr.GenericConst


def is_tensor_constant(expr: relax.Expr) -> bool:
    return isinstance(expr, TensorConstant)


def op_name(expr: relax.Expr) -> str | None:
    """The name of the Relax op `expr` calls ("relax.add"), or None for anything else."""
    return expr.op.name if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) else None


def constant_array(expr: relax.Expr) -> np.ndarray:
    return expr.value.numpy()


def static_dim(dim, what: str = "a dimension") -> int:
    """One dimension's value (see `static_shape`)."""
    value = evaluate(dim)
    if value is None:
        raise DynamicShapeError(f"{what} has a dynamic dimension {dim}; byoc needs static shapes")
    return value


def shape_dims(ty: relax.Type) -> list | None:
    """A tensor type's dimensions (static or symbolic), or None where its shape is unknown."""
    shape = getattr(ty, "shape", None)
    return list(shape.values) if isinstance(shape, relax.ShapeExpr) else None


def static_shape(ty: relax.Type, what: str = "tensor") -> tuple[int, ...]:
    """The static shape of a tensor type; a clear error where a dimension is symbolic."""
    shape = ty.shape
    if shape is None or not isinstance(shape, relax.ShapeExpr):
        raise DynamicShapeError(f"{what} has an unknown shape ({ty}); byoc needs static shapes")
    dims = []
    for dim in shape.values:
        value = evaluate(dim)
        if value is None:
            raise DynamicShapeError(f"{what} has a dynamic dimension {dim} ({ty}); byoc needs static shapes")
        dims.append(value)
    return tuple(dims)


def has_static_shape(ty: relax.Type) -> bool:
    """Whether every dimension is known: static, or a named dimension at its representative
    value while a module with dynamic dimensions is partitioned (see byoc.ir.dims)."""
    shape = getattr(ty, "shape", None)
    return isinstance(shape, relax.ShapeExpr) and all(evaluate(d) is not None for d in shape.values)


def same_shape(a: relax.Type, b: relax.Type) -> bool:
    """Whether two tensor types have one known shape (symbolic dimensions compared by name)."""
    shape_a, shape_b = getattr(a, "shape", None), getattr(b, "shape", None)
    return isinstance(shape_a, relax.ShapeExpr) and isinstance(shape_b, relax.ShapeExpr) and \
        [str(d) for d in shape_a.values] == [str(d) for d in shape_b.values]


def dtype_name(ty: relax.Type) -> str:
    return str(ty.dtype)


def tensor_types(ty: relax.Type) -> list[relax.TensorType]:
    """The tensor types inside a (possibly nested tuple) type."""
    if isinstance(ty, relax.TensorType):
        return [ty]
    if isinstance(ty, relax.TupleType):
        return [t for field in ty.fields for t in tensor_types(field)]
    return []


def nbytes(ty: relax.Type) -> int:
    """Bytes of all tensors in a type; 0 for a tensor whose shape is not static."""
    total = 0
    for tensor in tensor_types(ty):
        if has_static_shape(tensor):
            total += int(np.prod(static_shape(tensor), dtype=np.int64)) * np.dtype(dtype_name(tensor)).itemsize
    return total


def calls_op(func: relax.Function, *names: str) -> bool:
    """Whether `func`, or a function defined inside it (a composite), calls one of the ops `names`."""
    for block in func.body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Function) and calls_op(value, *names):
                return True
            if op_name(value) in names:
                return True
    return False
