"""The build-time check of a region's engine: the right kind of object, and a trial run on the
region's shapes that writes every output.

An engine that fails here would fail (or silently return stale memory) at the first run, when
the host code is fixed and nothing can fall back; `build` runs this check on each engine it
creates, and a region that fails it falls back to the host (or fails the build under `strict`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import numpy as np

from byoc.backend.arrays import aligned
from byoc.backend.engine import Engine
from byoc.backend.tolerance import Tolerance
from byoc.codegen_json import JsonRuntime
from byoc.codegen_json.symbolic_dims import shape_at
from byoc.errors import EngineError
from byoc.runtime_metadata.artifact_types import RegionArtifact, TensorSpec
from byoc.runtime_metadata.edge_trial import check_edge_values


def _mark(spec: TensorSpec, second: bool) -> np.generic:
    """One of two marks no engine writes by chance in both runs, in the output's dtype."""
    dtype = np.dtype(spec.dtype)
    if dtype == np.bool_:
        return dtype.type(second)
    if dtype.kind == "f":  # near the dtype's lowest, and its smallest normal number times 3
        info = np.finfo(dtype)
        return dtype.type(-0.9 * float(info.max) if second else 3 * float(info.tiny))
    return dtype.type(np.iinfo(dtype).min + (7 if second else 3))


def _filled(spec: TensorSpec, shape: tuple[int, ...], second: bool) -> np.ndarray:
    return aligned(np.full(shape, _mark(spec, second)))


def _trial(engine: object, artifact: RegionArtifact, inputs: list[np.ndarray], shapes: list[tuple[int, ...]]) -> list[list[np.ndarray]]:
    """Two runs on `inputs`, each output filled with one mark before the first and another
    before the second; on a thread of its own, so that what an engine keeps per thread for the
    trial's buffers (onnxruntime's IO bindings) goes with the thread, not into the model's runs."""
    runs: list[list[np.ndarray]] = []
    failure: list[BaseException] = []

    def trial() -> None:
        try:
            for second in (False, True):
                outputs = [_filled(spec, shape, second) for spec, shape in zip(artifact.outputs, shapes)]
                engine.run(inputs, outputs)
                runs.append(outputs)
        except BaseException as error:  # handed to the building thread
            failure.append(error)

    thread = threading.Thread(target=trial, name=f"byoc trial run of {artifact.symbol}")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return runs


def check_engine(engine: object, artifact: RegionArtifact, where: str, values: Mapping[str, int] | None = None,
                 constants: Mapping[str, np.ndarray] | None = None, tolerance: Tolerance | None = None) -> None:
    """Raise an EngineError naming `where` when `engine` is no Engine, fails to run on the
    region's shapes (a region with symbolic shapes: at the named dimensions' `values`), leaves
    part of an output unwritten, or (a JSON graph of element-wise ops, given its `constants` and
    the vendor's `tolerance`) differs from TVM's code for the region on edge values
    (`byoc.runtime_metadata.edge_trial`).

    The inputs are zeros, or ones where zeros fail: zeros are valid indices along any axis,
    ones valid divisors, and a region is very rarely both an index and a divisor of its
    inputs. Each output is filled with a different mark before each of two runs on the same
    inputs: an element that still holds the first mark after the first run and the second after
    the second was never written (a deterministic engine writes the same value both times,
    which cannot equal both marks). Buffers are 64-byte aligned, as the host's are.
    """
    if not isinstance(engine, Engine):
        raise EngineError(f"{where}: the vendor returned a {type(engine).__module__}.{type(engine).__qualname__}, "
                          "which is not an engine: it has no run(inputs, outputs) method")
    errors = []
    outputs = [shape_at(spec.shape, values or {}) for spec in artifact.outputs]
    for fill in (0, 1):
        inputs = [aligned(np.full(shape_at(spec.shape, values or {}), fill, np.dtype(spec.dtype))) for spec in artifact.inputs]
        try:
            runs = _trial(engine, artifact, inputs, outputs)
            break
        except Exception as error:
            errors.append(error)
    else:
        error = errors[0]
        raise EngineError(f"{where}: the engine failed a trial run on the region's shapes (inputs of zeros, then of ones): "
                          f"{type(error).__name__}: {error}") from error
    for index, (spec, first, second) in enumerate(zip(artifact.outputs, *runs)):
        unwritten = (first == _mark(spec, False)) & (second == _mark(spec, True))
        if unwritten.any():
            raise EngineError(f"{where}: the engine left {int(unwritten.sum())} of {unwritten.size} elements of output {index} "
                              f"{tuple(first.shape)} unwritten in a trial run: an engine writes every output in place")
    _check_run_new(engine, inputs, runs[1], where)
    if constants is not None and tolerance is not None and artifact.codegen == JsonRuntime.kind:
        check_edge_values(engine, artifact.payload, constants, [tuple(x.shape) for x in inputs], outputs, tolerance, where)


def _check_run_new(engine: object, inputs: list[np.ndarray], want: list[np.ndarray], where: str) -> None:
    """An engine's `run_new` (see byoc.backend.engine), where it has one, gives what `run` wrote
    on the same inputs: the runtime calls it instead of `run` for shapes met for the first time."""
    run_new = getattr(engine, "run_new", None)
    if run_new is None:
        return
    try:
        made = list(run_new(inputs))
    except Exception as error:
        raise EngineError(f"{where}: the engine's run_new failed a trial run on the region's shapes: {type(error).__name__}: "
                          f"{error}") from error
    described = [[(a.shape, str(a.dtype)) for a in arrays] for arrays in (made, want)]
    if described[0] != described[1]:
        raise EngineError(f"{where}: the engine's run_new gave {described[0]}, not the outputs run writes, {described[1]}")
    for index, (got, expected) in enumerate(zip(made, want)):
        scale = float(np.abs(expected).max()) if expected.size and expected.dtype.kind == "f" else 1.0
        if not np.allclose(got, expected, rtol=1e-5, atol=1e-6 * scale, equal_nan=True):
            raise EngineError(f"{where}: the engine's run_new gave other values than run for output {index} on the same inputs")
