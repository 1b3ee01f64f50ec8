"""The part of a model that runs after the compiled model: the nodes from where its shapes start
to depend on its data (see byoc.frontend.onnx.data_dependent), as an ONNX model onnxruntime runs
on the compiled model's outputs and the model's own inputs. Recorded on the imported module,
carried through partitioning and build, and kept in the artifact."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import tvm

TAIL_ATTR = "byoc.tail"
TAIL_INFO_ATTR = "byoc.tail_info"


@dataclass(frozen=True)
class ModelTail:
    """The ONNX model of the tail, the node it starts at and why, how many nodes it has, the
    tensors it reads (the model's inputs and the compiled model's outputs, by name) and the
    model's outputs it makes."""

    model: bytes
    first: str
    why: str
    nodes: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    def describe(self) -> str:
        return f"{self.nodes} node(s) from node {self.first!r} on run in onnxruntime after the compiled model: {self.why}"

    def info(self) -> dict:
        """Everything but the model, as JSON."""
        return {key: list(value) if isinstance(value, tuple) else value for key, value in asdict(self).items() if key != "model"}

    @classmethod
    def from_info(cls, model: bytes, info: Mapping) -> ModelTail:
        return cls(model, str(info["first"]), str(info["why"]), int(info["nodes"]), tuple(map(str, info["inputs"])),
                   tuple(map(str, info["outputs"])))


def with_tail(mod: tvm.IRModule, tail: ModelTail) -> tvm.IRModule:
    return mod.with_attr(TAIL_ATTR, tail.model).with_attr(TAIL_INFO_ATTR, json.dumps(tail.info()))


def tail_of(mod: tvm.IRModule) -> ModelTail | None:
    """The tail recorded on `mod`, or None."""
    if mod.attrs is None or TAIL_ATTR not in mod.attrs:
        return None
    return ModelTail.from_info(bytes(mod.attrs[TAIL_ATTR]), json.loads(str(mod.attrs[TAIL_INFO_ATTR])))
