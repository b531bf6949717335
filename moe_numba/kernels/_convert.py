"""Bit-level conversions between float32 and the 16-bit float formats, as device functions.

All narrowing conversions round to nearest even and are written with integer operations, so
the simulator runs exactly the code a GPU runs (only the float32 <-> uint32 reinterpretation
differs, see :mod:`._intrinsics`). NaN results are the canonical NaNs of
:mod:`moe_numba.abi`. Widening is exact: bfloat16 by a shift, float16 by
:func:`._intrinsics.f16_to_f32`.

Values travel as ``uint32`` holding the 16-bit pattern in the low half.
"""

from __future__ import annotations

import numpy as np

from .. import abi
from ._intrinsics import bits_from_f32, device, f32_from_bits

NAN_F32 = np.uint32(abi.CANONICAL_NAN_FLOAT32)
NAN_BF16 = np.uint32(abi.CANONICAL_NAN_BFLOAT16)
NAN_F16 = np.uint32(abi.CANONICAL_NAN_FLOAT16)


@device
def bf16_to_f32(h):
    """bfloat16 bits (low half of a uint32) -> float32, exact."""
    return f32_from_bits(np.uint32(h) << np.uint32(16))


@device
def f32_to_bf16(f):
    """float32 -> bfloat16 bits (round to nearest even; NaN -> canonical NaN)."""
    u = bits_from_f32(f)
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return NAN_BF16
    return (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)


@device
def f32_to_f16(f):
    """float32 -> float16 bits (round to nearest even, subnormals exact, overflow -> inf,
    NaN -> canonical NaN)."""
    u = bits_from_f32(f)
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    a = u & np.uint32(0x7FFFFFFF)
    if a > np.uint32(0x7F800000):
        return NAN_F16
    if a >= np.uint32(0x477FF000):  # >= 65520 rounds to infinity
        h = np.uint32(0x7C00)
    elif a >= np.uint32(0x38800000):  # normal float16
        h = (a - np.uint32(0x38000000)) >> np.uint32(13)
        rem = a & np.uint32(0x1FFF)
        if rem > np.uint32(0x1000) or (rem == np.uint32(0x1000) and (h & np.uint32(1)) != 0):
            h += np.uint32(1)
    elif a > np.uint32(0x33000000):  # subnormal float16 (2**-25 itself ties to 0)
        shift = np.uint32(126) - (a >> np.uint32(23))  # 14 .. 24
        m = (a & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
        h = m >> shift
        rem = m & ((np.uint32(1) << shift) - np.uint32(1))
        half = np.uint32(1) << (shift - np.uint32(1))
        if rem > half or (rem == half and (h & np.uint32(1)) != 0):
            h += np.uint32(1)
    else:
        h = np.uint32(0)
    return sign | h


@device
def f32_canonical_bits(f):
    """float32 -> its bits, NaN -> canonical NaN."""
    if f != f:
        return NAN_F32
    return bits_from_f32(f)
