"""Conversions between float32 and float16 on the host, in integer arithmetic.

The host library is compiled for any x86-64 CPU, without F16C, so LLVM converts each element by
a library call: 36 ms for a GPT-2's float16 logits (128 x 50257), more than the model takes on
dnnl. A float16 model computed in float32 (`byoc.frontend.float16`) casts its inputs and outputs
on the host, so these kernels do it with integer operations LLVM vectorizes (Fabian Giesen's
branch-free conversions, "float_to_half_fast3_rtne" and "half_to_float_fast5"): round to
nearest even, subnormals, infinities and NaN (quiet, sign kept) exactly as IEEE conversion does.
"""

from __future__ import annotations

from tvm import te, tirx

_U32 = "uint32"


def _u32(value: int):
    return tirx.const(value & 0xFFFFFFFF, _U32)  # negative offsets wrap, as uint32 addition does


def _float_to_half_bits(value):
    """The float16 bits (as uint32) of a float32 value, rounded to nearest even."""
    bits = tirx.reinterpret(_U32, value)
    sign = bits & _u32(0x80000000)
    magnitude = bits ^ sign
    # at or past 65520 (rounds past the largest float16): infinity, or a quiet NaN
    overflow = tirx.Select(magnitude > _u32(255 << 23), _u32(0x7E00), _u32(0x7C00))
    # below float16's smallest normal: let float addition round the bits into place
    denormal_magic = _u32(((127 - 15) + (23 - 10) + 1) << 23)
    small = tirx.reinterpret(_U32, tirx.reinterpret("float32", magnitude) + tirx.reinterpret("float32", denormal_magic)) - denormal_magic
    odd = (magnitude >> _u32(13)) & _u32(1)
    normal = (magnitude + _u32(((15 - 127) << 23) + 0xFFF) + odd) >> _u32(13)
    half = tirx.Select(magnitude >= _u32((127 + 16) << 23), overflow, tirx.Select(magnitude < _u32(113 << 23), small, normal))
    return half | (sign >> _u32(16))


def _half_to_float(value):
    """The float32 of a float16 value (every one exactly)."""
    bits = tirx.Cast(_U32, tirx.reinterpret("uint16", value))
    shifted = (bits & _u32(0x7FFF)) << _u32(13)
    exponent = shifted & _u32(0x7C00 << 13)
    scaled = shifted + _u32((127 - 15) << 23)
    special = scaled + _u32((128 - 16) << 23)  # infinity and NaN: the largest exponent
    magic = tirx.reinterpret("float32", _u32(113 << 23))
    subnormal = tirx.reinterpret(_U32, tirx.reinterpret("float32", scaled + _u32(1 << 23)) - magic)
    result = tirx.Select(exponent == _u32(0x7C00 << 13), special, tirx.Select(exponent == _u32(0), subnormal, scaled))
    return tirx.reinterpret("float32", result | ((bits & _u32(0x8000)) << _u32(16)))


def float_to_half(x: te.Tensor) -> te.Tensor:
    return te.compute(x.shape, lambda *i: tirx.reinterpret("float16", tirx.Cast("uint16", _float_to_half_bits(x(*i)))),
                      name="float_to_half")


def half_to_float(x: te.Tensor) -> te.Tensor:
    return te.compute(x.shape, lambda *i: _half_to_float(x(*i)), name="half_to_float")
