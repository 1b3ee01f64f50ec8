"""Which ONNX graph inputs are run-time inputs, and which are constants.

ONNX files before IR version 4 (Caffe2 exports, older PyTorch exports) list every initializer
among the graph inputs. In ONNX, and in onnxruntime, such an input is a constant whose value
the caller may override; an input that no node reads is ignored. byoc compiles constants into
the model, so both kinds leave the input list here: an initializer's value is overridden at
import (`from_onnx(..., constants={name: value})`), which also binds any other input to a fixed
value, as static-shape compilers do for inputs that decide shapes.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from byoc.errors import ModelLoadError


def _declared(value: onnx.ValueInfoProto) -> tuple[np.dtype | None, list[int | None] | None]:
    tensor = value.type.tensor_type
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type) if tensor.elem_type else None
    shape = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim] if tensor.HasField("shape") else None
    return dtype, shape


def _constant_for(value: onnx.ValueInfoProto | None, name: str, given) -> np.ndarray:
    array = np.asarray(given)
    if value is None:
        return array
    dtype, shape = _declared(value)
    if dtype is not None and array.dtype != dtype:
        raise ModelLoadError(f"constant for input {name!r}: expected dtype {dtype}, got {array.dtype}")
    if shape is not None and (len(shape) != array.ndim or any(d is not None and d != s for d, s in zip(shape, array.shape))):
        shown = tuple("?" if d is None else d for d in shape)
        raise ModelLoadError(f"constant for input {name!r}: expected shape {shown}, got {array.shape}")
    return array


def bind_inputs(model: onnx.ModelProto, constants: Mapping[str, object] | None = None) -> onnx.ModelProto:
    """A copy of `model` whose graph inputs are exactly its run-time inputs.

    Inputs with an initializer become constants (`constants` may give them another value),
    inputs named in `constants` become initializers, and inputs that no node reads and that are
    not graph outputs are dropped.
    """
    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    graph = bound.graph
    declared = {value.name: value for value in graph.input}
    initializers = {init.name: init for init in graph.initializer}
    for name, given in (constants or {}).items():
        if name not in declared and name not in initializers:
            inputs = [v.name for v in graph.input if v.name not in initializers]
            raise ModelLoadError(f"constants given for {name!r}, which is neither an input nor an initializer; inputs: {inputs}")
        tensor = numpy_helper.from_array(np.require(_constant_for(declared.get(name), name, given), requirements="C"), name)
        if name in initializers:
            initializers[name].CopyFrom(tensor)
        else:
            graph.initializer.append(tensor)
            initializers[name] = graph.initializer[-1]
    read = {name for node in graph.node for name in node.input} | {name for node in graph.node for name in subgraph_reads(node)}
    outputs = {value.name for value in graph.output}
    runtime = [value for value in graph.input if value.name not in initializers and (value.name in read or value.name in outputs)]
    del graph.input[:]
    graph.input.extend(runtime)
    return bound


def subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Names read from the enclosing scope by the subgraphs of an If, Loop or Scan node."""
    names: set[str] = set()
    for attr in node.attribute:
        for graph in [attr.g] if attr.HasField("g") else list(attr.graphs):
            local = {v.name for v in graph.input} | {i.name for i in graph.initializer} | {o for n in graph.node for o in n.output}
            for inner in graph.node:
                names |= {name for name in inner.input if name and name not in local}
                names |= subgraph_reads(inner) - local
    return names
