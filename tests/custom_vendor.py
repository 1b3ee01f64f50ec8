"""A custom-format vendor for tests: the region's graph and weights packed into its own binary
layout, and executed by the reference (TVM) engine after unpacking."""

from __future__ import annotations

import io
import json
import struct
from dataclasses import dataclass

import numpy as np

import byoc
from byoc.codegen_json import tvm_engine
from byoc.custom_formats import CustomFormat

_LENGTH = struct.Struct("<Q")


def serialize(graph, constants, options) -> bytes:
    text = json.dumps(graph).encode()
    weights = io.BytesIO()
    np.savez(weights, **constants)
    return _LENGTH.pack(len(text)) + text + weights.getvalue()


def deserialize(payload: bytes, options) -> tvm_engine.TvmEngine:
    (length,) = _LENGTH.unpack_from(payload)
    graph = json.loads(payload[_LENGTH.size : _LENGTH.size + length])
    with np.load(io.BytesIO(payload[_LENGTH.size + length :])) as weights:
        constants = {name: weights[name] for name in weights.files}
    return tvm_engine.build_engine(graph, constants, {})


@dataclass(frozen=True)
class BlobbySettings(byoc.VendorSettings):
    config: str = byoc.setting("blobby-v1", "the Blobby this machine has", applies=(byoc.PARTITION, byoc.BUILD), hardware=True)


def make_custom_backend(name: str = "blobby", config: str = "blobby-v1") -> byoc.Backend:
    fmt = CustomFormat(name="blobby", version=2, serialize=serialize, deserialize=deserialize)
    backend = byoc.Backend(name=name, codegen=fmt, settings=BlobbySettings(config))
    backend.supports("relax.matmul", "relax.add", "relax.nn.relu", "relax.nn.softmax", "relax.nn.conv2d", "relax.nn.max_pool2d")
    return backend
