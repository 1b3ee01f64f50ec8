"""The vendor integration checks: a model through partition, build, export and reload.

For one vendor and one model, `evaluate` partitions (calibrating vendors that quantize at
compile time on seeded inputs), builds, runs seeded inputs of the model's own distribution and
compares with float32 onnxruntime against the tolerance the vendor states in its spec.
`reload_in_fresh_process` exports the built models and runs them again in a new Python
process, which must give the same outputs: an artifact carries everything it needs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from byoc import models as zoo
from byoc.accuracy import AccuracyReport, measure_accuracy
from byoc.backend.registry import backend_origin, get_backend
from byoc.backend.tolerance import Tolerance
from byoc.flow import partition_for
from byoc.frontend import from_onnx
from byoc.models import exported, vision
from byoc.partition import PartitionReport
from byoc.processing.passes import needs_calibration
from byoc.runtime_metadata.build import build
from byoc.runtime_metadata.model import CompiledModel
from byoc.testing.onnx_models import light_model, light_model_names

LIGHT_PREFIX = "light_"
# Calibration and evaluation inputs come from one distribution but never share a seed.
EVALUATION_SEED = 1000


@dataclass(frozen=True)
class ModelCase:
    """A model to check: the zoo's (small or full size) or a light graph from onnx."""

    name: str
    load: Callable[[], onnx.ModelProto] = field(repr=False, compare=False)
    task: str


def model_case(name: str, small: bool = True) -> ModelCase:
    """A zoo model by name ("resnet18"), a light graph as "light_<name>", or an exported
    transformers architecture as "hf:<name>[:<size>]" (`byoc.models.exported`; tiny unless a
    size is named), or a vision model as "vision:<name>" (`byoc.models.vision`)."""
    if name.startswith(vision.PREFIX):
        model = vision.parse_spec(name)
        return ModelCase(name, lambda: onnx.load(vision.export(model)[0]), vision.task(model))
    if name.startswith(exported.SPEC_PREFIX):
        architecture, size = exported.parse_spec(name)
        return ModelCase(name, lambda: exported.export(architecture, size), "encoder")
    if name.startswith(LIGHT_PREFIX):
        light = name[len(LIGHT_PREFIX) :]
        if light not in light_model_names():
            raise ValueError(f"unknown light graph {name!r}; onnx ships: {', '.join(LIGHT_PREFIX + n for n in light_model_names())}")
        return ModelCase(name, lambda: light_model(light), "classifier")
    entry = zoo.describe(name)
    return ModelCase(name, lambda: zoo.get(name, small=small), entry.task)


def all_model_names() -> list[str]:
    return [*zoo.names(), *(LIGHT_PREFIX + n for n in light_model_names())]


def exported_model_names() -> list[str]:
    """The exported suite at its tiny size, as `model_case` names them."""
    return [exported.SPEC_PREFIX + name for name in exported.SUITE]


