"""The tail of a model whose shapes depend on its data (see byoc.ir.tail), run in onnxruntime on
the compiled model's outputs: one session per model, made on first use, which threads share
(onnxruntime's `run` may be called from several at once)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence

import numpy as np
import onnx

from byoc.errors import ArtifactError, EngineError, one_line
from byoc.ir.tail import ModelTail
from byoc.runtime_metadata.artifact_types import TensorSpec
from byoc.timing import spread, time_runs


class TailRunner:
    """The tail of one model, fed by the compiled part's outputs (`head`: their names)."""

    def __init__(self, tail: ModelTail, head: Sequence[str], where: str) -> None:
        missing = [name for name in tail.inputs if name not in head]
        if missing:
            raise ArtifactError(f"{where}: the tail reads {missing}, which the compiled part does not give")
        self.tail, self._where = tail, where
        self._positions = [list(head).index(name) for name in tail.inputs]
        self._session = None
        self._lock = threading.Lock()

    @functools.cached_property
    def outputs(self) -> list[TensorSpec]:
        """The model's outputs: a size the data decides is -1, or the file's name for it (read
        off the tail's ONNX model once)."""
        graph = onnx.ModelProto.FromString(self.tail.model).graph
        specs = []
        for value in graph.output:
            tensor = value.type.tensor_type
            shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or -1) for d in tensor.shape.dim)
            specs.append(TensorSpec(value.name, shape, onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name))
        return specs

    def _made(self):
        with self._lock:
            if self._session is None:
                import onnxruntime as ort

                options = ort.SessionOptions()
                options.log_severity_level = 3  # unused initializers the cut left are no news
                self._session = ort.InferenceSession(self.tail.model, options, providers=["CPUExecutionProvider"])
            return self._session

    def run(self, head: Sequence[np.ndarray]) -> list[np.ndarray]:
        feeds = {name: head[position] for name, position in zip(self.tail.inputs, self._positions)}
        try:
            return list(self._made().run(None, feeds))
        except Exception as error:  # onnxruntime's own errors name the node
            raise EngineError(f"{self._where}: the tail (onnxruntime, {self.tail.nodes} node(s) from node {self.tail.first!r}) "
                              f"failed: {one_line(error)}") from error


def time_tail(tail: TailRunner, head: Sequence[np.ndarray], repeat: int) -> float:
    """The tail's median time in ms over `repeat` runs on the head's outputs (after one run)."""
    return spread(time_runs(lambda: tail.run(head), repeat)).median_ms
