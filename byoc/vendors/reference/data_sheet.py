"""The `reference` backend: a generic tensor accelerator whose regions TVM compiles itself.

Data sheet: float32, static shapes; convolutions and matrix products, pooling, element-wise
arithmetic and activations, normalisation, softmax, and the layout ops around them. Gather,
comparisons, control flow and detection post-processing stay on the host. Conv2d with optional
bias and ReLU is one composite instruction.
"""

from __future__ import annotations

import tvm

from byoc.annotate.patterns import fused_pattern
from byoc.backend import Backend, Limits, register_backend
from byoc.flow import partition_for
from byoc.vendors.reference.runtime import RUNTIME

reference = Backend(
    name=RUNTIME.name,
    description="regions compiled by TVM (LLVM, untuned); the runnable stand-in for an accelerator",
    limits=Limits(dtypes=("float32",)),
    settings=RUNTIME.settings,
    codegen=RUNTIME.codegen,
)

reference.pattern("conv2d_bias_relu", *fused_pattern("relax.nn.conv2d", bias=True, activation="relax.nn.relu"))
reference.pattern("conv2d_bias", *fused_pattern("relax.nn.conv2d", bias=True))

reference.supports(
    "relax.nn.conv2d",
    "relax.matmul",
    "relax.nn.max_pool2d",
    "relax.nn.avg_pool2d",
    "relax.nn.adaptive_avg_pool2d",
    "relax.mean",
    "relax.add",
    "relax.subtract",
    "relax.multiply",
    "relax.divide",
    "relax.nn.relu",
    "relax.clip",
    "relax.sigmoid",
    "relax.tanh",
    "relax.exp",
    "relax.erf",
    "relax.sqrt",
    "relax.nn.gelu",
    "relax.nn.softmax",
    "relax.nn.layer_norm",
    "relax.reshape",
    "relax.permute_dims",
    "relax.concat",
    "relax.split",
)

register_backend(reference, origin="byoc (built-in)")


def partition_for_reference(mod: tvm.IRModule, **options) -> tvm.IRModule:
    """Partition for the reference backend; `byoc.partition_for(mod, "reference", **options)`; options are cost rules."""
    return partition_for(mod, "reference", **options)
