"""The `dnnl` backend: Intel oneDNN (v3) on the CPU, through C code generation.

Data sheet: float32, NCHW activations and OIHW weights. Convolutions (grouped and depthwise
included) with bias, residual add and ReLU/clip fused as post-ops; matrix products (constant or
activation weights, batched) with bias and ReLU, GELU or a residual add fused, or scaled by a
constant (attention scores); max and average pooling; mean reductions with
kept dimensions (global pooling); element-wise ops and broadcasting binary ops; softmax, layer
normalisation, GELU (erf form), concatenation, reshape and transpose. Regions without MACs stay
on the host: a reorder-only region costs more than it saves.
"""

from __future__ import annotations

import tvm
from tvm.relax.dpl import is_const, is_op, wildcard

from byoc.annotate import fused_pattern
from byoc.backend import Backend, CostRules, Limits, register_backend
from byoc.codegen_c import CLibrary
from byoc.flow import partition_for
from byoc.vendors.dnnl import emitters, library
from byoc.vendors.dnnl.predicates import (
    binary_broadcast,
    concat_same_rank,
    conv2d_nchw,
    dense_constant_weight,
    dense_gelu,
    dense_residual,
    fused_conv,
    gelu_constants,
    layer_norm_last_axis,
    matmul_shapes,
    mean_keepdims,
    pool_nchw,
    scaled_matmul,
)

dnnl = Backend(
    name="dnnl",
    codegen="c",
    priority=10,
    description="Intel oneDNN on the CPU (C API, fused post-ops, blocked layouts inside regions)",
    limits=Limits(dtypes=("float32",), max_rank=6),
    cost=CostRules(fallback_without_macs=True),
)

# ---------------------------------------------------------------- composites
_ACTIVATIONS = ("relax.nn.relu", "relax.clip")


def _conv_with_residual(activation: str | None, residual_first: bool):
    # One pattern per operand order rather than an OR: FuseOpsByPattern checks only the first
    # alternative that matches, and a rejected one (say, the other operand is a conv whose
    # output is read elsewhere) would hide the one that fits.
    conv = is_op("relax.nn.conv2d")(wildcard(), is_const())
    biased = is_op("relax.add")(conv, is_const())
    residual = wildcard()
    added = is_op("relax.add")(residual, biased) if residual_first else is_op("relax.add")(biased, residual)
    out = is_op(activation)(added) if activation else added
    return out, {"root": conv, "residual": residual}


def _gelu(x=None):
    x = wildcard() if x is None else x
    erf = is_op("relax.erf")(is_op("relax.divide")(x, is_const()))
    one_plus = is_op("relax.add")(erf, is_const())
    half_x = is_op("relax.multiply")(x, is_const())
    return is_op("relax.multiply")(half_x, one_plus), {"root": half_x}


def _dense_bias_then(tail: str):
    """A dense layer with bias, then GELU (a transformer's MLP) or a residual add (the end of a
    transformer block), each fused as a post-op."""
    dense, parts = fused_pattern("relax.matmul", bias=True, constant_weight=True)
    if tail == "gelu":
        return _gelu(dense)[0], parts
    residual = wildcard()
    return is_op("relax.add")(dense, residual), {**parts, "residual": residual}


def _scaled_matmul(op: str):
    """Attention scores: a product of activations scaled by a constant, the scale a post-op."""
    matmul, scale = is_op("relax.matmul")(wildcard(), wildcard()), is_const()
    return is_op(op)(matmul, scale), {"root": matmul, "scale": scale}


