"""What running the `reference` vendor's regions needs (see byoc.backend.runtime): each region is
compiled by TVM (byoc.codegen_json.tvm_engine), which needs its compiler; a compiled region is a
shared library that TVM's runtime loads alone, so an artifact with its engines embedded runs
where only the runtime is installed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tvm

from byoc.backend.runtime import VendorRuntime
from byoc.backend.settings import VendorSettings
from byoc.codegen_json import tvm_executable
from byoc.codegen_json.runtime import JsonRuntime
from byoc.codegen_json.tvm_executable import TvmEngine, TvmSettings


def build_engine(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], settings: VendorSettings) -> TvmEngine:
    # TVM's compiler: imported where an engine is built, never where the engines come embedded
    # and only TVM's runtime is installed.
    from byoc.codegen_json import tvm_engine

    return tvm_engine.build_engine(graph, constants, settings)


RUNTIME = VendorRuntime(
    name="reference",
    settings=TvmSettings(),
    codegen=JsonRuntime(
        build_engine=build_engine,
        version=f"tvm-{tvm.__version__}-{tvm_executable.TARGET}",
        save_engine=tvm_executable.save_engine,
        load_engine=tvm_executable.load_engine,
        environment=tvm_executable.environment,
        needs_compiler=True,
    ),
)
