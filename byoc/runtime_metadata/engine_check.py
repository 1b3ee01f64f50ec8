"""The build-time check of a region's engine: the right kind of object, and a trial run on the
region's shapes that writes every output.

An engine that fails here would fail (or silently return stale memory) at the first run, when
the host code is fixed and nothing can fall back; `build` runs this check on each engine it
creates, and a region that fails it falls back to the host (or fails the build under `strict`).
"""

from __future__ import annotations

import threading

import numpy as np

from byoc.errors import EngineError
from byoc.runtime_metadata.artifact_types import RegionArtifact, TensorSpec
from byoc.runtime_metadata.constants import aligned
from byoc.runtime_metadata.engine import Engine


def _filled(spec: TensorSpec, second: bool) -> np.ndarray:
    """An output buffer filled with one of two marks no engine writes by chance in both runs."""
    dtype = np.dtype(spec.dtype)
    if dtype == np.bool_:
        mark = second
    elif dtype.kind == "f":
        mark = -3.0e38 if second else 1.5e-7
    else:
        mark = np.iinfo(dtype).min + (7 if second else 3)
    return aligned(np.full(spec.shape, mark, dtype=dtype))


def check_engine(engine: object, artifact: RegionArtifact, where: str) -> None:
    """Raise an EngineError naming `where` when `engine` is no Engine, fails a run on inputs of
    zeros, or leaves part of an output unwritten.

    Each output is filled with a different mark before each of two runs on the same inputs: an
    element that still holds the first mark after the first run and the second after the second
    was never written (a deterministic engine writes the same value both times, which cannot
    equal both marks). Zeros are valid for every input, index inputs included. Buffers are
    64-byte aligned, as the host's are.
    """
    if not isinstance(engine, Engine):
        raise EngineError(f"{where}: the vendor returned a {type(engine).__module__}.{type(engine).__qualname__}, "
                          "which is not an engine: it has no run(inputs, outputs) method")
    inputs = [aligned(np.zeros(spec.shape, np.dtype(spec.dtype))) for spec in artifact.inputs]
    runs: list[list[np.ndarray]] = []
    failure: list[BaseException] = []

    def trial() -> None:
        try:
            for second in (False, True):
                outputs = [_filled(spec, second) for spec in artifact.outputs]
                engine.run(inputs, outputs)
                runs.append(outputs)
        except BaseException as error:  # noqa: BLE001 - handed to the building thread
            failure.append(error)

    # On a thread of its own: what an engine keeps per thread for the trial's buffers
    # (onnxruntime's IO bindings) goes with the thread, not into the model's runs.
    thread = threading.Thread(target=trial, name=f"byoc trial run of {artifact.symbol}")
    thread.start()
    thread.join()
    if failure:
        error = failure[0]
        raise EngineError(f"{where}: the engine failed a trial run on inputs of zeros: {type(error).__name__}: {error}") from error
    for index, (spec, first, second) in enumerate(zip(artifact.outputs, *runs)):
        unwritten = (first == _filled(spec, False)) & (second == _filled(spec, True))
        if unwritten.any():
            raise EngineError(f"{where}: the engine left {int(unwritten.sum())} of {unwritten.size} elements of output {index} "
                              f"{tuple(spec.shape)} unwritten in a trial run: an engine writes every output in place")
