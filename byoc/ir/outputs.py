"""The model's own names for its outputs (an ONNX graph's output names, a PyTorch module's
output keys), kept on the module from import to the artifact, so a compiled model's outputs are
named as the model names them and not by position alone; and for its inputs where the importer
renamed them (TVM makes `past_key_values.0.key` and `input.1` identifiers: `past_key_values_0_key`,
`input_1`), so that a compiled model takes its inputs by the names in the file."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import tvm

OUTPUT_NAMES_ATTR = "byoc.output_names"
INPUT_NAMES_ATTR = "byoc.input_names"  # {the importer's name: the model's}, for renamed inputs only


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


def with_input_names(mod: tvm.IRModule, renamed: Mapping[str, str]) -> tvm.IRModule:
    return mod.with_attr(INPUT_NAMES_ATTR, json.dumps(dict(renamed))) if renamed else mod


def input_name(mod: tvm.IRModule, param: str) -> str:
    """The model's own name of the input the importer named `param`."""
    text = mod.attrs.get(INPUT_NAMES_ATTR) if mod.attrs is not None else None
    return json.loads(str(text)).get(param, param) if text is not None else param
