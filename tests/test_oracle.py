"""The oracle's own arithmetic: fma and rounding, against exact rational arithmetic."""

from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest

from moe_numba import abi, oracle


def exact_fma_float32(x, y, z):
    """x*y+z in exact rationals, rounded to odd at about 50 bits (exact in float64), then
    rounded once to float32 by NumPy."""
    value = Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z))
    if value == 0:
        return np.float32(float(x) * float(y) + float(z))
    sign = -1 if value < 0 else 1
    value = abs(value)
    exponent = value.numerator.bit_length() - value.denominator.bit_length()
    scaled = value / Fraction(2) ** (exponent - 50)
    mantissa = scaled.numerator // scaled.denominator
    if mantissa * scaled.denominator != scaled.numerator:
        mantissa |= 1  # round to odd keeps the information for one final rounding
    return np.float32(np.float64(sign * mantissa) * 2.0 ** (exponent - 50))


def test_fma_is_correctly_rounded():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((2, 4000)).astype(np.float32)
    z = np.concatenate(
        [
            rng.standard_normal(2000).astype(np.float32),
            (
                -(x[2000:].astype(np.float64) * y[2000:]) * (1 + 1e-7 * rng.standard_normal(2000))
            ).astype(np.float32),  # near-cancellation, where one rounding matters
        ]
    )
    got = oracle.fma_float32(x, y, z)
    want = np.array(
        [exact_fma_float32(a, b, c) for a, b, c in zip(x, y, z, strict=True)], np.float32
    )
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    naive = (x * y + z).view(np.uint32)
    assert (naive != want.view(np.uint32)).any(), "the test must separate fma from mul+add"


def test_fma_special_values():
    inf, nan = np.float32(np.inf), np.float32(np.nan)
    got = oracle.fma_float32([inf, 1, 0, -0.0, 1], [1, nan, 5, 1, -1], [-inf, 0, -0.0, -0.0, 1])
    assert np.isnan(got[0]) and np.isnan(got[1])
    assert got[2] == 0 and not np.signbit(got[2])
    assert got[3] == 0 and np.signbit(got[3])
    assert got[4] == 0 and not np.signbit(got[4])


@pytest.mark.parametrize(
    "dtype, bits",
    [
        (np.float32, abi.CANONICAL_NAN_FLOAT32),
        (ml_dtypes.bfloat16, abi.CANONICAL_NAN_BFLOAT16),
        (np.float16, abi.CANONICAL_NAN_FLOAT16),
    ],
)
def test_round_to_makes_nan_canonical(dtype, bits):
    values = np.array([-np.nan, 1.5, np.inf, 70000.0], np.float32)
    values[0] = np.frombuffer(np.uint32(0xFFC12345).tobytes(), np.float32)[0]
    rounded = oracle.round_to(dtype, values)
    assert rounded.dtype == np.dtype(dtype)
    assert int(rounded.view(np.uint32 if dtype is np.float32 else np.uint16)[0]) == bits
    assert rounded[1] == 1.5 and rounded[2] == np.inf
