"""The `cuda` backend: NVIDIA GPUs, each region one CUDA library compiled by nvcc.

Data sheet: float32 regions, or float16 or bfloat16 ones (`dtype="float16"`: cast inside the
region, float32 at its boundary), of static shapes. Matrix products through cuBLAS (float32
accumulation; an activation's batch folded into the rows against 2-D weights, batched products of
activations), 2-D NCHW convolutions through cuDNN (grouped and dilated, symmetric padding; its
heuristics' algorithm; float32 without TF32, as torch's `allow_tf32=False`), and between them
generated kernels: element-wise arithmetic and activations with NumPy broadcasting, fused into
one kernel where an op's one reader is element-wise (a bias add and its activation, GELU as
exporters write it), softmax and layer normalisation over the last axis, mean and sum over any
axes, max and average pooling, embedding lookups (take along axis 0), transposes and
concatenation; reshapes are views. Data stays on the device inside a region; a call copies its
inputs there and its outputs back once, and a profile shows the copies apart.

Building needs nvcc (CUDA's toolkit, no GPU): a region is compiled for `arch` (sm_90 by default:
H100, H200). Running needs NVIDIA's driver, a GPU of that architecture or newer, and cuBLAS and
cuDNN (`pip install nvidia-cublas nvidia-cudnn-cu13`, or CUDA's own install on the loader's path);
a build where there is no GPU leaves the engines to the machine that loads the model.
"""

from __future__ import annotations

import tvm

from byoc.annotate.predicates import shape
from byoc.backend import Backend, CostRules, Limits, register_backend
from byoc.backend.tolerance import BF16, FP16, FP32
from byoc.codegen_cuda.compile import nvcc
from byoc.codegen_cuda.elementwise import ELEMENTWISE
from byoc.flow import partition_for
from byoc.ir.types import dtype_name
from byoc.processing.cast import to_float16
from byoc.vendors.cuda.runtime import RUNTIME, CudaSettings

FLOATS = ("float32", "float16", "bfloat16")


def _float(call) -> str | None:
    dtype = dtype_name(call.ty)
    return None if dtype in FLOATS else f"{dtype} results are computed on the host (the generated kernels compute floats)"


def _matmul(call) -> str | None:
    """Products whose batches match, or broadcast one side (cuBLAS's strided batches)."""
    a, b = shape(call.args[0]), shape(call.args[1])
    if len(a) < 2 or len(b) < 2:
        return "products of vectors stay on the host"
    batch = shape(call)[:-2]
    for side in (a[:-2], b[:-2]):
        if side and list(side) != list(batch[len(batch) - len(side):]) and max(side) != 1:
            return f"batch {tuple(side)} neither matches {tuple(batch)} nor broadcasts"
    if len(b) > 2 and len(a[:-2]) != len(b[:-2]) and max(a[:-2], default=1) != 1:
        return "batches of different ranks"
    return _float(call)


def _conv2d(call) -> str | None:
    """2-D, NCHW data and OIHW weights, padding alike on both sides (cuDNN's descriptor)."""
    attrs = call.attrs
    if (attrs.data_layout, attrs.kernel_layout) != ("NCHW", "OIHW"):
        return f"layout {attrs.data_layout}/{attrs.kernel_layout}; cuDNN here takes NCHW/OIHW"
    top, left, bottom, right = (int(p) for p in attrs.padding)
    if (top, left) != (bottom, right):
        return f"padding {(top, left, bottom, right)} differs between sides"
    return _float(call)


def _pool(call) -> str | None:
    return None if call.attrs.layout == "NCHW" else f"layout {call.attrs.layout}; pooling here takes NCHW"


def _last_axis(call) -> str | None:
    rank = len(shape(call))
    axes = [int(call.attrs.axis)] if hasattr(call.attrs, "axis") else [int(a) for a in call.attrs.axes]
    return None if [a % rank for a in axes] == [rank - 1] else "only over the last axis"


def _take(call) -> str | None:
    if int(call.attrs.axis) != 0:
        return "embedding lookups (axis 0) only"
    index = dtype_name(call.args[1].ty)
    return None if index in ("int32", "int64") else f"{index} indices"


class _Precision:
    """The region cast to the half type its settings name (`dtype`), float32 at its boundary."""

    name = "float16 or bfloat16 (regions partitioned with dtype=float16 or bfloat16)"

    def __call__(self, graph, constants, context):
        half = context.settings.dtype
        return to_float16(graph, constants, half) if half != "float32" else (graph, constants)


def _no_nvcc() -> str | None:
    return None if nvcc() is not None else "nvcc (CUDA's toolkit) is not installed: building CUDA regions needs it"


def cuda_backend(settings: CudaSettings | None = None) -> Backend:
    """The backend for one precision (its tolerance depends on it)."""
    settings = settings or RUNTIME.settings
    backend = Backend(
        name=RUNTIME.name,
        priority=9,
        description=f"NVIDIA GPU ({settings.arch}, {settings.dtype}): cuBLAS, cuDNN and generated CUDA",
        limits=Limits(dtypes=(*FLOATS, "int64", "int32"), max_rank=6),
        cost=CostRules(fallback_without_macs=True),
        codegen=RUNTIME.codegen,
        processing=[_Precision()],
        settings=settings,
        configure=cuda_backend,
        tolerance={"float16": FP16, "bfloat16": BF16}.get(settings.dtype, FP32),
        unavailable=_no_nvcc,
    )
    backend.supports("relax.matmul", check=_matmul)
    backend.supports("relax.nn.conv2d", check=_conv2d)
    backend.supports("relax.nn.max_pool2d", "relax.nn.avg_pool2d", check=_pool)
    backend.supports("relax.nn.softmax", "relax.nn.layer_norm", check=_last_axis)
    backend.supports("relax.take", check=_take)
    backend.supports(*sorted(ELEMENTWISE), "relax.mean", "relax.sum", "relax.permute_dims", "relax.concat",
                     "relax.reshape", "relax.flatten", "relax.squeeze", "relax.expand_dims", check=_float)
    return backend


register_backend(cuda_backend(), origin="byoc (built-in)")


def partition_for_cuda(mod: tvm.IRModule, **options) -> tvm.IRModule:
    """`byoc.partition_for(mod, "cuda", **options)`: `arch` ("sm_90"), `dtype` ("float32",
    "float16", "bfloat16"), and cost rules."""
    return partition_for(mod, "cuda", **options)