def sample_inputs(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    return zoo.sample_inputs(model, seed=seed)


@dataclass
class Evaluation:
    """What one vendor did with one model."""

    vendor: str
    model: str
    tolerance: Tolerance
    report: PartitionReport | None = None
    accuracy: AccuracyReport | None = None
    violation: str | None = None  # why the outputs are outside the vendor's tolerance
    error: str | None = None  # the pipeline raised: partition, build or run
    partition_s: float = 0.0
    build_s: float = 0.0
    compiled: CompiledModel | None = field(default=None, repr=False)
    model_proto: onnx.ModelProto | None = field(default=None, repr=False)
    samples: list[dict[str, np.ndarray]] = field(default_factory=list, repr=False)
    outputs: list[list[np.ndarray]] = field(default_factory=list, repr=False)
    reference: list[list[np.ndarray]] = field(default_factory=list, repr=False)

    @property
    def passed(self) -> bool:
        return self.error is None and self.violation is None


class _Recorded:
    """Outputs already computed for a list of samples, read back in order by `measure_accuracy`."""

    def __init__(self, runs: Sequence[Sequence[np.ndarray]]) -> None:
        self.runs = iter(runs)

    def run(self, **_inputs) -> list[np.ndarray]:
        return list(next(self.runs))


def onnxruntime_session(model: onnx.ModelProto, threads: int = 0) -> ort.InferenceSession:
    """The reference: onnxruntime on the CPU (`threads` 0: its default thread count)."""
    if model.ir_version > 10:  # onnxruntime reads IR versions up to 10
        capped = onnx.ModelProto()
        capped.CopyFrom(model)
        capped.ir_version = 10
        model = capped
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _detections_in_order(got_run: list[np.ndarray], want_run: list[np.ndarray]) -> list[np.ndarray]:
    """A detector's outputs (one row per detection in each: boxes, scores, labels), its rows put
    in onnxruntime's order, each matched to the nearest of onnxruntime's not yet matched: two
    detections whose scores differ by less than float32's rounding swap places between runs
    (RetinaNet's 0.7116419 and 0.71164095), and both orders are right. Unchanged where the
    counts differ."""
    counts = {len(a) for a in want_run if a.ndim >= 1}
    if len(counts) != 1 or any(g.shape != w.shape for g, w in zip(got_run, want_run)):
        return got_run
    n = counts.pop()
    got, want = (np.concatenate([np.asarray(a, np.float64).reshape(n, -1) for a in run], axis=1) for run in (got_run, want_run))
    distance = np.abs(want[:, None, :] - got[None, :, :]).max(axis=2)
    order, taken = [], np.zeros(n, dtype=bool)
    for row in distance:
        nearest = int(np.argmin(np.where(taken, np.inf, row)))
        taken[nearest] = True
        order.append(nearest)
    return [a[order] for a in got_run]


def tolerance_violation(tolerance: Tolerance, evaluation: Evaluation) -> str | None:
    """Why the evaluation's outputs break the tolerance, or None."""
    for got_run, want_run in zip(evaluation.outputs, evaluation.reference):
        if len(got_run) != len(want_run):
            return f"{len(got_run)} outputs, onnxruntime gives {len(want_run)}"
        for index, (got, want) in enumerate(zip(got_run, want_run)):
            reason = tolerance.elementwise_violation(got, want)
            if reason is not None:
                return f"output {index}: {reason}"
    accuracy = evaluation.accuracy
    if tolerance.relative_l2 is not None and accuracy.relative_l2 > tolerance.relative_l2:
        return f"relative L2 error {accuracy.relative_l2:.2%} over the bound of {tolerance.relative_l2:.0%}"
    if tolerance.top1 is not None and accuracy.top1_agreement is not None and accuracy.top1_agreement < tolerance.top1:
        return f"top-1 agreement {accuracy.top1_agreement:.0%} under the bound of {tolerance.top1:.0%}"
    return None


def evaluate(
    vendor: str,
    case: ModelCase,
    options: Mapping[str, Any] | None = None,
    samples: int = 2,
    calibration_samples: int = 8,
    model: onnx.ModelProto | None = None,
) -> Evaluation:
    """Partition `case` for `vendor`, build strictly (no region falls back), run `samples`
    seeded inputs and compare with onnxruntime against the vendor's tolerance. Errors are
    recorded, not raised."""
    backend = get_backend(vendor)
    result = Evaluation(vendor, case.name, backend.tolerance)
    try:
        model = result.model_proto = model if model is not None else case.load()
        options = dict(options or {})
        if needs_calibration(backend.processing) and "calibration" not in options:
            options["calibration"] = [sample_inputs(model, seed) for seed in range(calibration_samples)]
        start = time.perf_counter()
        partitioned = partition_for(from_onnx(model), vendor, **options)
        result.partition_s = time.perf_counter() - start
        start = time.perf_counter()
        # Strict: a region whose code generation or engine fails is the vendor's failure here,
        # not a quiet fall-back that lets the host pass the case.
        result.compiled = build(partitioned, strict=True)
        result.build_s = time.perf_counter() - start
        result.report = result.compiled.report()
        result.samples = [sample_inputs(model, EVALUATION_SEED + i) for i in range(samples)]
        session = onnxruntime_session(model)
        result.reference = [session.run(None, s) for s in result.samples]
        result.outputs = [result.compiled.run(**s) for s in result.samples]
        concurrent = concurrent_difference(result.compiled, result.samples, result.outputs)
        if concurrent is not None:
            result.error = concurrent
            return result
    except Exception as error:  # recorded: a vendor's failure on one model is one finding of many
        result.error = f"{type(error).__name__}: {error}"
        return result
    if case.task == "detector":  # its detections compared in either order of near-tied scores
        result.outputs = [_detections_in_order(list(got), list(want)) for got, want in zip(result.outputs, result.reference)]
    references = iter(result.reference)
    result.accuracy = measure_accuracy(_Recorded(result.outputs), lambda _inputs: next(references), result.samples)
    result.violation = tolerance_violation(backend.tolerance, result)
    return result


_RELOAD = """
import sys, numpy as np, byoc
directory, names = sys.argv[1], sys.argv[2:]
for name in names:
    model = byoc.load(f"{directory}/{name}.byoc")
    with np.load(f"{directory}/{name}.inputs.npz") as data:
        count = len({key.split("/")[0] for key in data.files})
        runs = [model.run(**{key.split("/", 1)[1]: data[key] for key in data.files if key.startswith(f"{i}/")}) for i in range(count)]
    np.savez(f"{directory}/{name}.outputs.npz", **{f"{i}/{j}": out for i, run in enumerate(runs) for j, out in enumerate(run)})
"""


def reload_skip_reason(vendor: str) -> str | None:
    """Why an artifact of `vendor` cannot load in another process, or None when it can."""
    origin = backend_origin(vendor)
    if origin.startswith("byoc (built-in)") or origin.startswith("plugin "):
        return None
    return f"vendor {vendor!r} is registered at run time ({origin}), not installed: another process cannot load its artifacts"


def reload_in_fresh_process(evaluations: Sequence[Evaluation],
                            directory: str | os.PathLike | None = None) -> dict[tuple[str, str], str | None]:
    """Export each evaluation's model, run it in one new Python process on the same inputs and
    compare with the outputs of this process. Returns, per (vendor, model), None when the
    outputs agree, or the difference."""
    runnable = [e for e in evaluations if e.compiled is not None and e.error is None]
    if not runnable:
        return {}
    if directory is not None:
        os.makedirs(directory, exist_ok=True)
    with tempfile.TemporaryDirectory() if directory is None else contextlib.nullcontext(os.fspath(directory)) as where:
        stems = {(e.vendor, e.model): f"{e.vendor}.{e.model}" for e in runnable}
        for evaluation in runnable:
            stem = stems[evaluation.vendor, evaluation.model]
            evaluation.compiled.export(os.path.join(where, f"{stem}.byoc"))
            arrays = {f"{i}/{name}": value for i, sample in enumerate(evaluation.samples) for name, value in sample.items()}
            np.savez(os.path.join(where, f"{stem}.inputs.npz"), **arrays)
        process = subprocess.run([sys.executable, "-c", _RELOAD, where, *stems.values()], capture_output=True, text=True,
                                 env=os.environ.copy())
        if process.returncode != 0:
            tail = process.stderr.strip().splitlines()[-1] if process.stderr.strip() else f"exit status {process.returncode}"
            return {key: f"the fresh process failed: {tail}" for key in stems}
        results: dict[tuple[str, str], str | None] = {}
        for key, stem in stems.items():
            evaluation = next(e for e in runnable if (e.vendor, e.model) == key)
            with np.load(os.path.join(where, f"{stem}.outputs.npz")) as data:
                results[key] = _difference(evaluation.outputs, data)
        return results


def _difference(outputs: list[list[np.ndarray]], data) -> str | None:
    for i, run in enumerate(outputs):
        for j, want in enumerate(run):
            problem = _output_difference(data[f"{i}/{j}"], want, "after reload")
            if problem is not None:
                return f"sample {i} output {j}: {problem}"
    return None


def _output_difference(got: np.ndarray, want: np.ndarray, when: str) -> str | None:
    """How `got` differs from `want` (the same run's output: only the order of sums may
    differ), or None."""
    got = np.asarray(got)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype}{got.shape} {when}, {want.dtype}{want.shape} before"
    scale = max(1.0, float(np.max(np.abs(want), initial=0.0))) if np.issubdtype(want.dtype, np.floating) else 1.0
    if not np.allclose(got, want, rtol=1e-5, atol=1e-6 * scale, equal_nan=True):
        return f"max difference {float(np.max(np.abs(got.astype(np.float64) - want))):.3g} {when}"
    return None


