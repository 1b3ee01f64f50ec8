"""The model's own names for its outputs (an ONNX graph's output names, a PyTorch module's
output keys), kept on the module from import to the artifact, so a compiled model's outputs are
named as the model names them and not by position alone."""

from __future__ import annotations

import json
from collections.abc import Sequence

import tvm

OUTPUT_NAMES_ATTR = "byoc.output_names"


def with_output_names(mod: tvm.IRModule, names: Sequence[str]) -> tvm.IRModule:
    return mod.with_attr(OUTPUT_NAMES_ATTR, json.dumps(list(names))) if names else mod


def output_names(mod: tvm.IRModule, count: int) -> list[str]:
    """The names of `mod`'s `count` outputs: the model's own where it recorded one for each
    (and they are distinct), else `output<position>`."""
    text = mod.attrs.get(OUTPUT_NAMES_ATTR) if mod.attrs is not None else None
    names = json.loads(str(text)) if text is not None else []
    if len(names) != count or len(set(names)) != count or not all(names):
        return [f"output{position}" for position in range(count)]
    return names
