"""The Ethos-U region binary: Vela's register command streams and encoded weights, plus the
int8 program the reference executor runs.

    payload := u64 header length | header (JSON: accelerator, estimate, tensors, inputs, outputs,
               operations with their parameters and array slots, segment lengths) | data
    data    := the arrays (weights, scales, biases, multipliers, shifts), the command-stream
               segments (32-bit words) and Vela's encoded weights, at the header's offsets
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from byoc.vendors.ethos_u.program import EOp, EProgram, ETensor

VERSION = 1
_ARRAYS = ("weights", "weight_scales", "bias", "multipliers", "shifts")


class _Data:
    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.size = 0

    def add(self, data: bytes) -> list[int]:
        padding = -self.size % 16
        self.chunks.append(bytes(padding) + data)
        self.size += padding
        offset = self.size
        self.size += len(data)
        return [offset, len(data)]

    def array(self, array: np.ndarray) -> dict[str, Any]:
        offset, length = self.add(np.require(array, requirements="C").tobytes())
        return {"offset": offset, "length": length, "shape": list(array.shape), "dtype": str(array.dtype)}


@dataclass
class Lowered:
    segments: list[list[int]]  # command stream words per segment of consecutive NPU operations
    weights: bytes
    sram_bytes: int
    estimate: dict = field(default_factory=dict)


def encode(program: EProgram, lowered: Lowered) -> bytes:
    data = _Data()
    ops = []
    for op in program.ops:
        entry = {"kind": op.kind, "inputs": op.inputs, "output": op.output, "name": op.name, "params": op.params}
        entry["arrays"] = {key: data.array(getattr(op, key)) for key in _ARRAYS if getattr(op, key) is not None}
        ops.append(entry)
    header = {
        "version": VERSION,
        "accelerator": program.accelerator,
        "estimate": lowered.estimate,
        "tensors": [{"shape": list(t.shape), "scale": t.scale, "zero_point": t.zero_point} for t in program.tensors],
        "inputs": program.inputs,
        "outputs": program.outputs,
        "ops": ops,
        "segments": [data.add(np.asarray(words, np.uint32).tobytes()) for words in lowered.segments],
        "vela_weights": data.add(lowered.weights),
        "sram_bytes": lowered.sram_bytes,
    }
    encoded = json.dumps(header, separators=(",", ":")).encode()
    return struct.pack("<Q", len(encoded)) + encoded + b"".join(data.chunks)


def decode(payload: bytes) -> tuple[EProgram, dict[str, Any]]:
    """The program and the header (command streams, estimate) of a payload; ValueError, KeyError
    or struct.error when it is damaged."""
    (length,) = struct.unpack_from("<Q", payload, 0)
    header = json.loads(payload[8 : 8 + length])
    if header.get("version") != VERSION:
        raise ValueError(f"Ethos-U payload version {header.get('version')}; this runtime reads {VERSION}")
    data = payload[8 + length :]

    def array(slot: dict[str, Any]) -> np.ndarray:
        if slot["offset"] + slot["length"] > len(data):
            raise ValueError("an array lies outside the payload")
        return np.frombuffer(data, dtype=slot["dtype"], count=int(np.prod(slot["shape"])), offset=slot["offset"]).reshape(slot["shape"])

    tensors = [ETensor(tuple(t["shape"]), t["scale"], t["zero_point"]) for t in header["tensors"]]
    ops = [EOp(o["kind"], o["inputs"], o["output"], o["name"], o["params"], **{k: array(v) for k, v in o["arrays"].items()}) for o in header["ops"]]
    header["command_streams"] = [np.frombuffer(data, np.uint32, count=n // 4, offset=o) for o, n in header["segments"]]
    return EProgram(header["accelerator"], tensors, header["inputs"], header["outputs"], ops), header
