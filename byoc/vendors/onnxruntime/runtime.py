"""What running the `onnxruntime` vendor's regions needs (see byoc.backend.runtime): an inference
session per region, made from the region's ONNX model.

The ONNX model is translated from the region's JSON graph (byoc.codegen_json.to_onnx), which
reads byoc's IR and so needs TVM's compiler. An artifact built with its engines embedded carries
each region's ONNX model instead, and runs where only TVM's runtime is installed (byoc deploy
embeds them). Engines are not kept in the disk cache: a session is made from the model as fast
as from a cached copy, which would hold the weights again at every build.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnxruntime as ort

from byoc.backend.runtime import VendorRuntime
from byoc.codegen_json.runtime import JsonRuntime
from byoc.vendors.onnxruntime.engine import OnnxRuntimeSettings, SessionEngine


def build_engine(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], settings: OnnxRuntimeSettings) -> SessionEngine:
    # The translation reads byoc's IR: imported where an engine is built, never where the engines
    # come embedded and only TVM's runtime is installed.
    from byoc.vendors.onnxruntime.translation import region_model

    return SessionEngine(region_model(graph, constants), settings)


def load_engine(saved: bytes, graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], settings: OnnxRuntimeSettings) -> SessionEngine:
    return SessionEngine(saved, settings)


RUNTIME = VendorRuntime(
    name="onnxruntime",
    codegen=JsonRuntime(build_engine=build_engine, version=f"onnxruntime-{ort.__version__}", save_engine=lambda engine: engine.model,
                        load_engine=load_engine, environment=lambda: {"onnxruntime": ort.__version__}, needs_compiler=True,
                        cache_engines=False),
    settings=OnnxRuntimeSettings(),
)
