"""Models byoc did not write: the real-network graphs the `onnx` package ships.

The "light" graphs (AlexNet, DenseNet-121, Inception v1/v2, ResNet-50, ShuffleNet, SqueezeNet,
VGG-19, ZFNet-512) are classic Caffe2 exports at ONNX IR version 3 whose weights were replaced by
`ConstantOfShape` nodes that fill every weight with 0.02, to keep the package small. With
every weight equal, most computations are degenerate (every channel alike), so a comparison
would prove little: `light_model` gives each weight seeded random values and stores them as
initializers listed among the graph inputs, as IR version 3 files do.

Random weights of a fixed scale are not enough either: through fifty layers activations grow
or vanish, and the final softmax is one-hot (ResNet-50) or flat (Inception v1), where any two
implementations agree and top-1 agreement is noise. Weights are therefore scaled layer by
layer so that each layer's output has unit variance on a seeded input, and batch-norm
statistics are taken from the data, as layer-sequential unit-variance initialisation (LSUV,
Mishkin and Matas 2016) does. A trained network has the same property.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from byoc.errors import UnknownModelError

LIGHT_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
_FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16)


def light_model_names() -> list[str]:
    """The light graphs the installed `onnx` package ships, by short name ("resnet50")."""
    names = (f[len("light_") : -len(".onnx")] for f in os.listdir(LIGHT_DIR) if f.startswith("light_") and f.endswith(".onnx"))
    return sorted(names)


def light_model(name: str, seed: int = 0) -> onnx.ModelProto:
    """A light graph with seeded random weights (see the module documentation)."""
    path = os.path.join(LIGHT_DIR, f"light_{name}.onnx")
    if not os.path.exists(path):
        raise UnknownModelError(f"unknown light model {name!r}; the onnx package ships: {', '.join(light_model_names())}")
    return normalize_activations(randomize_weights(onnx.load(path), seed), seed)


def _weight(shape: tuple[int, ...], uses: list[tuple[str, int, onnx.NodeProto]], rng: np.random.Generator) -> np.ndarray:
    """Random values that keep activations in a sensible range for how the tensor is used."""
    op, index, node = uses[0] if uses else ("", -1, None)
    if op == "BatchNormalization" and index in (1, 4) or op == "Mul":  # scales and variances: positive, near 1
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    if op == "BatchNormalization" or (op in ("Conv", "Gemm", "ConvTranspose") and index == 2) or op in ("Add", "Sum", "Sub"):
        return rng.standard_normal(shape, np.float32) * np.float32(0.1)
    if len(shape) >= 2:
        if op == "Gemm":
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            fan_in = shape[1] if (index == 1 and trans_b) or (index == 0) else shape[0]
        elif op == "MatMul":
            fan_in = shape[0] if index == 1 else shape[-1]
        else:
            fan_in = int(np.prod(shape[1:]))
        return rng.standard_normal(shape, np.float32) * np.float32(np.sqrt(2.0 / max(fan_in, 1)))
    return rng.standard_normal(shape, np.float32) * np.float32(0.1)


def randomize_weights(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy of `model` whose float weights are seeded random values.

    Float initializers are redrawn, and every `ConstantOfShape` with a constant shape becomes an
    initializer of random values. Redrawn weights are listed among the graph inputs when the
    model's IR version is below 4, as the files of that era do.
    """
    result = onnx.ModelProto()
    result.CopyFrom(model)
    graph = result.graph
    rng = np.random.default_rng(seed)
    uses: dict[str, list[tuple[str, int, onnx.NodeProto]]] = defaultdict(list)
    for node in graph.node:
        for index, name in enumerate(node.input):
            uses[name].append((node.op_type, index, node))
    initializers = {init.name: init for init in graph.initializer}
    weights: list[onnx.TensorProto] = []
    kept = []
    for node in graph.node:
        shape_init = initializers.get(node.input[0]) if node.op_type == "ConstantOfShape" and node.input else None
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        if shape_init is None or (value is not None and value.data_type not in _FLOAT_TYPES):
            kept.append(node)
            continue
        shape = tuple(int(d) for d in numpy_helper.to_array(shape_init))
        dtype = onnx.helper.tensor_dtype_to_np_dtype(value.data_type) if value is not None else np.float32
        weights.append(numpy_helper.from_array(_weight(shape, uses[node.output[0]], rng).astype(dtype), node.output[0]))
    for init in graph.initializer:
        if init.data_type in _FLOAT_TYPES and init.name in uses:
            array = numpy_helper.to_array(init)
            weights.append(numpy_helper.from_array(_weight(array.shape, uses[init.name], rng).astype(array.dtype), init.name))
    redrawn = {w.name for w in weights}
    still_read = {name for node in kept for name in node.input}
    remaining = [init for init in graph.initializer if init.name not in redrawn and (init.name in still_read or init.name not in uses)]
    del graph.node[:]
    graph.node.extend(kept)
    del graph.initializer[:]
    graph.initializer.extend([*remaining, *weights])
    dropped = set(initializers) - {init.name for init in remaining} - redrawn
    listed = [value for value in graph.input if value.name not in dropped]
    if result.ir_version < 4:
        known = {value.name for value in listed}
        listed += [onnx.helper.make_tensor_value_info(w.name, w.data_type, list(w.dims)) for w in weights if w.name not in known]
    del graph.input[:]
    graph.input.extend(listed)
    return result