# The kit runs each model from this many threads at once, every sample in each thread: engines
# must allow concurrent calls (docs/vendors.md), and one that does not shows as an error or as
# outputs that differ from its runs one at a time.
CONCURRENT_THREADS = 4


def concurrent_difference(compiled: CompiledModel, samples: Sequence[dict[str, np.ndarray]],
                          outputs: Sequence[Sequence[np.ndarray]]) -> str | None:
    """Why `samples` run from several threads at once give other than `outputs` (their runs one
    at a time), or None where they agree."""
    results: dict[tuple[int, int], list] = {}
    errors: list[str] = []
    start = threading.Barrier(CONCURRENT_THREADS)

    def work(thread: int) -> None:
        try:
            start.wait()
            for step in range(len(samples)):
                index = (step + thread) % len(samples)  # each thread in its own order
                results[thread, index] = compiled.run(**samples[index])
        except Exception as error:  # recorded: the first one is the finding
            errors.append(f"{type(error).__name__}: {error}")

    threads = [threading.Thread(target=work, args=(t,), name=f"byoc-kit-{t}") for t in range(CONCURRENT_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    where = f"run from {CONCURRENT_THREADS} threads at once"
    if errors:
        return f"{where}, the model raised {errors[0]}"
    for (thread, index), got in sorted(results.items()):
        for j, (value, want) in enumerate(zip(got, outputs[index])):
            problem = _output_difference(value, want, f"in thread {thread}")
            if problem is not None:
                return f"{where}, sample {index} output {j} differs from its run alone: {problem}"
    return None