dnnl.pattern("conv2d_bias_add_relu", *_conv_with_residual("relax.nn.relu", False), check=fused_conv)
dnnl.pattern("conv2d_bias_add_relu_swapped", *_conv_with_residual("relax.nn.relu", True), check=fused_conv)
dnnl.pattern("conv2d_bias_add", *_conv_with_residual(None, False), check=fused_conv)
dnnl.pattern("conv2d_bias_add_swapped", *_conv_with_residual(None, True), check=fused_conv)
dnnl.pattern("conv2d_bias_act", *fused_pattern("relax.nn.conv2d", bias=True, activation=_ACTIVATIONS, constant_weight=True), check=fused_conv)
dnnl.pattern("conv2d_bias", *fused_pattern("relax.nn.conv2d", bias=True, constant_weight=True), check=fused_conv)
dnnl.pattern("dense_bias_gelu", *_dense_bias_then("gelu"), check=dense_gelu)
dnnl.pattern("dense_bias_add", *_dense_bias_then("add"), check=dense_residual)
dnnl.pattern("matmul_divide", *_scaled_matmul("relax.divide"), check=scaled_matmul)
dnnl.pattern("matmul_multiply", *_scaled_matmul("relax.multiply"), check=scaled_matmul)
dnnl.pattern("dense_bias_relu", *fused_pattern("relax.matmul", bias=True, activation="relax.nn.relu", constant_weight=True), check=dense_constant_weight)
dnnl.pattern("dense_bias", *fused_pattern("relax.matmul", bias=True, constant_weight=True), check=dense_constant_weight)
dnnl.pattern("gelu", *_gelu(), check=gelu_constants)

# ------------------------------------------------------------------ single ops
dnnl.supports("relax.nn.conv2d", check=conv2d_nchw)
dnnl.supports("relax.matmul", check=matmul_shapes)
dnnl.supports("relax.nn.max_pool2d", "relax.nn.avg_pool2d", check=pool_nchw)
dnnl.supports("relax.mean", check=mean_keepdims)
dnnl.supports("relax.add", "relax.subtract", "relax.multiply", "relax.divide", check=binary_broadcast)
dnnl.supports("relax.nn.relu", "relax.clip", "relax.sigmoid", "relax.tanh", "relax.exp", "relax.sqrt", "relax.nn.softmax")
dnnl.supports("relax.concat", check=concat_same_rank)
dnnl.supports("relax.nn.layer_norm", check=layer_norm_last_axis)
dnnl.supports("relax.reshape", "relax.permute_dims")

# ---------------------------------------------------------------------- codegen
_conv_emitters = dict.fromkeys([*(p.name for p in dnnl.patterns if p.name.startswith("conv2d")), "relax.nn.conv2d"], emitters.convolution)
_dense_emitters = dict.fromkeys([*(p.name for p in dnnl.patterns if p.name.startswith(("dense", "matmul"))), "relax.matmul"], emitters.matmul)
dnnl.c_library = CLibrary(
    name="onednn",
    version=library.version() if library.installed() else "not installed",
    headers=["oneapi/dnnl/dnnl.h", "math.h"],
    include_dirs=lambda: [library.include_dir()],
    library_dirs=lambda: [library.library_dir()],
    libraries=["dnnl"],
    prologue=library.PROLOGUE,
    bind_buffer=library.bind_buffer,
    emitters={
        **_conv_emitters,
        **_dense_emitters,
        "gelu": emitters.eltwise,
        "relax.nn.max_pool2d": emitters.pooling,
        "relax.nn.avg_pool2d": emitters.pooling,
        "relax.mean": emitters.mean,
        **dict.fromkeys(["relax.add", "relax.subtract", "relax.multiply", "relax.divide"], emitters.binary),
        **dict.fromkeys(["relax.nn.relu", "relax.clip", "relax.sigmoid", "relax.tanh", "relax.exp", "relax.sqrt"], emitters.eltwise),
        "relax.nn.softmax": emitters.softmax,
        "relax.concat": emitters.concat,
        "relax.nn.layer_norm": emitters.layer_norm,
        "relax.reshape": emitters.reshape,
        "relax.permute_dims": emitters.permute_dims,
    },
)

register_backend(dnnl, origin="byoc (built-in)")


def partition_for_dnnl(mod: tvm.IRModule, **options) -> tvm.IRModule:
    """Partition for oneDNN; `byoc.partition_for(mod, "dnnl", **options)`; options are cost rules."""
    return partition_for(mod, "dnnl", **options)
