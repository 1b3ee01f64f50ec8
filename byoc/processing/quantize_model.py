"""`precision="int8"`: a float model quantized by byoc before partitioning, as onnxruntime's
`quantize_static` would quantize it, so that a vendor that computes a quantized model in int8
(dnnl: int8 oneDNN primitives) takes it as it takes a model quantized by the user.

What is quantized, in the QDQ form (quantize -> dequantize on activations, int8 weights behind a
dequantize), with onnxruntime's defaults:
- convolutions (channels first) and dense layers with constant float32 weights: weights int8,
  symmetric per output channel (max |w| / 127; max |w| / 64 where the CPU's int8 kernels have
  no VNNI, whose 16-bit sums of pairs of products saturate beyond, as onnxruntime's
  `reduce_range` does for such CPUs); the layer's input, and its result after its bias
  and ReLU/clip, quantized per tensor;
- adds of two computed tensors of one shape (residual adds), after their ReLU;
- max pooling of a quantized tensor, which keeps its input's scale.
Activations are uint8 with a zero point over their calibrated range (onnxruntime's and oneDNN's
fast format; `activations="int8"` for int8 with a zero point). Ranges come from running the float
model on the calibration samples on the host (byoc.runtime_metadata.calibration.value_ranges).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import tvm
from tvm import relax

from byoc.errors import QuantizationError
from byoc.ir.dims import dims_of, representative
from byoc.ir.rewrite import rebuild_function
from byoc.ir.types import constant_array, dtype_name, has_static_shape, is_tensor_constant, op_name, static_shape
from byoc.processing.quantize import INTEGER_RANGES, WEIGHT_LEVELS_WITHOUT_VNNI, QuantizationConfig, with_zero_point
from byoc.timing import onednn_has_vnni

_LAYERS = ("relax.nn.conv2d", "relax.nn.conv1d", "relax.matmul")
_CHANNELS_FIRST = (("NCHW", "OIHW"), ("NCW", "OIW"))
_ACTIVATION_OPS = ("relax.nn.relu", "relax.clip")


@dataclass(frozen=True)
class Int8Plan:
    order: tuple[int, ...]  # bindings (var ids) of the convolutions and dense layers to quantize, in the model's order
    ends: dict[int, int | None]  # var id -> quantized at its definition: calibrated (None) or the var id whose scale it keeps
    inputs: frozenset[int]  # var ids quantized where a quantized op reads them (not quantized where defined)

    @cached_property  # read for every binding of the model as it is rewritten
    def layers(self) -> frozenset[int]:
        return frozenset(self.order)

    @property
    def calibrated(self) -> list[int]:
        """The values (var ids: bindings or parameters of main) whose ranges calibration gives."""
        return sorted({i for i, kept in self.ends.items() if kept is None} | set(self.inputs))


def _float_tensor(expr: relax.Expr) -> bool:
    return isinstance(expr.ty, relax.TensorType) and dtype_name(expr.ty) == "float32" and has_static_shape(expr.ty)


def _quantizable_layer(value: relax.Expr) -> bool:
    if op_name(value) not in _LAYERS or not _float_tensor(value.args[0]):
        return False
    weights = value.args[1]
    if not is_tensor_constant(weights) or dtype_name(weights.ty) != "float32":
        return False
    if op_name(value) == "relax.matmul":
        return len(static_shape(weights.ty)) == 2
    return (value.attrs.data_layout, value.attrs.kernel_layout) in _CHANNELS_FIRST


def _plan(func: relax.Function, only: frozenset[int] | None = None) -> Int8Plan:
    bindings = [b for block in func.body.blocks if isinstance(block, relax.DataflowBlock) for b in block.bindings]
    values = {b.var.id_: b.value for b in bindings}
    users: dict[int, list[relax.Var]] = {}
    for binding in bindings:
        for arg in getattr(binding.value, "args", []):
            if isinstance(arg, relax.Var):
                users.setdefault(arg.id_, []).append(binding.var)

    def only_user(var_id: int, accept) -> relax.Var | None:
        found = users.get(var_id, [])
        return found[0] if len(found) == 1 and accept(values[found[0].id_], var_id) else None

    def bias_add(value, var_id) -> bool:
        return op_name(value) == "relax.add" and any(is_tensor_constant(a) for a in value.args) \
            and any(isinstance(a, relax.Var) and a.id_ == var_id for a in value.args)

    def activation(value, _var_id) -> bool:
        return op_name(value) in _ACTIVATION_OPS

    def end_of(var: relax.Var, steps) -> relax.Var:
        for accept in steps:
            following = only_user(var.id_, accept)
            if following is not None:
                var = following
        return var

    def var_ids(args) -> tuple[int, ...]:
        return tuple(a.id_ for a in args if isinstance(a, relax.Var))

    layers: dict[int, tuple[tuple[int, ...], int]] = {}  # layer -> (what it reads, where its chain ends)
    adds: dict[int, tuple[tuple[int, ...], int]] = {}
    pools: dict[int, int] = {}  # max pooling -> what it reads
    for binding in bindings:
        value, var = binding.value, binding.var
        if _quantizable_layer(value) and (only is None or var.id_ in only):
            layers[var.id_] = (var_ids(value.args[:1]), end_of(var, (bias_add, activation)).id_)
        elif op_name(value) == "relax.add" and all(isinstance(a, relax.Var) and _float_tensor(a) for a in value.args) \
                and static_shape(value.args[0].ty) == static_shape(value.args[1].ty):
            adds[var.id_] = (var_ids(value.args), end_of(var, (activation,)).id_)
        elif op_name(value) == "relax.nn.max_pool2d" and isinstance(value.args[0], relax.Var):
            pools[var.id_] = value.args[0].id_
    # An add or a pooling is quantized only where a quantized op reads its result, and a layer's
    # result only there too (else the layer gives float32, and the float ops after it, a GELU or
    # a layer norm, keep their own patterns): to a fixed point, as dropping one drops readers.
    while True:
        readers = {i for reads, _ in (*layers.values(), *adds.values()) for i in reads} | set(pools.values())
        quantized_ends = {end for _, end in layers.values() if end in readers} | {end for _, end in adds.values()}
        kept_adds = {v: a for v, a in adds.items() if a[1] in readers}
        kept_pools = {v: x for v, x in pools.items() if v in readers and x in quantized_ends | set(pools)}
        if kept_adds.keys() == adds.keys() and kept_pools.keys() == pools.keys():
            break
        adds, pools = kept_adds, kept_pools
    ends: dict[int, int | None] = {end: None for end in quantized_ends}
    ends.update(pools)
    return Int8Plan(tuple(layers), ends, frozenset(readers - set(ends)))


class _Quantizer:
    def __init__(self, plan: Int8Plan, bounds: Mapping[int, list[float]], activations: str) -> None:
        self.plan = plan
        self.bounds = bounds
        self.dtype = activations
        self.scales: dict[int, tuple[float, int]] = {}
        self.dequantized: dict[int, relax.Call] = {}  # var id quantized at its definition -> its dequantize
        self.weight_levels = 127 if onednn_has_vnni() else WEIGHT_LEVELS_WITHOUT_VNNI

    def scale(self, var_id: int) -> tuple[float, int]:
        if var_id not in self.scales:
            kept = self.plan.ends.get(var_id)
            if kept is not None:
                return self.scale(kept)
            self.scales[var_id] = with_zero_point(*self.bounds[var_id], self.dtype)
        return self.scales[var_id]

    def fake_quantize(self, expr: relax.Expr, var_id: int, name: str, builder: relax.BlockBuilder) -> relax.Expr:
        """quantize -> dequantize of `expr` (named after the model's value `name`, as onnxruntime names them)."""
        step, zero = self.scale(var_id)
        scale, zero_point = relax.const(np.float32(step)), relax.const(np.asarray(zero, self.dtype))
        quantized = builder.emit(relax.op.quantize(expr, scale, zero_point, axis=-1, out_dtype=self.dtype), f"{name}/QuantizeLinear")
        self.dequantized[var_id] = relax.op.dequantize(quantized, scale, zero_point, axis=-1, out_dtype="float32")
        return self.dequantized[var_id]

    def read(self, arg: relax.Expr, original: relax.Expr, builder: relax.BlockBuilder) -> relax.Expr:
        if isinstance(original, relax.Var) and original.id_ in self.plan.inputs:
            return builder.emit(self.fake_quantize(arg, original.id_, original.name, builder), f"{original.name}/DequantizeLinear")
        return arg

    def name_of(self, var: relax.Var) -> str | None:
        """A value quantized where it is defined is bound to its dequantize; the op keeps the name."""
        return f"{var.name}/DequantizeLinear" if var.id_ in self.plan.ends else None

    def rewrite(self, binding: relax.Binding, value: relax.Expr, builder: relax.BlockBuilder) -> relax.Expr | None:
        var_id, original = binding.var.id_, binding.value
        if isinstance(original, relax.Var) and original.id_ in self.dequantized and not isinstance(binding.var, relax.DataflowVar):
            # A quantized value the model also hands out (a segment's output where placement cuts
            # it) gets a dequantize of its own: the int8 op reading it fuses the other one, which
            # a composite cannot both fuse and hand out.
            dequantize = self.dequantized[original.id_]
            return relax.Call(dequantize.op, dequantize.args, dequantize.attrs)
        if var_id in self.plan.layers:
            weights = constant_array(original.args[1])
            axis = 0 if op_name(original) != "relax.matmul" else 1
            data, scales = QuantizationConfig(per_channel=True, weight_levels=self.weight_levels).quantize_weights(weights, axis)
            dequantized = builder.emit(relax.op.dequantize(relax.const(data), relax.const(scales.astype(np.float32)),
                                                           relax.const(np.zeros(scales.shape, np.int8)), axis=axis, out_dtype="float32"),
                                       f"{binding.var.name}/weights/DequantizeLinear")
            source = self.read(value.args[0], original.args[0], builder)
            value = relax.Call(value.op, [source, dequantized, *value.args[2:]], value.attrs, value.ty_args)
        elif op_name(original) == "relax.add" and any(isinstance(a, relax.Var) and a.id_ in self.plan.inputs for a in original.args):
            value = relax.Call(value.op, [self.read(a, o, builder) for a, o in zip(value.args, original.args)], value.attrs, value.ty_args)
        elif var_id not in self.plan.ends:
            return None
        if var_id in self.plan.ends:
            return self.fake_quantize(builder.emit(value, binding.var.name), var_id, binding.var.name, builder)
        return value


def int8_plan(mod: tvm.IRModule, only: frozenset[int] | None = None) -> Int8Plan:
    """What `quantize_model` quantizes in `mod` (of its layers, `only` these: var ids); its
    `calibrated` values need ranges."""
    with representative({name: r.opt for name, r in dims_of(mod).items()}):  # a dynamic model's shapes at their opt
        plan = _plan(mod["main"], only)
    if not plan.layers:
        raise QuantizationError("precision='int8': the model has no convolution or dense layer with constant float32 weights "
                                "to quantize")
    return plan


def quantize_layers(mod: tvm.IRModule, layers: frozenset[int], ranges: Callable[[Sequence[int]], Mapping[int, list[float]]]) -> tvm.IRModule:
    """`mod` with those of its layers (var ids) quantized, each value's range given by `ranges`
    (var ids -> [low, high]); `mod` itself where there are none."""
    if not layers:
        return mod
    plan = int8_plan(mod, layers)
    return quantize_model(mod, plan, ranges(plan.calibrated))


def quantize_model(mod: tvm.IRModule, plan: Int8Plan, bounds: Mapping[int, list[float]], activations: str = "uint8") -> tvm.IRModule:
    """`mod` in the QDQ form `plan` makes, with `bounds` (value id -> [low, high], for each of
    `plan.calibrated`) as the activation ranges."""
    if activations not in INTEGER_RANGES:
        raise QuantizationError(f"activations={activations!r}: expected one of {', '.join(INTEGER_RANGES)}")
    quantizer = _Quantizer(plan, bounds, activations)
    result = mod.clone()
    result["main"] = rebuild_function(mod["main"], name_of=quantizer.name_of, replace_binding=quantizer.rewrite)
    return result
