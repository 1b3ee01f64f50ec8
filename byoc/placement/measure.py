"""Timing a candidate: an artifact run in a worker process, so that a kernel that crashes or hangs
costs one candidate, not the search.

`time_artifact` is what runs where the candidate is timed (this machine's worker, or a device
behind an RPC tracker, see `byoc.placement.remote`): it loads the artifact, feeds the inputs
(the values the model's own earlier segments made, so that data-dependent kernels such as
NonMaxSuppression see realistic data), warms up, then takes the median of repeated runs
(`byoc.timing`).
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np

from byoc.errors import one_line
from byoc.timing import machine_description, spread, time_blocks, time_runs

PROTOCOL = 2  # bump when what a measurement means changes: cached ones are then ignored (2: values that share a
# node name are fed apart; version 1 cached the failures of candidates fed the wrong one)
WARMUP_RUNS = 2
MIN_RUNS = 5
MAX_RUNS = 50
MIN_SECONDS = 0.25  # keep running (up to MAX_RUNS) until this much time is measured
IDLE_SECONDS = 0.05  # let the previous candidate's spinning threads (OpenMP, onnxruntime) go idle
CANDIDATE_TIMEOUT_S = 300.0


@dataclass
class Measurement:
    ms: float | None  # median per run; None when the candidate failed
    error: str = ""
    runs: int = 0


def time_artifact(artifact_path: str, inputs_path: str, outputs_path: str = "", timed: bool = True,
                  give_up_ms: float | None = None) -> dict:
    """Load and time one candidate artifact; with `outputs_path`, also save what it returns
    there (positionally, .npz). A candidate whose first run takes over `give_up_ms` cannot win:
    that run's time is returned rather than a median (an untuned host convolution can take
    seconds). Returns {"ms", "runs"}."""
    import tvm

    from byoc.runtime_metadata.model import load

    model = load(artifact_path, engines="eager")
    with np.load(inputs_path) as data:
        arrays = [data[f"arr_{i}"] for i in range(len(model.inputs))]
    if outputs_path:
        np.savez(outputs_path, *model.run(*arrays))
    if not timed:
        return {"ms": None, "runs": 0}
    vm = model.virtual_machine()
    tensors = [tvm.runtime.tensor(a) for a in arrays]
    time.sleep(IDLE_SECONDS)
    samples = time_runs(lambda: vm["main"](*tensors), MIN_RUNS, MAX_RUNS, MIN_SECONDS, warmup=WARMUP_RUNS,
                        give_up_s=give_up_ms / 1e3 if give_up_ms is not None else None)
    return {"ms": spread(samples).median_ms, "runs": len(samples)}


COMPARE_ROUNDS = 8
RUNS_PER_ROUND = 3


def compare_artifacts(artifact_paths: list[str], inputs_path: str) -> dict:
    """Time whole-model artifacts against each other in one process, in interleaved rounds
    (alternating order, idle time between systems), so that their ratios come from one run.
    Returns {"results": [{"ms", "runs"} or {"error"}, ...]} in the order given."""
    import tvm

    from byoc.runtime_metadata.model import load

    models = []  # each model stays alive while its virtual machine is timed
    runners: dict[int, Callable[[], object]] = {}
    results: list[dict] = [{} for _ in artifact_paths]
    for index, path in enumerate(artifact_paths):
        try:
            model = load(path, engines="eager")
            with np.load(inputs_path) as data:
                tensors = [tvm.runtime.tensor(data[f"arr_{i}"]) for i in range(len(model.inputs))]
            vm = model.virtual_machine()
            for _ in range(WARMUP_RUNS):
                vm["main"](*tensors)
            runners[index] = lambda vm=vm, tensors=tensors: vm["main"](*tensors)
            models.append(model)
        except Exception as error:  # reported per artifact; the others are still compared
            results[index] = {"error": one_line(error)}
    samples = time_blocks(runners, COMPARE_ROUNDS * RUNS_PER_ROUND, passes=COMPARE_ROUNDS, idle_s=IDLE_SECONDS)
    for index, values in samples.items():
        results[index] = {"ms": spread(values).median_ms, "runs": len(values)}
    return {"results": results}


def answer(request: dict) -> dict:
    """What a worker or an RPC server does with one request: a comparison or one timing, or
    the error's text (reported back as the candidate's reason; the worker stays up)."""
    try:
        if "artifact_paths" in request:
            return compare_artifacts(**request)
        return time_artifact(**request)
    except Exception as error:
        return {"error": one_line(error)}


def serve(connection: Connection) -> None:
    """The worker's loop: one request at a time, answered with a result or the error's text."""
    while True:
        try:
            request = connection.recv()
        except EOFError:
            return
        connection.send(answer(request))


def as_measurements(result: dict, count: int) -> list[Measurement]:
    """A comparison's answer as one measurement per artifact (the error for all when it failed)."""
    if "error" in result:
        return [Measurement(None, result["error"]) for _ in range(count)]
    return [Measurement(r["ms"], runs=r["runs"]) if "ms" in r else Measurement(None, r["error"]) for r in result["results"]]


