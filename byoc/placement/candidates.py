"""Timing candidates for measured placement: each candidate module is built for its backend
(or left to the host), timed by a measurer in a worker process or on an RPC device, and its time
kept in the measurement cache; the intermediate values the candidates are fed are made here
too, by running the segments that produce them."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import tvm

from byoc.backend.spec import Backend
from byoc.errors import ByocError, one_line
from byoc.partition.group import HOST
from byoc.partition.module_report import report
from byoc.partition.pipeline import partition_graph
from byoc.placement.cache import MeasurementCache, candidate_key, content_hash
from byoc.placement.measure import Measurement
from byoc.processing.passes import needs_calibration
from byoc.progress import Progress
from byoc.runtime_metadata.build import build, region_functions
from byoc.runtime_metadata.calibration import calibrate

GIVE_UP_FACTOR = 10.0  # a candidate this many times slower than the fastest so far gets one run
BUDGET_SPENT = "not measured: the search budget"


class NotTaken(Exception):
    """The backend's own cost rules send the whole candidate back to the host."""


@dataclass
class Candidate:
    key: str
    ms: float | None
    note: str = ""


class Search:
    def __init__(self, backends: Sequence[Backend], measurer, cache: MeasurementCache,
                 budget_s: float, cost_options: Mapping, progress: Progress | None) -> None:
        self.backends = list(backends)
        self.by_name = {b.name: b for b in self.backends}
        self.measurer = measurer
        self.cache = cache
        self.deadline = time.perf_counter() + budget_s
        self.budget_s = budget_s
        self.cost_options = dict(cost_options)
        self.progress = progress
        self.machine = measurer.machine()
        self.workdir = tempfile.TemporaryDirectory(prefix="byoc-placement-")
        self.measured = self.cached = 0
        self.values: dict[str, np.ndarray] = {}
        self.hashes: dict[int, str] = {}
        self.producers: dict[str, tuple] = {}  # value name -> (the extracted segment making it, its takers)
        self.modules: list[tvm.IRModule] = []

    def step(self, what: str) -> None:
        if self.progress is not None:
            self.progress.step(what)

    def advance(self, what: str) -> None:
        if self.progress is not None:
            self.progress.advance(what)

    def time(self, what: str, mod: tvm.IRModule, backend: str, input_names: Sequence[str],
             output_names: Sequence[str] = (), extra_key: str = "", give_up_ms: float | None = None) -> Candidate:
        """`candidate` for a backend by name (HOST: the module as it is, on the host), shown
        as a step of the progress bar."""
        self.step(what)
        found = self.candidate(mod, self.by_name.get(backend), input_names, output_names, extra_key, give_up_ms)
        self.advance(what)
        return found

    def compare(self, modules: Mapping[str, tvm.IRModule], input_names: Sequence[str]) -> dict[str, float]:
        """Whole partitioned models timed against each other in one worker, in interleaved
        rounds (or all read from the cache); {label: ms} for those that built and ran."""
        if self.progress is not None:
            self.progress.step("end to end, against each other")
        keys = {label: candidate_key(content_hash(mod), None, self.machine, "compared") for label, mod in modules.items()}
        entries = {label: self.cache.get(key) for label, key in keys.items()}
        if all(entry is not None for entry in entries.values()):
            self.cached += len(entries)
            timed = {label: entry["ms"] for label, entry in entries.items() if entry["ms"] is not None}
        else:
            paths = {}
            for label, mod in modules.items():
                try:
                    paths[label] = self._artifact(mod, None, {})[0]
                except Exception:  # a placement that does not build is not compared (its regions fell back)
                    continue
            results = self.measurer.compare(list(paths.values()), self._save_inputs(input_names))
            timed = {}
            for label, result in zip(paths, results):
                self.measured += 1
                self.cache.put(keys[label], {"ms": result.ms, "runs": result.runs, "note": result.error})
                if result.ms is not None:
                    timed[label] = result.ms
        if self.progress is not None:
            self.progress.advance("end to end, against each other")
        return timed

    # ------------------------------------------------------------ one candidate
    def _build(self, key: str, mod: tvm.IRModule, backend: Backend | None, input_names: Sequence[str]):
        """(artifact path, estimate) or the skipped `Candidate` with the reason."""
        try:
            return self._artifact(mod, backend, {n: self.values[n] for n in input_names})
        except NotTaken as error:
            return Candidate(key, None, str(error))
        except ByocError as error:
            return Candidate(key, None, f"build failed: {str(error).splitlines()[0]}")
        except Exception as error:  # a vendor's code generator can raise anything: the candidate is skipped
            return Candidate(key, None, f"build failed: {one_line(error)}")

    def _failed(self, candidate: Candidate) -> Candidate:
        """A candidate that did not build, was not taken or failed when run fails the same way
        next time: the cache keeps the reason, so a warm search needs no values for it. A lost
        connection or a worker that timed out may not: those are not kept."""
        if not candidate.note.startswith(("failed when run: RPC:", "failed when run: no result within")):
            self.cache.put(candidate.key, {"ms": None, "note": candidate.note, "where": self.measurer.where})
        return candidate

    def _load_outputs(self, path: str, names: Sequence[str]) -> None:
        with np.load(path) as data:
            for i, name in enumerate(names):
                self.values[name] = data[f"arr_{i}"]

    def _ensure_values(self, names: Sequence[str]) -> str:
        """Make the values `names` by running the segments that produce them (untimed: their
        times came from the cache); returns why that failed, or ""."""
        for name in names:
            if name in self.values:
                continue
            producer = self.producers.get(name)
            if producer is None:
                return f"nothing makes {name}"
            piece, takers = producer
            failed = self._ensure_values(piece.inputs)
            if failed:
                return failed
            for taker in takers:
                built = self._build("", piece.mod, self.by_name.get(taker), piece.inputs)
                if isinstance(built, Candidate):
                    continue
                path = built[0]
                result = self.measurer.measure(path, self._save_inputs(piece.inputs), path + ".out.npz", False, None, taker)
                if not result.error:
                    self._load_outputs(path + ".out.npz", piece.outputs)
                    break
            if name not in self.values:
                return f"every candidate that makes {name} failed"
        return ""

    def _artifact(self, mod: tvm.IRModule, backend: Backend | None, inputs: dict[str, np.ndarray]) -> tuple[str, float | None]:
        """Build `mod` for `backend` (all of it on the host when None); (artifact path, the
        vendor's own estimate in ms when it is a simulated accelerator)."""
        if backend is not None:
            mod = partition_graph(mod, [backend], **self.cost_options)
            summary = report(mod)
            if not summary.regions:
                why = summary.host_ops[0].reasons[-1] if summary.host_ops else "no region"
                raise NotTaken(f"{backend.name} makes no region of it: {why}")
            if needs_calibration(backend.processing):
                mod = calibrate(mod, backend, [inputs])
        # strict: a code generator that fails must skip the candidate, not time the host instead
        model = build(mod, strict=True, backends=self.by_name)
        estimates = [a.info.get("ms_at_clock") for a in model.artifacts if a.info]
        estimate = sum(estimates) if estimates and all(e is not None for e in estimates) else None
        fd, path = tempfile.mkstemp(suffix=".byoc", dir=self.workdir.name)
        os.close(fd)
        model.export(path)
        return path, estimate

    def _save_inputs(self, names: Sequence[str]) -> str:
        fd, path = tempfile.mkstemp(suffix=".npz", dir=self.workdir.name)
        os.close(fd)
        np.savez(path, *[self.values[n] for n in names])
        return path

    def candidate(self, mod: tvm.IRModule, backend: Backend | None, input_names: Sequence[str],
                  output_names: Sequence[str] = (), extra_key: str = "", give_up_ms: float | None = None) -> Candidate:
        content = self.hashes.get(id(mod))
        if content is None:  # one hash per module, not per backend (hashing reads every constant)
            content = self.hashes[id(mod)] = content_hash(mod)
            self.modules.append(mod)  # keeps the id unique while the search runs
        key = candidate_key(content, backend, self.machine, extra_key, self.cost_options)
        entry = self.cache.get(key)
        if entry is not None:
            self.cached += 1
            return Candidate(key, entry["ms"], entry.get("note", ""))
        if time.perf_counter() > self.deadline:
            return Candidate(key, None, f"{BUDGET_SPENT} of {self.budget_s:.0f} s was spent")
        failed = self._ensure_values(input_names)
        if failed:
            return Candidate(key, None, f"no input values for it: {failed}")
        built = self._build(key, mod, backend, input_names)
        if isinstance(built, Candidate):
            return self._failed(built)
        path, estimate = built
        wants_outputs = any(n not in self.values for n in output_names)
        outputs_path = path + ".out.npz" if wants_outputs else ""
        # A candidate that mixes backends (a switch probe, a whole placement) runs in the mixed pool.
        pool = backend.name if backend is not None else ("mixed" if region_functions(mod) else HOST)
        result = self.measurer.measure(path, self._save_inputs(input_names), outputs_path, estimate is None, give_up_ms, pool)
        if outputs_path and not result.error:
            self._load_outputs(outputs_path, output_names)
        if estimate is not None:
            result = Measurement(estimate, "")
            note = "the simulator's cost model estimate"
        elif give_up_ms is not None and result.runs == 1:
            note = f"one run: over {GIVE_UP_FACTOR:.0f}x the fastest backend's time"
        else:
            note = ""
        if result.ms is None:
            return self._failed(Candidate(key, None, f"failed when run: {result.error}"))
        self.measured += 1
        self.cache.put(key, {"ms": result.ms, "runs": result.runs, "note": note, "where": self.measurer.where})
        return Candidate(key, result.ms, note)
