"""Vendors with the faults a plugin can have, for the vendor kit to catch: each passes a naive
check and fails the kit's, with the reason.

- `hostly`: keeps regions without MACs on the host, so a kit that lets it choose sees almost no
  node case (the host would pass them for it);
- `stale`: its engine never writes its outputs;
- `narrow`: claims int64 arithmetic and computes it on values cut to int32.
"""

from __future__ import annotations

import dataclasses

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


def hostly() -> byoc.Backend:
    onnxruntime = byoc.get_backend("onnxruntime")
    return dataclasses.replace(onnxruntime, name="hostly", cost=byoc.CostRules(fallback_without_macs=True))


def stale() -> byoc.Backend:
    return _json_vendor("stale", lambda graph, constants, options: Stale())


def narrow() -> byoc.Backend:
    return _json_vendor("narrow", _Narrow)


def all_broken() -> list[byoc.Backend]:
    return [hostly(), stale(), narrow()]
