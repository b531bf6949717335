"""Inputs for the tests: routing maps, rows with every bit pattern, and how to compare."""

from __future__ import annotations

import ml_dtypes
import numpy as np

from moe_numba import backends
from moe_numba.ops import ArrayMeta

HIDDEN_DTYPES = [
    ml_dtypes.bfloat16,
    np.float16,
    np.float32,
    ml_dtypes.float8_e4m3fn,
    ml_dtypes.float8_e5m2,
]
COMBINE_DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]
FLOAT8 = (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2))


def random_routing(
    rng, num_tokens, topk, num_experts, *, dtype=np.int32, bad=0.0, repeats=0.0, empty=0.25
):
    """A [T, K] routing map of distinct experts per token, with -1 slots.

    ``bad`` and ``repeats`` are the fractions of slots overwritten with ids outside
    [-1, E) and with an expert named by another slot of the same token.
    """
    routemap = np.full((num_tokens, topk), -1, dtype=np.int64)
    for t in range(num_tokens):
        used = min(topk, num_experts, int(rng.binomial(topk, 1.0 - empty)))
        slots = rng.choice(topk, used, replace=False)
        routemap[t, slots] = rng.choice(num_experts, used, replace=False)
    if bad:
        mask = rng.random(routemap.shape) < bad
        wrong = np.where(
            rng.random(routemap.shape) < 0.5,
            rng.integers(-50, -1, routemap.shape),
            rng.integers(num_experts, num_experts + 50, routemap.shape),
        )
        routemap[mask] = wrong[mask]
    if repeats and topk > 1:
        for t in np.flatnonzero(rng.random(num_tokens) < repeats):
            k_from, k_to = rng.choice(topk, 2, replace=False)
            routemap[t, k_to] = routemap[t, k_from]
    return routemap.astype(dtype)


def counts_of(routemap, num_experts):
    """Distinct tokens routed to each expert (valid ids only)."""
    counts = np.zeros(num_experts, dtype=np.int64)
    for row in routemap:
        ids = {int(i) for i in row if 0 <= i < num_experts}
        for e in ids:
            counts[e] += 1
    return counts


def random_bits(rng, shape, dtype):
    """An array of ``dtype`` whose elements are uniformly random bit patterns (NaNs too)."""
    dtype = np.dtype(dtype)
    raw = rng.integers(0, 256, size=(*shape, dtype.itemsize), dtype=np.uint8)
    return raw.view(dtype).reshape(shape)


SPECIAL_VALUES = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -3e-39, 65504.0, 7e4, 3.4e38]


def random_values(rng, shape, dtype, special=0.02):
    """Normal values of ``dtype`` with a sprinkle of zeros, infinities, NaNs, subnormals."""
    values = rng.standard_normal(shape).astype(np.float32) * np.float32(4)
    mask = rng.random(shape) < special
    picks = rng.choice(np.array(SPECIAL_VALUES, dtype=np.float32), size=shape)
    values[mask] = picks[mask]
    with np.errstate(over="ignore"):
        return values.astype(dtype)


def random_probs(rng, shape):
    return rng.random(shape, dtype=np.float32)


def assert_same_bits(actual, expected, what=""):
    """Equal dtype, shape and every byte."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    a = np.ascontiguousarray(actual).view(np.uint8)
    b = np.ascontiguousarray(expected).view(np.uint8)
    if not np.array_equal(a, b):
        bad = np.argwhere(actual.view(np.uint8) != expected.view(np.uint8)) if actual.ndim else []
        raise AssertionError(f"{what}: bits differ at {len(bad)} bytes, first {bad[:5].tolist()}")


def assert_close_combine(actual, expected, magnitude, steps, what=""):
    """For the simulator's unfused ``fma`` only: equal NaNs and infinities, finite values
    within ``steps + 2`` units in the last place (of the dtype) of ``magnitude``, the
    combine of the absolute values, which bounds every partial sum."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    a = actual.astype(np.float32)
    b = expected.astype(np.float32)
    assert (np.isnan(a) == np.isnan(b)).all(), f"{what}: NaN positions differ"
    finite = np.isfinite(a) & np.isfinite(b)
    infinite = np.isinf(b)
    assert (a[infinite] == b[infinite]).all(), f"{what}: infinities differ"
    scale = np.abs(np.asarray(magnitude).astype(np.float32)[finite])
    ulp = np.spacing(scale.astype(expected.dtype)).astype(np.float32)
    excess = np.abs(a[finite] - b[finite]) - (steps + 2) * ulp
    assert (excess <= 0).all(), f"{what}: beyond {steps + 2} ulp: {excess.max()}"


GARBAGE = 0xA5  # the byte that fills outputs before a backend runs


def garbage(shape, dtype):
    """An array whose every byte is GARBAGE: an element a backend forgets to write shows up."""
    out = np.empty(shape, dtype)
    out.view(np.uint8)[...] = GARBAGE
    return out


def bits(a):
    """The bytes of ``a`` (compare these, not values: NaN payloads and -0.0 count)."""
    return np.ascontiguousarray(a).view(np.uint8)


def metadata(arrays):
    """The contract's view of an op's NumPy arrays (what ``moe_numba._api`` hands it)."""
    return arrays._make(None if x is None else ArrayMeta(x.shape, x.dtype) for x in arrays)


def plan_of(op, arrays, capacities=None, **scalars):
    """The plan of a call of ``op`` (its declaration) on NumPy ``arrays``, with its
    ``scalars`` by name (the public defaults for the others) and, for a permute, its
    capacities: what every front hands a backend (:func:`moe_numba.backends.prepare`)."""
    return backends.prepare(op, arrays, op.scalars(**scalars), capacities)[1]
