"""A small ONNX graph builder for the embedded model zoo.

Models are written in code with seeded random weights so that nothing is downloaded at run
time. Weights follow He initialisation and batch-norm statistics stay near identity, so that
activations keep a magnitude of about one through deep networks and numerical comparisons
against onnxruntime stay meaningful.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# onnxruntime 1.31 reads IR versions up to 13; onnx 1.23 writes 14 unless told otherwise.
ONNX_IR_VERSION = 8
DEFAULT_OPSET = 17
INPUT_RANGE_KEY = "byoc.input_range:"

_NP_TO_ONNX = {
    np.dtype("float32"): TensorProto.FLOAT,
    np.dtype("float16"): TensorProto.FLOAT16,
    np.dtype("int64"): TensorProto.INT64,
    np.dtype("int32"): TensorProto.INT32,
    np.dtype("int8"): TensorProto.INT8,
    np.dtype("uint8"): TensorProto.UINT8,
}


class OnnxGraphBuilder:
    """Builds an ONNX graph node by node, naming nodes after the scope they are created in."""

    def __init__(self, name: str, seed: int = 0) -> None:
        self.name = name
        self.rng = np.random.default_rng(seed)
        self._nodes: list[onnx.NodeProto] = []
        self._initializers: list[onnx.TensorProto] = []
        self._inputs: list[onnx.ValueInfoProto] = []
        self._outputs: list[onnx.ValueInfoProto] = []
        self._scope: list[str] = []
        self._used_names: dict[str, int] = {}
        self._metadata: dict[str, str] = {}

    # ----------------------------------------------------------------- naming
    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        self._scope.append(name)
        try:
            yield
        finally:
            self._scope.pop()

    def _unique(self, base: str) -> str:
        count = self._used_names.get(base, 0)
        self._used_names[base] = count + 1
        return base if count == 0 else f"{base}_{count}"

    def _scoped(self, leaf: str) -> str:
        return self._unique("/".join([*self._scope, leaf]))

    # ------------------------------------------------------------ graph parts
    def input(self, name: str, shape: Sequence[int], dtype: str = "float32", value_range: tuple[int, int] | None = None) -> str:
        """A graph input; integer inputs name the range of valid values (e.g. a vocabulary)."""
        elem = _NP_TO_ONNX[np.dtype(dtype)]
        self._inputs.append(helper.make_tensor_value_info(name, elem, list(shape)))
        if value_range is not None:
            self._metadata[f"{INPUT_RANGE_KEY}{name}"] = f"{value_range[0]},{value_range[1]}"
        return name

    def output(self, tensor: str, dtype: str = "float32", shape: Sequence | None = None) -> None:
        elem = _NP_TO_ONNX[np.dtype(dtype)]
        self._outputs.append(helper.make_tensor_value_info(tensor, elem, shape))

    def constant(self, leaf: str, array: np.ndarray) -> str:
        name = self._scoped(leaf)
        self._initializers.append(numpy_helper.from_array(np.require(array, requirements="C"), name))
        return name

    def op(self, op_type: str, inputs: Sequence[str], num_outputs: int = 1, **attrs) -> str | list[str]:
        node_name = self._scoped(op_type)
        outputs = [node_name if i == 0 else f"{node_name}:{i}" for i in range(num_outputs)]
        self._nodes.append(helper.make_node(op_type, list(inputs), outputs, name=node_name, **attrs))
        return outputs[0] if num_outputs == 1 else outputs

    def build(self, opset: int = DEFAULT_OPSET) -> onnx.ModelProto:
        graph = helper.make_graph(
            self._nodes, self.name, self._inputs, self._outputs, self._initializers
        )
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="byoc.models"
        )
        model.ir_version = ONNX_IR_VERSION
        helper.set_model_props(model, self._metadata)
        model = _with_output_shapes(model)
        onnx.checker.check_model(model)
        return model

    # -------------------------------------------------------- weight helpers
    def he_normal(self, shape: Sequence[int], fan_in: int) -> np.ndarray:
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))

    def small(self, shape: Sequence[int], scale: float = 0.05) -> np.ndarray:
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)

    # ------------------------------------------------------------ layer kits
    def conv(
        self,
        x: str,
        cin: int,
        cout: int,
        kernel: int | tuple[int, int],
        stride: int = 1,
        pad: int | tuple[int, int] | None = None,
        groups: int = 1,
        bias: bool = True,
    ) -> str:
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        if pad is None:
            pad = (kh // 2, kw // 2)
        ph, pw = (pad, pad) if isinstance(pad, int) else pad
        fan_in = cin // groups * kh * kw
        inputs = [x, self.constant("weight", self.he_normal((cout, cin // groups, kh, kw), fan_in))]
        if bias:
            inputs.append(self.constant("bias", self.small((cout,))))
        return self.op(
            "Conv",
            inputs,
            kernel_shape=[kh, kw],
            strides=[stride, stride],
            pads=[ph, pw, ph, pw],
            group=groups,
        )

    def batch_norm(self, x: str, channels: int, gamma_scale: float = 1.0) -> str:
        gamma = (self.rng.uniform(0.8, 1.2, channels) * gamma_scale).astype(np.float32)
        beta = self.small((channels,))
        mean = self.small((channels,))
        var = self.rng.uniform(0.8, 1.2, channels).astype(np.float32)
        params = [self.constant(n, a) for n, a in (("scale", gamma), ("B", beta), ("mean", mean), ("var", var))]
        return self.op("BatchNormalization", [x, *params], epsilon=1e-5)

    def relu(self, x: str) -> str:
        return self.op("Relu", [x])

    def relu6(self, x: str) -> str:
        low = self.constant("min", np.array(0.0, dtype=np.float32))
        high = self.constant("max", np.array(6.0, dtype=np.float32))
        return self.op("Clip", [x, low, high])

    def conv_bn(
        self,
        x: str,
        cin: int,
        cout: int,
        kernel: int | tuple[int, int],
        stride: int = 1,
        pad: int | tuple[int, int] | None = None,
        groups: int = 1,
        act: str | None = "relu",
        gamma_scale: float = 1.0,
    ) -> str:
        y = self.conv(x, cin, cout, kernel, stride, pad, groups, bias=False)
        y = self.batch_norm(y, cout, gamma_scale)
        if act == "relu":
            y = self.relu(y)
        elif act == "relu6":
            y = self.relu6(y)
        return y

    def max_pool(self, x: str, kernel: int, stride: int, pad: int = 0) -> str:
        return self.op(
            "MaxPool", [x], kernel_shape=[kernel, kernel], strides=[stride, stride], pads=[pad] * 4
        )

    def avg_pool(self, x: str, kernel: int, stride: int, pad: int = 0) -> str:
        return self.op(
            "AveragePool",
            [x],
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad] * 4,
            count_include_pad=0,
        )

    def gemm(self, x: str, fin: int, fout: int) -> str:
        weight = self.constant("weight", self.he_normal((fout, fin), fin))
        bias = self.constant("bias", self.small((fout,)))
        return self.op("Gemm", [x, weight, bias], transB=1)

    def classifier_head(self, x: str, channels: int, num_classes: int) -> str:
        with self.scope("head"):
            y = self.op("GlobalAveragePool", [x])
            y = self.op("Flatten", [y], axis=1)
            return self.gemm(y, channels, num_classes)

    def matmul(self, x: str, fin: int, fout: int, bias: bool = True) -> str:
        weight = self.constant("weight", self.he_normal((fin, fout), fin) * np.float32(0.7))
        y = self.op("MatMul", [x, weight])
        if bias:
            y = self.op("Add", [y, self.constant("bias", self.small((fout,)))])
        return y

    def shape_constant(self, leaf: str, values: Sequence[int]) -> str:
        return self.constant(leaf, np.array(values, dtype=np.int64))


def _with_output_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """Fill in output shapes the builder left open from ONNX shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model)
    known = {v.name: v for v in [*inferred.graph.value_info, *inferred.graph.output]}
    for output in model.graph.output:
        if not output.type.tensor_type.HasField("shape") and output.name in known:
            output.type.CopyFrom(known[output.name].type)
    return model


def model_input_shapes(model: onnx.ModelProto) -> dict[str, tuple[int, ...]]:
    """Static input shapes of a model, by input name (initializers excluded)."""
    initializers = {init.name for init in model.graph.initializer}
    shapes = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dims = value.type.tensor_type.shape.dim
        shapes[value.name] = tuple(d.dim_value for d in dims)
    return shapes
