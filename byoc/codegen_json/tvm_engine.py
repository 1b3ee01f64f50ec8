"""An engine that compiles a region's JSON graph with TVM itself (LLVM, untuned).

It lets partitioned modules run before a real vendor exists, and it is the reference that
tests compare partitioned and unpartitioned results with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import tvm
from tvm import relax

from byoc.backend.settings import VendorSettings
from byoc.codegen_json.to_relax import constants_as_inputs, graph_to_relax
from byoc.codegen_json.tvm_executable import DEFAULT_SETTINGS as DEFAULT_SETTINGS
from byoc.codegen_json.tvm_executable import TARGET as TARGET
from byoc.codegen_json.tvm_executable import TvmEngine as TvmEngine
from byoc.codegen_json.tvm_executable import TvmSettings as TvmSettings
from byoc.codegen_json.tvm_executable import constants_in_order
from byoc.codegen_json.tvm_executable import environment as environment
from byoc.codegen_json.tvm_executable import load_engine as load_engine
from byoc.codegen_json.tvm_executable import save_engine as save_engine


def build_engine(graph: Mapping[str, Any], constants: Mapping[str, np.ndarray], settings: VendorSettings) -> TvmEngine:
    """The region compiled by TVM: for the target `settings` name (TvmSettings), else LLVM for
    this CPU (a vendor that runs its regions through TVM with settings of its own)."""
    func = graph_to_relax(constants_as_inputs(graph), {})
    target = settings.target if isinstance(settings, TvmSettings) else TARGET
    executable = relax.build(tvm.IRModule({"main": func}), target=target)
    return TvmEngine(executable, constants_in_order(graph, constants))


