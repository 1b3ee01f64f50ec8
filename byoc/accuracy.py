"""Accuracy of a compiled model against onnxruntime on the ONNX model (float32, or the model's own
float16 or quantized computation).

For int8 and float16 vendors the error is the point: it is stated as the largest absolute
error, the relative L2 error over all samples, for classifiers how often the top-1 class
agrees, and for integer outputs (a detector's NonMaxSuppression selections) how many of the
selected rows both runs select: quantization noise reorders near-tied scores, so such outputs are
compared as sets, not value by value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import onnx
import onnxruntime as ort

from byoc.frontend.onnx.graph_inputs import bind_inputs
from byoc.relative_l2 import RelativeL2
from byoc.runtime_metadata.model import CompiledModel

Reference = Callable[[Mapping[str, np.ndarray]], Sequence[np.ndarray]]


@dataclass
class AccuracyReport:
    samples: int
    max_abs_error: float
    relative_l2: float
    top1_agreement: float | None  # None when the first output is not class scores
    selection_agreement: float | None = None  # rows of integer outputs selected by both (IoU); None without any

    @property
    def sqnr_db(self) -> float:
        """Signal-to-quantization-noise ratio, 20 log10(1 / relative L2): 20 dB per tenfold less error."""
        return math.inf if self.relative_l2 == 0 else -20.0 * math.log10(self.relative_l2)

    def to_dict(self) -> dict:
        return {**asdict(self), "sqnr_db": self.sqnr_db}

    def to_table(self) -> str:
        top1 = f"{self.top1_agreement:.0%}" if self.top1_agreement is not None else "n/a"
        selection = "" if self.selection_agreement is None else f", selections agree {self.selection_agreement:.0%}"
        return (
            f"accuracy against onnxruntime on the model over {self.samples} seeded random input(s): max abs error {self.max_abs_error:.4g}, "
            f"relative L2 {self.relative_l2:.2%} (SQNR {self.sqnr_db:.1f} dB), top-1 agreement {top1}{selection}"
        )

    def __str__(self) -> str:
        return self.to_table()


def onnxruntime_reference(model: onnx.ModelProto, names: Sequence[str] | None = None) -> Reference:
    """onnxruntime on `model`, fed inputs by byoc's names: `names` are the compiled model's input
    names, in the order of the ONNX model's run-time inputs (the importer renames inputs whose
    names are not identifiers: `input.1` becomes `input_1`)."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    onnx_names = [value.name for value in bind_inputs(model).graph.input]
    rename = dict(zip(names, onnx_names)) if names is not None and len(names) == len(onnx_names) else {}
    return lambda inputs: session.run(None, {rename.get(name, name): value for name, value in inputs.items()})


def measure_accuracy(compiled: CompiledModel, reference: onnx.ModelProto | Reference, samples: Sequence[Mapping[str, np.ndarray]]) -> AccuracyReport:
    """Compare `compiled` with `reference` on `samples` (inputs by name)."""
    if not samples:
        raise ValueError("accuracy needs at least one sample")
    run_reference = (onnxruntime_reference(reference, [spec.name for spec in compiled.inputs])
                     if isinstance(reference, onnx.ModelProto) else reference)
    max_error, relative, agreements = 0.0, RelativeL2(), []
    shared_rows, all_rows = 0, 0
    classifier = True
    for sample in samples:
        got, want = compiled.run(**sample), run_reference(sample)
        for g, w in zip(got, want):
            if not np.issubdtype(w.dtype, np.floating):
                shared, union = _row_overlap(g, w)
                shared_rows, all_rows = shared_rows + shared, all_rows + union
                continue
            max_error = max(max_error, float(np.abs(relative.add(g, w)).max(initial=0.0)))
        first = want[0]
        # class scores: (batch, classes), or (batch, classes, 1, 1) as a convolutional head leaves them
        classifier = (classifier and first.ndim >= 2 and np.issubdtype(first.dtype, np.floating)
                      and first.shape[1] > 1 and all(d == 1 for d in first.shape[2:]))
        if classifier:
            scores = got[0].reshape(first.shape[0], -1).argmax(axis=1)
            agreements.append(float(np.mean(scores == first.reshape(first.shape[0], -1).argmax(axis=1))))
    selection = shared_rows / all_rows if all_rows else None
    return AccuracyReport(len(samples), max_error, relative.value, float(np.mean(agreements)) if classifier else None, selection)


def _row_overlap(got: np.ndarray, want: np.ndarray) -> tuple[int, int]:
    """Rows (the last axis is one record, as in NonMaxSuppression's [batch, class, box]) found in
    both arrays, and in either: the intersection and the union of the two row sets."""
    def rows(array: np.ndarray) -> set[tuple]:
        return {tuple(row) for row in np.asarray(array).reshape(-1, array.shape[-1] if array.ndim else 1).tolist()}

    mine, theirs = rows(got), rows(want)
    return len(mine & theirs), len(mine | theirs)
