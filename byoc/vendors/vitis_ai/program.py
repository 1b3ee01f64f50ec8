"""The DPU program: tensors with fixed-point positions, and instructions with int8 weights and
int32 biases. `compile_program` lowers a quantized region (power-of-two scales) to it; the
bitstream module writes and reads it; the simulator runs it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

from byoc.errors import CodegenError
from byoc.processing.qkernels import QKernel, QWeights, TensorTable, quantized_kernels


class Op(IntEnum):
    CONV = 1
    DEPTHWISE = 2
    DENSE = 3
    MAXPOOL = 4
    AVGPOOL = 5
    ADD = 6
    CONCAT = 7
    RESHAPE = 8
    ACTIVATION = 9


class Act(IntEnum):
    NONE = 0
    RELU = 1
    RELU6 = 2


@dataclass
class Tensor:
    shape: tuple[int, ...]
    fix: int  # fixed-point position: value = int8 * 2**-fix


@dataclass
class Instruction:
    op: Op
    inputs: list[int]
    output: int
    params: list[int] = field(default_factory=list)
    weights: np.ndarray | None = None  # int8
    bias: np.ndarray | None = None  # int32
    name: str = ""


@dataclass
class Program:
    target: str
    tensors: list[Tensor]
    inputs: list[int]  # tensor per region input
    outputs: list[int]
    instructions: list[Instruction]


def fix_position(scale: float, what: str) -> int:
    fix = -math.log2(scale)
    if abs(fix - round(fix)) > 1e-6:
        raise CodegenError(f"{what}: scale {scale} is not a power of two; the DPU needs power-of-two quantization")
    return int(round(fix))


class _Compiler:
    def __init__(self, graph: dict[str, Any], constants: dict[str, np.ndarray], target: str) -> None:
        self.where = f"region {graph['symbol']} ({graph['backend']})"
        self.kernels, self.output_tensors = quantized_kernels(graph, constants)
        self.tensor = TensorTable(lambda q: Tensor(q.shape, fix_position(q.scale, f"{self.where}, tensor {q.id}")))
        self.tensors: list[Tensor] = self.tensor.items
        self.target = target

    def _activation(self, kernel: QKernel, out: Tensor) -> tuple[int, int]:
        if kernel.node("relax.nn.relu") is not None:
            return Act.RELU, 0
        clip = kernel.node("relax.clip")
        if clip is not None:
            return Act.RELU6, int(round(clip["args"][2]["prim"] * 2.0**out.fix))
        return Act.NONE, 0

    def _weighted(self, kernel: QKernel, root: dict, op: Op) -> Instruction:
        source = kernel.operand(root, 0)
        weights: QWeights = kernel.operand(root, 1)
        if not isinstance(weights, QWeights) or weights.scale.size != 1:
            raise CodegenError(f"{self.where}: node {root['name']!r} needs per-tensor int8 weights")
        fix_in = self.tensors[self.tensor(source)].fix
        fix_w = fix_position(float(weights.scale.reshape(-1)[0]), f"{self.where}, weights of {root['name']!r}")
        out = self.tensor(kernel.output)
        channels = weights.data.shape[0 if op != Op.DENSE else 1]
        bias = kernel.bias(self.where)
        bias = np.zeros(channels) if bias is None else np.broadcast_to(bias.reshape(-1), (channels,))
        act, act_param = self._activation(kernel, self.tensors[out])
        bias_int = np.round(bias * 2.0 ** (fix_in + fix_w)).astype(np.int64)
        shift = fix_in + fix_w - self.tensors[out].fix
        params = [shift, act, act_param]
        if op != Op.DENSE:
            attrs = root["attrs"]
            params += [*attrs["strides"], *attrs["padding"], *attrs["dilation"]]
        return Instruction(op, [self.tensor(source)], out, params, weights.data, np.clip(bias_int, -(2**31), 2**31 - 1).astype(np.int32), root["name"])

    def _instruction(self, kernel: QKernel) -> Instruction:
        root = kernel.nodes[0]
        op = root["op"]
        out = self.tensor(kernel.output)
        if op == "relax.nn.conv2d":
            depthwise = root["attrs"]["groups"] > 1
            return self._weighted(kernel, root, Op.DEPTHWISE if depthwise else Op.CONV)
        if op == "relax.matmul":
            return self._weighted(kernel, root, Op.DENSE)
        inputs = [self.tensor(q) for q in kernel.inputs()]
        if op in ("relax.nn.max_pool2d", "relax.nn.avg_pool2d"):
            attrs = root["attrs"]
            kind = Op.MAXPOOL if op == "relax.nn.max_pool2d" else Op.AVGPOOL
            window = [*attrs["pool_size"], *attrs["strides"], *attrs["padding"], int(attrs.get("count_include_pad", 0))]
            return Instruction(kind, inputs, out, window, name=root["name"])
        if op == "relax.mean":
            _, _, height, width = self.tensors[inputs[0]].shape
            return Instruction(Op.AVGPOOL, inputs, out, [height, width, 1, 1, 0, 0, 0, 0, 0], name=root["name"])
        if op == "relax.add":
            act, act_param = self._activation(kernel, self.tensors[out])
            return Instruction(Op.ADD, inputs, out, [act, act_param], name=root["name"])
        if op == "relax.concat":
            parts = [self.tensor(q) for q in kernel.operand(root, 0)]  # in order, repeats kept
            return Instruction(Op.CONCAT, parts, out, [root["attrs"]["axis"] % len(self.tensors[out].shape)], name=root["name"])
        if op == "relax.reshape":
            return Instruction(Op.RESHAPE, inputs, out, [], name=root["name"])
        if op in ("relax.nn.relu", "relax.clip"):
            act, act_param = self._activation(kernel, self.tensors[out])
            return Instruction(Op.ACTIVATION, inputs, out, [act, act_param], name=root["name"])
        raise CodegenError(f"{self.where}: the DPU has no instruction for {op} (node {root['name']!r})")

    def run(self) -> Program:
        instructions = [self._instruction(k) for k in self.kernels]
        outputs = [self.tensor(q) for q in self.output_tensors]
        return Program(self.target, self.tensors, self.tensor.region_inputs(), outputs, instructions)


def compile_program(graph: dict[str, Any], constants: dict[str, np.ndarray], target: str) -> Program:
    return _Compiler(graph, constants, target).run()
