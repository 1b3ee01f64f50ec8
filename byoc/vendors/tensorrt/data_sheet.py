"""The `tensorrt` backend: NVIDIA TensorRT on GPUs and Jetson, regions handed over as ONNX.

Data sheet (onnx-tensorrt's operator table, TensorRT 8.5 to 11): float32 and float16 tensors,
int64 indices (cast to int32 by the parser) and bool masks; NCHW convolutions with constant
weights, max and average pooling, matrix products, element-wise and comparison ops, clip, mean
reductions, softmax, layer normalisation (TensorRT 8.6 and later), gather, concatenation,
split, reshape and transpose: the ops of byoc's ONNX translation (`byoc.codegen_json.to_onnx`),
all of which TensorRT's ONNX parser imports. Regions without MACs stay on the host
(`remove_no_mac_subgraphs`), and regions of fewer than `min_block_size` ops too: an engine
launch and two copies cost more than a few element-wise ops save.

Options: `fp16` (regions computed in float16, cast at their boundary; TensorRT 11 networks are
strongly typed, so precision is in the graph), `workspace_bytes` (the builder's scratch memory),
`min_block_size`, `remove_no_mac_subgraphs`, and `tensorrt_version`, the TensorRT the
predicates describe (else the installed one, else 11.4). Partitioning and reports work without
TensorRT; building needs TensorRT, cuda-python and a CUDA device, and says so. A model with
dynamic dimensions gets one engine per region, built with an optimization profile from the
dimensions' ranges (low, opt, high: `engine.profile_shapes`).
"""

from __future__ import annotations

import dataclasses

import tvm

from byoc.backend import Backend, CostRules, Limits, register_backend
from byoc.backend.tolerance import FP16, FP32
from byoc.codegen_json.to_onnx import EMITTERS, ONNX_CHECKS, ONNX_OPS
from byoc.flow import partition_for
from byoc.ir.types import is_tensor_constant
from byoc.processing import Float16Pass
from byoc.vendors.tensorrt.engine import TensorRTSettings
from byoc.vendors.tensorrt.runtime import runtime
from byoc.vendors.tensorrt.versions import ONNX_OP_SINCE, format_version, resolve_version


def _since(op_name: str, version: tuple[int, int]):
    """The ONNX translation's own check, then the parser's version gate for the op it emits."""
    onnx_op = ONNX_OPS.get(op_name)
    first = ONNX_OP_SINCE.get(onnx_op)
    spelled = ONNX_CHECKS.get(op_name)

    def check(call) -> str | None:
        if first is not None and version < first:
            return f"{onnx_op} needs TensorRT {format_version(first)}; the parser of {format_version(version)} does not import it"
        return spelled(call) if spelled is not None else None

    return check


def _constant_conv_weights(call) -> str | None:
    return None if is_tensor_constant(call.args[1]) else "convolution weights must be an initializer (onnx-tensorrt)"


class _Precision(Float16Pass):
    """Float16 for the regions partitioned with fp16=True."""

    name = "float16 (regions partitioned with fp16=True)"

    def __call__(self, graph, constants, context):
        if context.settings.fp16:
            return super().__call__(graph, constants, context)
        return graph, constants


def tensorrt_backend(settings: TensorRTSettings | None = None) -> Backend:
    """The backend for one TensorRT version and precision (its op checks depend on the version),
    its settings naming the version it resolved."""
    settings = settings or TensorRTSettings()
    version, origin = resolve_version(settings.tensorrt_version)
    settings = dataclasses.replace(settings, tensorrt_version=format_version(version))
    made = runtime(settings)
    backend = Backend(
        name=made.name,
        priority=9,
        description=f"NVIDIA TensorRT {format_version(version)} ({origin}), {'fp16' if settings.fp16 else 'fp32'}",
        limits=Limits(dtypes=("float32", "float16", "int64", "bool")),
        cost=CostRules(min_ops_per_region=settings.min_block_size, fallback_without_macs=settings.remove_no_mac_subgraphs),
        codegen=made.codegen,
        processing=[_Precision()],
        settings=settings,
        configure=tensorrt_backend,
        tolerance=FP16 if settings.fp16 else FP32,
        unavailable=made.unavailable,
        symbolic_shapes=True,  # one engine per region, its optimization profile from the dimensions' ranges
    )
    for op_name in EMITTERS:
        backend.supports(op_name, check=_since(op_name, version))
    conv = backend.op_rules["relax.nn.conv2d"].check
    backend.supports("relax.nn.conv2d", check=lambda call: conv(call) or _constant_conv_weights(call))
    return backend


register_backend(tensorrt_backend(), origin="byoc (built-in)")


def partition_for_tensorrt(mod: tvm.IRModule, fp16: bool = False, workspace_bytes: int = 1 << 30, min_block_size: int = 3,
                           remove_no_mac_subgraphs: bool = True, tensorrt_version: str | None = None, **options) -> tvm.IRModule:
    """Partition for TensorRT; `byoc.partition_for(mod, "tensorrt", **options)`."""
    return partition_for(mod, "tensorrt", fp16=fp16, workspace_bytes=workspace_bytes, min_block_size=min_block_size,
                         remove_no_mac_subgraphs=remove_no_mac_subgraphs, tensorrt_version=tensorrt_version, **options)