_SCALED_OPS = {"Conv": 1, "ConvTranspose": 1, "Gemm": 1, "MatMul": 1}


def normalize_activations(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy of `model` whose weight layers give unit-variance outputs and whose batch norms
    normalise, on one seeded standard-normal input (see the module documentation).

    One onnxruntime session runs the model with every weight fed as an input, so that each
    layer is measured with the corrections of the layers before it, without a new session per
    layer; onnxruntime runs only the nodes the requested output needs.
    """
    import onnxruntime as ort

    from byoc.models import random_inputs

    graph = model.graph
    weights = {init.name: numpy_helper.to_array(init) for init in graph.initializer if init.data_type in _FLOAT_TYPES}
    runner = _without_initializers(model, weights)
    listed = {v.name for v in runner.graph.input}
    runner.graph.input.extend(onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                              for n, a in weights.items() if n not in listed)
    inferred = onnx.shape_inference.infer_shapes(runner)
    types = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]}
    producers = {out: node for node in graph.node for out in node.output}

    def source(name: str) -> str:  # a weight seen through reshapes (Caffe2 reshapes FC weights)
        node = producers.get(name)
        while node is not None and node.op_type in ("Reshape", "Transpose", "Flatten", "Identity"):
            name, node = node.input[0], producers.get(node.input[0])
        return name

    probes = []  # (node, the value to measure)
    for node in graph.node:
        if node.op_type in _SCALED_OPS and len(node.input) > 1 and source(node.input[1]) in weights and node.output[0] in types:
            probes.append((node, node.output[0]))
        elif node.op_type == "BatchNormalization" and all(n in weights for n in node.input[3:5]) and node.input[0] in types:
            probes.append((node, node.input[0]))
    if not probes:
        return model
    del runner.graph.output[:]
    runner.graph.output.extend(types[name] for name in dict.fromkeys(name for _, name in probes))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # feeds stay feeds
    session = ort.InferenceSession(runner.SerializeToString(), options, providers=["CPUExecutionProvider"])
    data_inputs = [v for v in graph.input if v.name not in weights and v.name not in {i.name for i in graph.initializer}]
    feeds = random_inputs([(v.name, [d.dim_value for d in v.type.tensor_type.shape.dim],
                            onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)) for v in data_inputs], seed)
    for node, name in probes:
        value = session.run([name], {**feeds, **weights})[0].astype(np.float64)
        if node.op_type == "BatchNormalization":
            axes = tuple(a for a in range(value.ndim) if a != 1)
            weights[node.input[3]] = value.mean(axis=axes).astype(weights[node.input[3]].dtype)
            weights[node.input[4]] = value.var(axis=axes).astype(weights[node.input[4]].dtype) + 1e-3
            continue
        spread = float(value.std())
        if spread > 0:
            for operand in map(source, node.input[1:3]):
                if operand in weights:
                    weights[operand] = (weights[operand] / spread).astype(weights[operand].dtype)
    result = _without_initializers(model, weights)
    result.graph.initializer.extend(numpy_helper.from_array(weights[init.name], init.name)
                                    for init in graph.initializer if init.name in weights)
    return result


def _without_initializers(model: onnx.ModelProto, dropped: Mapping[str, object]) -> onnx.ModelProto:
    """A copy of `model` without the initializers named in `dropped`, made without copying their
    data (a copy of VGG-19's model proto alone moves half a gigabyte)."""
    graph = model.graph
    kept = [init for init in graph.initializer if init.name not in dropped]
    copy = onnx.helper.make_graph(graph.node, graph.name, graph.input, graph.output, kept, value_info=graph.value_info)
    result = onnx.helper.make_model(copy, opset_imports=model.opset_import, ir_version=min(model.ir_version, 10))
    return result
