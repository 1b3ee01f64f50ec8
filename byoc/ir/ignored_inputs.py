"""Inputs a model declares and never reads, kept by name from import to the artifact.

onnxruntime takes a value for every input a file declares, read or not, and serving code feeds
what the tokenizer gives (`token_type_ids` to a model whose graph no longer reads it). byoc
drops such an input at import (there is nothing to compile for it), and `run` takes a value
for it by name and ignores it, as onnxruntime does, instead of calling it unknown.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import tvm

IGNORED_INPUTS_ATTR = "byoc.ignored_inputs"


def with_ignored_inputs(mod: tvm.IRModule, names: Sequence[str]) -> tvm.IRModule:
    return mod.with_attr(IGNORED_INPUTS_ATTR, json.dumps(list(names))) if names else mod


def ignored_inputs(mod: tvm.IRModule) -> list[str]:
    text = mod.attrs.get(IGNORED_INPUTS_ATTR) if mod.attrs is not None else None
    return json.loads(str(text)) if text is not None else []
