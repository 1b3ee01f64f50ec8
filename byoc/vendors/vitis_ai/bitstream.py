"""The DPU program as bytes: a little-endian instruction stream followed by the weight and bias
data it points into.

    program   := "DPUX" u16 version | str target | u16 #tensors tensor* | u16 #in u16* | u16 #out u16*
                 | u16 #instructions instruction* | data
    tensor    := u8 rank u32[rank] i8 fix
    instr     := u8 opcode u8 #in u16[#in] u16 out u8 #params i32[#params]
                 | array weights | array bias | str name
    array     := u8 rank u32[rank] u64 offset (into data; rank 0 = absent)
"""

from __future__ import annotations

import io
import struct

import numpy as np

from byoc.vendors.vitis_ai.program import Instruction, Op, Program, Tensor

MAGIC = b"DPUX"
VERSION = 1


class _Writer:
    def __init__(self) -> None:
        self.head = io.BytesIO()
        self.data = io.BytesIO()

    def pack(self, fmt: str, *values) -> None:
        self.head.write(struct.pack("<" + fmt, *values))

    def string(self, text: str) -> None:
        encoded = text.encode()[:255]
        self.pack("B", len(encoded))
        self.head.write(encoded)

    def array(self, array: np.ndarray | None) -> None:
        if array is None:
            self.pack("B", 0)
            return
        self.pack("B", array.ndim)
        self.pack(f"{array.ndim}I", *array.shape)
        self.pack("Q", self.data.tell())
        self.data.write(np.require(array, requirements="C").tobytes())


def encode(program: Program) -> bytes:
    w = _Writer()
    w.head.write(MAGIC)
    w.pack("H", VERSION)
    w.string(program.target)
    w.pack("H", len(program.tensors))
    for tensor in program.tensors:
        w.pack("B", len(tensor.shape))
        w.pack(f"{len(tensor.shape)}I", *tensor.shape)
        w.pack("b", tensor.fix)
    for ids in (program.inputs, program.outputs):
        w.pack("H", len(ids))
        w.pack(f"{len(ids)}H", *ids)
    w.pack("H", len(program.instructions))
    for instruction in program.instructions:
        w.pack("BB", int(instruction.op), len(instruction.inputs))
        w.pack(f"{len(instruction.inputs)}H", *instruction.inputs)
        w.pack("HB", instruction.output, len(instruction.params))
        w.pack(f"{len(instruction.params)}i", *instruction.params)
        w.array(instruction.weights)
        w.array(instruction.bias)
        w.string(instruction.name)
    head = w.head.getvalue()
    return struct.pack("<Q", len(head)) + head + w.data.getvalue()


class _Reader:
    def __init__(self, head: bytes, data: bytes) -> None:
        self.head = head
        self.offset = 0
        self.data = data

    def unpack(self, fmt: str):
        values = struct.unpack_from("<" + fmt, self.head, self.offset)
        self.offset += struct.calcsize("<" + fmt)
        return values

    def string(self) -> str:
        (length,) = self.unpack("B")
        text = self.head[self.offset : self.offset + length].decode()
        self.offset += length
        return text

    def array(self, dtype) -> np.ndarray | None:
        (rank,) = self.unpack("B")
        if rank == 0:
            return None
        shape = self.unpack(f"{rank}I")
        (offset,) = self.unpack("Q")
        count = int(np.prod(shape))
        return np.frombuffer(self.data, dtype=dtype, count=count, offset=offset).reshape(shape)


def decode(payload: bytes) -> Program:
    """The program in `payload`; struct.error or ValueError when it is damaged."""
    (length,) = struct.unpack_from("<Q", payload, 0)
    head, data = payload[8 : 8 + length], payload[8 + length :]
    r = _Reader(head, data)
    if head[:4] != MAGIC:
        raise ValueError("not a DPU program")
    r.offset = 4
    (version,) = r.unpack("H")
    if version != VERSION:
        raise ValueError(f"DPU program version {version}; this simulator reads {VERSION}")
    target = r.string()
    (count,) = r.unpack("H")
    tensors = []
    for _ in range(count):
        (rank,) = r.unpack("B")
        shape = r.unpack(f"{rank}I")
        (fix,) = r.unpack("b")
        tensors.append(Tensor(tuple(shape), fix))
    inputs, outputs = [], []
    for ids in (inputs, outputs):
        (count,) = r.unpack("H")
        ids.extend(r.unpack(f"{count}H"))
    (count,) = r.unpack("H")
    instructions = []
    for _ in range(count):
        opcode, n_in = r.unpack("BB")
        ins = list(r.unpack(f"{n_in}H"))
        out, n_params = r.unpack("HB")
        params = list(r.unpack(f"{n_params}i"))
        weights, bias = r.array(np.int8), r.array(np.int32)
        instructions.append(Instruction(Op(opcode), ins, out, params, weights, bias, r.string()))
    return Program(target, tensors, list(inputs), list(outputs), instructions)