class _Worker:
    """One worker process and our end of its socket pair."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen([sys.executable, "-m", "byoc.placement.worker", str(theirs.fileno())],
                                        pass_fds=[theirs.fileno()])
        theirs.close()
        self.connection = Connection(ours.detach())

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, wait_s: float = 0.0) -> None:
        """Close the connection (the worker then exits); kill it if it has not after `wait_s`."""
        self.connection.close()
        try:
            self.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class LocalMeasurer:
    """Times candidates in worker processes on this machine, one per pool, each started again
    after a crash.

    A worker is a fresh interpreter (`python -m byoc.placement.worker FD`) rather than a
    multiprocessing child: spawning would re-import the caller's main module, which a script
    without a `__main__` guard cannot survive, and forking a process whose OpenMP and TVM
    thread pools have run can deadlock. Each backend's candidates get a worker of their own
    (pool = backend name): in a shared worker, the thread pools the previous candidates left
    behind (TVM's, OpenMP's, onnxruntime's) competed with the next candidate's, and a ResNet-18
    block measured 32 ms instead of 0.8."""

    def __init__(self, timeout_s: float = CANDIDATE_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.workers: dict[str, _Worker] = {}

    @property
    def where(self) -> str:
        return "this machine"

    def machine(self) -> str:
        return machine_description()

    def measure(self, artifact_path: str, inputs_path: str, outputs_path: str = "", timed: bool = True,
                give_up_ms: float | None = None, pool: str = "mixed") -> Measurement:
        request = {"artifact_path": artifact_path, "inputs_path": inputs_path, "outputs_path": outputs_path, "timed": timed,
                   "give_up_ms": give_up_ms}
        result = self._request(request, pool)
        if "error" in result:
            return Measurement(None, result["error"])
        return Measurement(result["ms"], runs=result["runs"])

    def compare(self, artifact_paths: list[str], inputs_path: str) -> list[Measurement]:
        """Whole models timed against each other in one worker (see `compare_artifacts`)."""
        result = self._request({"artifact_paths": list(artifact_paths), "inputs_path": inputs_path}, "compare")
        return as_measurements(result, len(artifact_paths))

    def _request(self, request: dict, pool: str) -> dict:
        worker = self.workers.get(pool)
        if worker is None or not worker.alive():
            worker = self.workers[pool] = _Worker()
        try:
            worker.connection.send(request)
            if not worker.connection.poll(self.timeout_s):
                del self.workers[pool]
                worker.stop()
                return {"error": f"no result within {self.timeout_s:.0f} s: the worker was stopped"}
            return worker.connection.recv()
        except (EOFError, OSError):
            del self.workers[pool]
            worker.stop(wait_s=5)
            return {"error": f"the worker process crashed (exit code {worker.process.returncode})"}

    def close(self) -> None:
        for worker in self.workers.values():
            worker.stop(wait_s=10)
        self.workers.clear()
