"""A region's engine: one onnxruntime inference session, its inputs and outputs bound to the
host's buffers (no copies), each thread's IO binding kept from run to run."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from byoc.backend.engine import engine_context
from byoc.backend.options import parse_bool
from byoc.backend.settings import BUILD, VendorSettings, setting

LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}

# Spinning. "auto" (the default): "always" when the region is all the model computes (see
# `EngineContext.sole_work`), True otherwise. True: threads spin while a run is in progress and
# stop when it returns, so host code and other engines that run next keep their cores; "always":
# they go on spinning after it, as onnxruntime does by default; False: they sleep as soon as they
# run out of work.
# ms per run, 2 threads on 2 cores shared with other work, min over rounds of medians:
#                                        True  "always"  False  onnxruntime on the file
#   bert, one region                     0.54    0.45    0.63   0.41
#   whisper, GELU on the host: 5 regions 1.9     6.0     2.0    0.96
#   SSD detector, NMS after its region   3.7     6.5     3.5    3.7
#   with one core kept busy by another process:
#   bert                                 0.52    0.46    0.61   0.36
#   whisper, GELU on the host            2.0     6.9     2.0    1.0
#   SSD detector                         7.8     6.5     4.1    6.3
# "always" costs up to 3.5x wherever TVM's host kernels run between regions. Where nothing runs
# between regions, True costs what waking the threads at the start of each run takes: the
# exported models at their tiny size, one region each, ran at 1.15-1.32x onnxruntime with True
# and 1.00-1.10x with "always" (median of 500 runs, AVX-512, 2 threads).
SPINNING = {
    False: {"session.intra_op.allow_spinning": "0"},
    True: {"session.intra_op.allow_spinning": "1", "session.force_spinning_stop": "1"},
    "always": {"session.intra_op.allow_spinning": "1", "session.force_spinning_stop": "0"},
}


def _spinning(text: str) -> bool | str:
    lowered = text.strip().lower()
    return lowered if lowered in ("auto", "always") else parse_bool(lowered)


@dataclass(frozen=True)
class OnnxRuntimeSettings(VendorSettings):
    """Session options, given per build or load (`backend_options={"onnxruntime": {...}}`)."""

    intra_op_num_threads: int | None = setting(None, "threads of each session (default: every core)", applies=BUILD, minimum=1)
    graph_optimization_level: str = setting("all", "onnxruntime's graph optimizations", applies=BUILD, choices=tuple(LEVELS))
    allow_spinning: bool | str = setting("auto", "threads spin while a run is in progress (true), also after it (always), never "
                                         "(false), or always when the region is all the model computes and while running "
                                         "otherwise (auto)", applies=BUILD, choices=(True, False, "auto", "always"),
                                         parse=_spinning)


# IO bindings kept per thread, by the buffers they bind: the VM hands a region the same few
# buffers run after run (an output alternates between two: the previous run's result is still
# alive when the next run allocates).
KEPT_BINDINGS = 4


class _Bindings(threading.local):
    def __init__(self) -> None:
        self.by_buffers: dict[tuple[int, ...], ort.IOBinding] = {}
        # The arrays of the last run and their binding: a model that is this region alone hands
        # the same array objects every run (see byoc.runtime_metadata.direct), and comparing them
        # by identity skips reading four addresses (5 us a run).
        self.last: tuple[tuple[np.ndarray, ...], ort.IOBinding] | None = None


class SessionEngine:
    def __init__(self, model_bytes: bytes, settings: OnnxRuntimeSettings | None = None) -> None:
        settings = settings if isinstance(settings, OnnxRuntimeSettings) else OnnxRuntimeSettings()
        session_options = ort.SessionOptions()
        session_options.intra_op_num_threads = settings.intra_op_num_threads or os.cpu_count() or 1
        session_options.graph_optimization_level = LEVELS[settings.graph_optimization_level]
        spinning = settings.allow_spinning
        if spinning == "auto":
            context = engine_context()
            spinning = "always" if context is not None and context.sole_work else True
        self.spinning = spinning
        for key, value in SPINNING[spinning].items():
            session_options.add_session_config_entry(key, value)
        self.session = ort.InferenceSession(model_bytes, session_options, providers=["CPUExecutionProvider"])
        self.model = model_bytes  # what the engine saves (onnxruntime's session holds these bytes anyway)
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        self._bindings = _Bindings()

    def bindings(self) -> dict[tuple[int, ...], ort.IOBinding]:
        """This thread's IO bindings by the addresses of the buffers they bind (an IOBinding is
        not safe to share between threads)."""
        return self._bindings.by_buffers

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        # A binding made per run cost 20 to 30 us (bert's region: 383 -> 360 us a run with the
        # binding kept; onnxruntime's own `run` on the file: 400 us). Dtypes are static, checked
        # by the caller; shapes are too, except in a region written with symbolic shapes, so a
        # binding is named by its buffers' addresses and shapes.
        arrays = (*inputs, *outputs)
        kept = self._bindings
        last = kept.last
        if last is not None and len(last[0]) == len(arrays) and all(a is b for a, b in zip(last[0], arrays)):
            self.session.run_with_iobinding(last[1])
            return
        key = tuple((array.ctypes.data, array.shape) for array in arrays)
        bindings = kept.by_buffers
        io = bindings.get(key)
        if io is None:
            io = self._bind(inputs, outputs)
            if len(bindings) == KEPT_BINDINGS:
                del bindings[next(iter(bindings))]
            bindings[key] = io
        kept.last = (arrays, io)
        self.session.run_with_iobinding(io)

    def run_new(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The region on `inputs`, into outputs onnxruntime allocates (64-byte aligned, handed
        over without a copy): for a shape met once, binding buffers made for the call costs more."""
        return self.session.run(self.outputs, dict(zip(self.inputs, inputs)))

    def _bind(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> ort.IOBinding:
        io = self.session.io_binding()
        for name, array in zip(self.inputs, inputs):
            io.bind_input(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
        for name, array in zip(self.outputs, outputs):
            io.bind_output(name, "cpu", 0, array.dtype, array.shape, array.ctypes.data)
        return io
