"""The `onnxruntime` backend: ONNX Runtime's CPU execution provider, through JSON graphs.

Data sheet: float32 tensors (int64 and bool where ONNX takes them: indices, masks); NCHW
convolutions and pooling, matrix products, element-wise and comparison ops, reductions,
softmax, layer normalisation, gather, concatenation, split, reshape and transpose: the ops of
the translation table in `byoc.codegen_json.to_onnx`. Each region becomes an ONNX model and one inference
session, built once. Session options: `intra_op_num_threads`, `graph_optimization_level`
("disable", "basic", "extended", "all") and `allow_spinning` (off by default), passed per build
with `backend_options={"onnxruntime": {...}}`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
import tvm

from byoc.backend import Backend, CostRules, Limits, register_backend
from byoc.codegen_json import JsonRuntime
from byoc.codegen_json.to_onnx import EMITTERS, ONNX_CHECKS, graph_to_onnx
from byoc.flow import partition_for

_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


class SessionEngine:
    """One inference session per region; inputs and outputs are bound to the host's buffers
    (no copies)."""

    def __init__(self, model_bytes: bytes, options: Mapping[str, Any]) -> None:
        unknown = set(options) - {"intra_op_num_threads", "graph_optimization_level", "allow_spinning"}
        if unknown:
            raise ValueError(f"unknown onnxruntime options {sorted(unknown)}")
        session_options = ort.SessionOptions()
        session_options.intra_op_num_threads = int(options.get("intra_op_num_threads", os.cpu_count() or 1))
        session_options.graph_optimization_level = _LEVELS[options.get("graph_optimization_level", "all")]
        # A region's session shares the cores with host code and other engines: threads that
        # spin after a run slow down whatever runs next (3.4x on the SSD detector, whose
        # post-processing runs on the host right after the region).
        session_options.add_session_config_entry("session.intra_op.allow_spinning", "1" if options.get("allow_spinning") else "0")
        self.session = ort.InferenceSession(model_bytes, session_options, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        binding = self.session.io_binding()
        for name, array in zip(self.inputs, inputs):
            binding.bind_input(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
        for name, array in zip(self.outputs, outputs):
            binding.bind_output(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
        self.session.run_with_iobinding(binding)


def build_engine(graph, constants, options) -> SessionEngine:
    return SessionEngine(graph_to_onnx(graph, constants).SerializeToString(), options)


onnxruntime = Backend(
    name="onnxruntime",
    codegen="json",
    priority=5,
    description=f"ONNX Runtime {ort.__version__}, CPU execution provider",
    limits=Limits(dtypes=("float32", "int64", "bool")),
    cost=CostRules(fallback_without_macs=True),
    json_runtime=JsonRuntime(build_engine=build_engine, version=f"onnxruntime-{ort.__version__}"),
)


for op_name, check in ONNX_CHECKS.items():
    onnxruntime.supports(op_name, check=check)
onnxruntime.supports(*(op for op in EMITTERS if op not in onnxruntime.op_rules))

register_backend(onnxruntime, origin="byoc (built-in)")


def partition_for_onnxruntime(mod: tvm.IRModule, **options) -> tvm.IRModule:
    """Partition for ONNX Runtime; `byoc.partition_for(mod, "onnxruntime", **options)`; options are cost rules."""
    return partition_for(mod, "onnxruntime", **options)
