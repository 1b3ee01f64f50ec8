"""The embedded model zoo: ONNX models built in code with seeded random weights.

`names()` lists the models, `get(name)` builds one at its published size and
`get(name, small=True)` a reduced configuration with the same structure, for tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from byoc.errors import UnknownModelError, did_you_mean
from byoc.models.bert import bert_encoder
from byoc.models.cnn import mobilenet_v2, resnet18, resnet50, vgg19
from byoc.models.graph_builder import INPUT_RANGE_KEY, model_input_shapes
from byoc.models.inception import inception_v3
from byoc.models.mlp import mlp
from byoc.models.ssd import ssd_detector

__all__ = ["ZooModel", "get", "names", "describe", "random_inputs", "sample_inputs", "model_input_shapes"]


@dataclass(frozen=True)
class ZooModel:
    name: str
    builder: Callable[..., onnx.ModelProto]
    task: str
    description: str
    small: dict = field(default_factory=dict)


_ZOO = {
    entry.name: entry
    for entry in [
        ZooModel("mlp", mlp, "classifier", "3 hidden layers, 256 features, 10 classes", {"features": 64, "hidden": (128, 64)}),
        ZooModel("resnet18", resnet18, "classifier", "ResNet-18, 224x224", {"image_size": 64}),
        ZooModel("resnet50", resnet50, "classifier", "ResNet-50, 224x224", {"image_size": 64}),
        ZooModel("mobilenet_v2", mobilenet_v2, "classifier", "MobileNetV2 1.0, 224x224", {"image_size": 64}),
        ZooModel("vgg19", vgg19, "classifier", "VGG-19, 224x224", {"image_size": 32}),
        ZooModel("inception_v3", inception_v3, "classifier", "Inception-v3, 299x299", {"image_size": 107}),
        ZooModel(
            "bert_encoder",
            bert_encoder,
            "encoder",
            "BERT-base-like encoder: 12 layers, hidden 768, 12 heads, sequence 128",
            {"layers": 2, "hidden": 128, "heads": 4, "intermediate": 512, "seq_len": 32, "vocab": 1000},
        ),
        ZooModel(
            "ssd_detector",
            ssd_detector,
            "detector",
            "SSD-like detector, 300x300, 21 classes, NonMaxSuppression post-processing",
            {"image_size": 96},
        ),
    ]
}


def names() -> list[str]:
    return list(_ZOO)


def describe(name: str) -> ZooModel:
    try:
        return _ZOO[name]
    except KeyError:
        raise UnknownModelError(f"unknown zoo model {name!r}{did_you_mean(name, _ZOO)}; the zoo has: {', '.join(_ZOO)}") from None


def get(name: str, small: bool = False, **overrides) -> onnx.ModelProto:
    """Build a zoo model; `small=True` keeps the structure and shrinks sizes for quick tests."""
    entry = describe(name)
    kwargs = {**(entry.small if small else {}), **overrides}
    return entry.builder(**kwargs)


def random_inputs(specs: Iterable[tuple[str, Sequence[int], str]], seed: int = 0,
                  ranges: Mapping[str, tuple[int, int]] | None = None) -> dict[str, np.ndarray]:
    """Seeded random inputs for (name, shape, dtype) specs: standard normal floats, integers in
    the input's range (default [0, 100))."""
    rng = np.random.default_rng(seed)
    inputs = {}
    for name, shape, dtype in specs:
        if np.issubdtype(np.dtype(dtype), np.integer):
            low, high = (ranges or {}).get(name, (0, 100))
            inputs[name] = rng.integers(low, high, size=tuple(shape)).astype(dtype)
        else:
            inputs[name] = rng.standard_normal(tuple(shape)).astype(dtype)
    return inputs


def input_ranges(model: onnx.ModelProto) -> dict[str, tuple[int, int]]:
    """The value range of each integer input: the one the model's metadata records (the zoo's
    and the exported suite's token ids), else the rows of the embedding tables it indexes (any
    file: token ids, BERT's two token types)."""
    recorded = {
        prop.key[len(INPUT_RANGE_KEY) :]: tuple(int(v) for v in prop.value.split(","))
        for prop in model.metadata_props
        if prop.key.startswith(INPUT_RANGE_KEY)
    }
    return {**table_ranges(model), **recorded}


_PASSES_INDICES = frozenset({"Cast", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten"})
# onnxruntime's fused EmbedLayerNormalization: ids, segment ids and position ids (inputs 0, 1, 8)
# index the word, segment and position tables (inputs 2, 4, 3)
_EMBEDDING_TABLES = {0: 2, 1: 4, 8: 3}


def _table_read(node: onnx.NodeProto, index: int) -> str | None:
    """The table that input `index` of `node` indexes, if it is an index."""
    if node.op_type == "Gather" and index == 1:
        return node.input[0]
    table = _EMBEDDING_TABLES.get(index) if node.op_type == "EmbedLayerNormalization" else None
    return node.input[table] if table is not None and table < len(node.input) else None


def table_ranges(model: onnx.ModelProto) -> dict[str, tuple[int, int]]:
    """[0, rows) for each integer input that indexes constant tables (Gather on an initializer,
    through casts and reshapes), rows the smallest table's along the gathered axis."""
    tables = {init.name: list(init.dims) for init in model.graph.initializer}
    readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in model.graph.node:
        for index, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, index))

    def rows(name: str, depth: int = 0) -> int | None:
        found = []
        for node, index in readers.get(name, []):
            table = _table_read(node, index)
            if table in tables:
                found.append(tables[table][next((a.i for a in node.attribute if a.name == "axis"), 0)])
            elif node.op_type in _PASSES_INDICES and index == 0 and depth < 8:
                found.append(rows(node.output[0], depth + 1))
        known = [r for r in found if r is not None]
        return min(known) if known else None

    integers = {onnx.TensorProto.INT32, onnx.TensorProto.INT64}
    ranges = {}
    for value in model.graph.input:
        if value.type.tensor_type.elem_type in integers and value.name not in tables:
            found = rows(value.name)
            if found:
                ranges[value.name] = (0, found)
    return ranges


def sample_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded random inputs that fit the model's input shapes, dtypes and value ranges."""
    ranges = input_ranges(model)
    initializers = {init.name for init in model.graph.initializer}
    specs = [
        (value.name, [d.dim_value for d in value.type.tensor_type.shape.dim],
         onnx.helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type).name)
        for value in model.graph.input
        if value.name not in initializers
    ]
    return random_inputs(specs, seed, ranges)
