"""Vendors with the faults a plugin can have, for the vendor kit to catch: each passes a naive
check and fails the kit's, with the reason.

- `hostly`: keeps regions without MACs on the host, so a kit that lets it choose sees almost no
  node case (the host would pass them for it);
- `stale`: its engine never writes its outputs;
- `narrow`: claims int64 arithmetic and computes it on values cut to int32;
- `naive`: computes tanh as (e^2x - 1) / (e^2x + 1), right on ordinary values and NaN past x = 44;
- `solo`: its engine refuses a call while another runs (the docs say engines take concurrent calls);
- `racy`: its engine computes into one scratch buffer for every call, so concurrent calls mix.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

import byoc
from byoc.backend.arrays import aligned
from byoc.codegen_json import JsonRuntime, tvm_engine

CLAIMED = ("relax.nn.relu", "relax.maximum", "relax.minimum", "relax.add")


def _json_vendor(name: str, build_engine) -> byoc.Backend:
    backend = byoc.Backend(name=name, codegen=JsonRuntime(build_engine=build_engine, version="broken"),
                           limits=byoc.Limits(dtypes=("float32", "int32", "int64")))
    backend.supports(*CLAIMED)
    return backend


class Stale:
    """Runs, but never writes its outputs."""

    def run(self, inputs, outputs):
        pass


class _Narrow:
    def __init__(self, graph, constants, options):
        self.inner = tvm_engine.build_engine(graph, constants, options)

    def run(self, inputs, outputs):
        cut = [aligned(a.astype(np.int32).astype(a.dtype)) if a.dtype == np.int64 else a for a in inputs]
        self.inner.run(cut, outputs)


class _Naive:
    """tanh by its textbook formula, which overflows to inf / inf."""

    def __init__(self, graph, constants, options):
        assert [node["op"] for node in graph["nodes"]] == ["relax.tanh"], graph["nodes"]

    def run(self, inputs, outputs):
        with np.errstate(over="ignore", invalid="ignore"):
            grown = np.exp(2 * inputs[0])
            outputs[0][...] = (grown - 1) / (grown + 1)


class _Solo:
    def __init__(self, graph, constants, options):
        self.inner = tvm_engine.build_engine(graph, constants, options)
        self.lock = threading.Lock()

    def run(self, inputs, outputs):
        if not self.lock.acquire(blocking=False):
            raise RuntimeError("this engine takes one call at a time")
        try:
            time.sleep(0.005)  # a device call's time: long enough for the next thread to arrive
            self.inner.run(inputs, outputs)
        finally:
            self.lock.release()


class _Racy:
    def __init__(self, graph, constants, options):
        self.inner = tvm_engine.build_engine(graph, constants, options)
        self.scratch = None

    def run(self, inputs, outputs):
        if self.scratch is None:
            self.scratch = [np.empty_like(o) for o in outputs]
        self.inner.run(inputs, self.scratch)
        time.sleep(0.005)  # another call overwrites the scratch meanwhile
        for out, value in zip(outputs, self.scratch):
            out[...] = value


def hostly() -> byoc.Backend:
    onnxruntime = byoc.get_backend("onnxruntime")
    return dataclasses.replace(onnxruntime, name="hostly", cost=byoc.CostRules(fallback_without_macs=True))


def stale() -> byoc.Backend:
    return _json_vendor("stale", lambda graph, constants, options: Stale())


def narrow() -> byoc.Backend:
    return _json_vendor("narrow", _Narrow)


def naive() -> byoc.Backend:
    backend = byoc.Backend(name="naive", codegen=JsonRuntime(build_engine=_Naive, version="broken"), limits=byoc.Limits(dtypes=("float32",)))
    backend.supports("relax.tanh")
    return backend


def solo() -> byoc.Backend:
    return _json_vendor("solo", _Solo)


def racy() -> byoc.Backend:
    return _json_vendor("racy", _Racy)


def all_broken() -> list[byoc.Backend]:
    return [hostly(), stale(), narrow(), naive(), solo(), racy()]
