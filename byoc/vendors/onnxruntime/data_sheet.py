"""The `onnxruntime` backend: ONNX Runtime's CPU execution provider, through JSON graphs.

Data sheet: float32, float16, int32, int64 and bool tensors (a float16 model goes as its file
does: the CPU provider computes in float32 the float16 ops it has no kernel for); every op of the translation table in
`byoc.codegen_json.to_onnx` (convolutions and pooling in 1 to 3 dimensions, matrix products,
element-wise, comparison and logical ops, GELU, reductions, softmax, layer and batch
normalisation, gathers and scatters, slices, reshapes and transposes, casts), within the type
constraints of each ONNX op and where the CPU provider has a kernel, so the graphs the ONNX
frontend makes of exported transformers and CNNs are one region each. A quantized model keeps its
QuantizeLinear, DequantizeLinear and int8 weights in the region, and onnxruntime fuses them into
its int8 kernels as it does for the model alone (a convolution's bias is written into its Conv
for that, see `to_onnx`); on a CPU with VNNI its int8 activations go as uint8, the same values in
the form onnxruntime's int8 kernels take (`byoc.processing.unsigned`). Regions without MACs stay
on the host. Each region becomes an ONNX model at opset 20 and one inference session, built once,
its inputs and outputs bound to the host's buffers; a model with dynamic dimensions gets one
session per region for every shape in range (its dimensions symbolic in the ONNX model).
Session options, passed per build with `backend_options={"onnxruntime": {...}}`:
`intra_op_num_threads` (default: every core), `graph_optimization_level` ("disable", "basic",
"extended", "all": the default) and `allow_spinning` ("auto", the default: "always" when the
region is all the model computes, True otherwise; True: threads spin while a run is in
progress; "always": also after it, as onnxruntime does alone; False: never), measured in
`engine.py`.
"""

from __future__ import annotations

import onnxruntime as ort
import tvm

from byoc.backend import Backend, CostRules, Limits, register_backend
from byoc.codegen_json.to_onnx import LATEST_OPSET, onnx_checks
from byoc.flow import partition_for
from byoc.ir.types import dtype_name
from byoc.vendors.onnxruntime.runtime import RUNTIME

# Types ONNX allows but onnxruntime's CPU execution provider has no kernel for (the ONNX op of
# every translation, one-node sessions on float32, int32, int64 and bool, onnxruntime 1.32).
NO_CPU_KERNEL = {"relax.nn.relu": ("int64",), "relax.nn.prelu": ("int32", "int64"), "relax.where": ("bool",)}


# Regions are written at opset 20, as torch.onnx writes: GELU stays one node, as in the exported file.
CHECKS = onnx_checks(LATEST_OPSET)


def _cpu_kernel(op_name: str, missing: tuple[str, ...]):
    spelled = CHECKS[op_name]

    def check(call) -> str | None:
        dtype = dtype_name(call.ty)
        return f"onnxruntime's CPU provider has no {op_name} kernel for {dtype}" if dtype in missing else spelled(call)

    return check


onnxruntime = Backend(
    name=RUNTIME.name,
    priority=5,
    description=f"ONNX Runtime {ort.__version__}, CPU execution provider",
    limits=Limits(dtypes=("float32", "float16", "int32", "int64", "bool"), quantized=("int8", "uint8"), quantized_as_written=True),
    cost=CostRules(fallback_without_macs=True),
    codegen=RUNTIME.codegen,
    settings=RUNTIME.settings,
    symbolic_shapes=True,
)


for op_name, check in CHECKS.items():
    onnxruntime.supports(op_name, check=check)
for op_name, missing in NO_CPU_KERNEL.items():
    onnxruntime.supports(op_name, check=_cpu_kernel(op_name, missing))

register_backend(onnxruntime, origin="byoc (built-in)")


def partition_for_onnxruntime(mod: tvm.IRModule, **options) -> tvm.IRModule:
    """Partition for ONNX Runtime; `byoc.partition_for(mod, "onnxruntime", **options)`; options are cost rules."""
    return partition_for(mod, "onnxruntime", **options)
