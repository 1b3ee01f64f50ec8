"""A float16 (or bfloat16) model computed in float32 where its first backend takes no float16.

Models come in float16 for GPUs (`convert_float_to_float16`, `model.half()` before export,
the `model_fp16.onnx` of exported model repositories). A CPU backend takes float32 only, so
every float16 op would stay on the host, where TVM's generic float16 kernels run a tiny GPT-2
in 400 ms against onnxruntime's 0.4. onnxruntime's CPU provider computes such a model in
float32: it casts around the float16 nodes it has no kernel for and removes the cast pairs
between them. This does the same at the Relax level: every op that reads or makes float16
computes in float32 (its float16 constants widened, its float16 dtype attributes made
float32), the model's float16 inputs are cast up where they are read, and its float16 outputs
are cast back, so the model keeps its interface. The result is at least as accurate as
float16 throughout (float16 rounding and overflow happen only at the outputs).

bfloat16 files (weights saved from training in bfloat16, `model.to(torch.bfloat16)` before
export) go the same way: onnxruntime's CPU provider has no bfloat16 kernel for most ops (a
bfloat16 Relu is "NOT_IMPLEMENTED"), and TVM's generic host kernels ran a two-layer 256-wide
bfloat16 MLP in 3.9 ms. Each widened value is cast back to its own type where it leaves.

Partitioning decides (`byoc.partition.pipeline`): a model whose backend of highest priority
takes float16 itself (TensorRT; onnxruntime, which then runs the file as it is) is partitioned as
it is, and what that backend leaves to the host computes in float32 after outlining, its
regions' calls given float16 as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import numpy as np
import tvm
import tvm_ffi
from tvm import relax

from byoc.ir.rewrite import VarSubstitution, bound_value
from byoc.ir.types import constant_array, is_tensor_constant, tensor_types

NARROW_TYPES = ("float16", "bfloat16")
WIDE = "float32"
# On the main function this made: how many ops compute in float32.
WIDENED_ATTR = "byoc.float16_in_float32"


def narrow_types(func: relax.Function) -> set[str]:
    """The narrow float types (float16, bfloat16) of the parameters, bindings and output of `func`."""
    types = [p.ty for p in func.params] + [func.body.body.ty]
    types += [b.var.ty for block in func.body.blocks for b in block.bindings]
    return {str(t.dtype) for ty in types for t in tensor_types(ty)} & set(NARROW_TYPES)


def float16_in_float32(mod: tvm.IRModule) -> tuple[tvm.IRModule, int]:
    """`mod` with the float16 ops of its main function computed in float32, and how many ops
    were (0: the module as it was). A module this made is returned as it is, with its count."""
    func = mod["main"]
    if func.attrs is not None and WIDENED_ATTR in func.attrs:
        return mod, int(func.attrs[WIDENED_ATTR])
    if not narrow_types(func):
        return mod, 0
    widened, count = _Widening(func).run()
    if not count:
        return mod, 0
    result = mod.clone() if hasattr(mod, "clone") else mod
    result["main"] = widened.with_attr(WIDENED_ATTR, count)
    return result, count


def _widens(call: relax.Call) -> bool:
    """Whether `call` reads or makes float16 and can compute in float32: every tensor it reads
    and makes has a known shape (a cast of a tensor whose shape only a run knows, Unique's
    values, cannot be compiled for the host)."""
    operands = [t for arg in call.args for t in tensor_types(arg.ty)] + tensor_types(call.ty)
    narrow = any(str(t.dtype) in NARROW_TYPES for t in operands) or bool(_narrow_attr_fields(call.attrs)) \
        or any(_narrow_number(a) for a in call.args)
    return narrow and all(isinstance(t.shape, relax.ShapeExpr) for t in operands)


def _narrow_attr_fields(attrs: tvm.ir.Attrs | None) -> list[str]:
    """The attribute fields of `attrs` set to the float16 dtype (astype's dtype, out_dtype, ...)."""
    if attrs is None:
        return []
    info = getattr(type(attrs), "__tvm_ffi_type_info__", None)
    return [f.name for f in (info.fields if info else ())
            if isinstance(getattr(attrs, f.name), tvm_ffi.dtype) and str(getattr(attrs, f.name)) in NARROW_TYPES]


def _wide_attrs(attrs: tvm.ir.Attrs | None) -> tvm.ir.Attrs | None:
    names = _narrow_attr_fields(attrs)
    if not names:
        return attrs
    info = type(attrs).__tvm_ffi_type_info__
    values = {f.name: getattr(attrs, f.name) for f in info.fields}
    return tvm.ir.make_node(info.type_key, **{**values, **{name: WIDE for name in names}})


class _Widening:
    """One pass over the bindings of a function: ops that read or make float16 are emitted in
    float32; anything else (control flow, calls of other functions, a region's among them)
    gets float16 values as before, cast back where they were widened."""

    def __init__(self, func: relax.Function) -> None:
        self.func = func
        self.wide = VarSubstitution()  # old variable -> its new one (float32 where it was float16)
        self.narrow = VarSubstitution()  # old variable -> a new one of its old type
        self.changed: dict[relax.Var, relax.Var] = {}  # old float16 variable -> its float32 one
        self.casts: dict[tuple, relax.Var] = {}
        self.block = 0
        self.count = 0

    def run(self) -> tuple[relax.Function, int]:
        func = self.func
        builder = self.builder = relax.BlockBuilder()
        attrs = dict(func.attrs) if func.attrs else None
        blocks = list(func.body.blocks)
        with builder.function("main", params=list(func.params), attrs=attrs, pure=func.is_pure):
            for index, block in enumerate(blocks):
                self.block = index
                dataflow = isinstance(block, relax.DataflowBlock)
                with builder.dataflow() if dataflow else contextlib.nullcontext():
                    for binding in block.bindings:
                        self._emit(binding)
                    if dataflow and index == len(blocks) - 1:
                        output = self._narrowed(func.body.body, output=True)
            if not blocks or not isinstance(blocks[-1], relax.DataflowBlock):
                output = self._narrowed(func.body.body)  # after control flow: casts in a block of their own
            builder.emit_func_output(output)
        return builder.get()["main"], self.count

    def _emit(self, binding: relax.Binding) -> None:
        old = binding.value
        value = None
        if isinstance(binding, relax.VarBinding) and isinstance(old, relax.Call) \
                and isinstance(old.op, tvm.ir.Op) and not old.ty_args and _widens(old):
            value = self._widened_call(old)
            if value is not None:
                self.count += 1
            if isinstance(value, relax.Var):  # a cast that has nothing left to do
                if isinstance(binding.var, relax.DataflowVar):
                    self.wide.bind(binding.var, value)
                    self._note(binding.var, value)
                    return
                # The block's output: the model's own cast (to float16), or a copy.
                value = self.builder.normalize(relax.op.astype(value, _dtypes(binding.var.ty)[0]))
        elif isinstance(binding, relax.VarBinding) and isinstance(old, (relax.TupleGetItem, relax.Tuple)):
            value = self.builder.normalize(self.wide.substitute(old))
        if value is None:
            value = self.builder.normalize(self._narrowed(old))
        var = type(binding.var)(binding.var.name, binding.ty if isinstance(binding, relax.MatchCast) else value.ty)
        if isinstance(binding, relax.MatchCast):
            self.builder.emit_normalized(relax.MatchCast(var, value, binding.ty))
        else:
            self.builder.emit_normalized(relax.VarBinding(var, value))
        self.wide.bind(binding.var, var)
        self._note(binding.var, var)

    def _note(self, old: relax.Var, new: relax.Var) -> None:
        if _dtypes(new.ty) != _dtypes(old.ty):
            self.changed[old] = new
        else:
            self.narrow.bind(old, new)

    def _widened_call(self, call: relax.Call) -> relax.Expr | None:
        """`call` in float32 on the new variables, or None where TVM refuses the op in float32
        (it then runs as the model wrote it). Operands are substituted one by one: a whole call
        would be type-checked with its float32 variables beside its float16 constants."""
        args = [self._wide_operand(self.wide.substitute(arg)) for arg in call.args]
        if call.op.name == "relax.astype" and str(call.attrs.dtype) in (*NARROW_TYPES, *_dtypes(args[0].ty)) \
                and _dtypes(args[0].ty) == [WIDE]:
            return args[0]  # a cast to a narrow type or float32 of what is now float32
        try:
            return self.builder.normalize(relax.Call(call.op, args, _wide_attrs(call.attrs), call.ty_args))
        except tvm.error.TVMError:
            return None

    def _wide_operand(self, arg: relax.Expr) -> relax.Expr:
        if isinstance(arg, relax.Tuple):
            return relax.Tuple([self._wide_operand(field) for field in arg.fields])
        if _narrow_number(arg):
            return relax.prim_value(tvm.tirx.const(float(arg.value), WIDE))
        if is_tensor_constant(arg) and _narrow(arg.ty):
            return relax.const(constant_array(arg).astype(np.float32), WIDE)
        if isinstance(arg, relax.Var) and _narrow(arg.ty):
            return self._cast(arg, WIDE)
        return arg

    def _narrowed(self, expr: relax.Expr, output: bool = False) -> relax.Expr:
        """`expr` with old variables as new ones of their old types: widened ones cast back
        (for the function's output, in the last dataflow block, as outputs of it)."""
        used = [expr] if isinstance(expr, relax.Var) else relax.analysis.free_vars(expr)
        for old in used:
            new = self.changed.get(old)
            if new is not None:
                key = (self.block, new, output)
                if key not in self.casts:
                    self.casts[key] = self._as_type(new, old.ty, output)
                self.narrow.bind(old, self.casts[key])
        return self.narrow.substitute(expr)

    def _cast(self, var: relax.Var, dtype: str) -> relax.Var:
        key = (self.block, var, dtype)
        if key not in self.casts:
            self.casts[key] = self.builder.emit(relax.op.astype(var, dtype), name_hint=f"{var.name}_{dtype}")
        return self.casts[key]

    def _as_type(self, value: relax.Var, ty: relax.Type, output: bool) -> relax.Var:
        """`value` (a tensor or a tuple) cast field by field to the dtypes of `ty`."""
        emit: Callable = self.builder.emit_output if output else self.builder.emit
        if isinstance(ty, relax.TupleType):
            # the fields themselves where the tuple was made here, so that each cast follows
            # its value into the region that makes it
            made = bound_value(value, self.builder)
            parts = list(made.fields) if isinstance(made, relax.Tuple) else \
                [self.builder.emit(relax.TupleGetItem(value, i), name_hint=f"{value.name}_{i}") for i in range(len(ty.fields))]
            fields = [self._as_type(part, field, False) for part, field in zip(parts, ty.fields)]
            return emit(relax.Tuple(fields), name_hint=value.name)
        if isinstance(ty, relax.TensorType) and _dtypes(value.ty) != [str(ty.dtype)]:
            return emit(relax.op.astype(value, str(ty.dtype)), name_hint=f"{value.name}_{ty.dtype}")
        return value


def _narrow_number(arg: relax.Expr) -> bool:
    """A float16 number (a clip bound, a one-hot value): in TVM 0.27 PrimValues are FloatImms."""
    return isinstance(arg, tvm.ir.prim.expr.FloatImm) and str(arg.ty) in NARROW_TYPES


def _narrow(ty: relax.Type) -> bool:
    """A tensor of a narrow float type."""
    dtypes = _dtypes(ty)
    return len(dtypes) == 1 and dtypes[0] in NARROW_TYPES


def _dtypes(ty: relax.Type) -> list[str]:
    return [str(t.dtype) for t in tensor_types(ty)]
