"""The CPU backend's unpermute through its real glue (``moe_numba._cpu``), bit for bit
against the oracle, and the combine's float conversions over every bit pattern.

As in ``test_cpu_backend.py``: plans come from the contract, outputs from an allocator that
fills them with garbage; ``moe_cpu.unpermute`` is called directly for its own errors.
"""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import moe_cpu
from _cases import bits, garbage, plan_of
from moe_cpu import _unpermute
from moe_numba import abi, backends, oracle
from moe_numba.ops import UNPERMUTE, UnpermuteArrays

DATA_TYPES = {
    np.dtype(np.float32): (abi.DATA_FLOAT32, np.float32),
    np.dtype(ml_dtypes.bfloat16): (abi.DATA_BFLOAT16, np.uint16),
    np.dtype(np.float16): (abi.DATA_FLOAT16, np.uint16),
}
HYPOTHESIS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def default_threads():
    yield
    moe_cpu.set_num_threads(None)


# -------------------------------------------------------------------------------- unpermute


def cpu_unpermute(rows, rowmap, routemap, probs, weighted, mix_precision):
    """``_cpu.unpermute`` on a plan made by the contract, into garbage-filled outputs."""
    arrays = UnpermuteArrays(rows, rowmap, routemap, probs)
    plan = plan_of(
        UNPERMUTE,
        arrays,
        total_zipped_tokens=rowmap.shape[0],
        num_experts=rowmap.shape[1],
        using_mix_precision=mix_precision,
        using_weighted_combine=weighted,
    )
    return backends.cpu_backend().unpermute(plan, arrays, garbage)


def check_unpermute(rows, rowmap, routemap, probs, weighted, mix_precision):
    T, E = rowmap.shape
    with np.errstate(all="ignore"):  # the oracle's float64 work on NaN/inf inputs
        expected, expected_status = oracle.unpermute(
            rows, rowmap, routemap, probs, T, E, mix_precision, weighted
        )
    got, status = cpu_unpermute(rows, rowmap, routemap, probs, weighted, mix_precision)
    np.testing.assert_array_equal(status, expected_status)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_array_equal(bits(g), bits(e))
    return expected_status


SPECIAL_BITS = {
    np.dtype(np.float32): [
        0x00000000,
        0x80000000,
        0x7F800000,
        0xFF800000,
        0x7FC00000,
        0xFFC00001,
        0x7F800001,
        0x00000001,
        0x807FFFFF,
        0x00800000,
        0x7F7FFFFF,
        0xFF7FFFFF,
        0x3F800000,
    ],
    np.dtype(ml_dtypes.bfloat16): [
        0x0000,
        0x8000,
        0x7F80,
        0xFF80,
        0x7FC0,
        0xFFC1,
        0x7F81,
        0x0001,
        0x807F,
        0x0080,
        0x7F7F,
        0xFF7F,
        0x3F80,
    ],
    np.dtype(np.float16): [
        0x0000,
        0x8000,
        0x7C00,
        0xFC00,
        0x7E00,
        0xFE01,
        0x7C01,
        0x0001,
        0x83FF,
        0x0400,
        0x7BFF,
        0xFBFF,
        0x3C00,
    ],
}


def random_values(rng, shape, dtype, special=0.1):
    """Values over a wide range of magnitudes, with NaNs, infs, zeros and subnormals."""
    dtype = np.dtype(dtype)
    finfo = ml_dtypes.finfo(dtype) if dtype == ml_dtypes.bfloat16 else np.finfo(dtype)
    log_max = np.log2(float(finfo.max))
    magnitude = np.exp2(rng.uniform(float(np.log2(finfo.smallest_subnormal)), log_max, shape))
    values = (magnitude * rng.choice([-1.0, 1.0], shape)).astype(dtype)
    small = rng.random(shape) < 0.5  # plenty of ordinary values, whose sums round
    values[small] = rng.standard_normal(int(small.sum())).astype(dtype)
    uint = np.uint32 if dtype.itemsize == 4 else np.uint16
    pick = rng.random(shape) < special
    specials = np.array(SPECIAL_BITS[dtype], uint)
    values.view(uint)[pick] = rng.choice(specials, int(pick.sum()))
    return values


@st.composite
def unpermute_cases(draw):
    T = draw(st.integers(0, 24))
    K = draw(st.integers(1, 6))
    E = draw(st.integers(1, 9))
    R = draw(st.integers(0, 30))
    H = draw(st.integers(1, 9))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dtype = np.dtype(draw(st.sampled_from(list(DATA_TYPES))))
    rowmap = rng.integers(-1, max(R, 1), (T, E)).astype(np.int32)
    rowmap[rng.random((T, E)) < 0.4] = -1
    if draw(st.booleans()):  # out-of-range rows
        bad = rng.random((T, E)) < 0.1
        rowmap[bad] = rng.choice([-2, R, R + 5, -(2**31), 2**31 - 1], int(bad.sum()))
    routemap = rng.integers(-1, E, (T, K))
    if draw(st.booleans()):  # out-of-range ids
        bad = rng.random((T, K)) < 0.1
        routemap[bad] = rng.choice([-2, E, E + 3], int(bad.sum()))
    routemap = routemap.astype(draw(st.sampled_from([np.int32, np.int64])))
    scale = draw(st.sampled_from([1.0, 1e-3, 1e3]))  # drive sums to overflow or underflow
    with np.errstate(all="ignore"):
        probs = random_values(rng, R, np.float32, special=0.05) * np.float32(scale)
    return dict(
        rows=random_values(rng, (R, H), dtype),
        rowmap=rowmap,
        routemap=routemap,
        probs=probs,
        weighted=draw(st.booleans()),
        mix_precision=draw(st.booleans()),
    )


@HYPOTHESIS
@given(unpermute_cases())
def test_unpermute_random(case):
    check_unpermute(**case)


@pytest.mark.parametrize("mix_precision", [True, False])
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("dtype", list(DATA_TYPES))
def test_unpermute_dtypes(dtype, weighted, mix_precision):
    """Every variant; H spans several combine blocks plus a ragged tail; many rows per token."""
    rng = np.random.default_rng(5)
    T, E, K, R, H = 6, 40, 40, 80, 1300
    routemap = np.stack([rng.permutation(E) for _ in range(T)])[:, :K].astype(np.int32)
    rowmap = np.full((T, E), -1, np.int32)
    rowmap[:, :] = rng.integers(0, R, (T, E))
    rowmap[rng.random((T, E)) < 0.3] = -1
    rowmap[2] = -1  # a token with no rows
    status = check_unpermute(
        random_values(rng, (R, H), dtype, special=0.002),
        rowmap,
        routemap,
        random_values(rng, R, np.float32, special=0.0),
        weighted,
        mix_precision,
    )
    assert (status == -1).all()


def test_unpermute_status_words():
    rows = np.ones((4, 2), np.float32)
    rowmap = np.array([[0, -1, 1], [7, 2, -3], [3, -5, -1]], np.int32)
    routemap = np.array([[0, 1], [2, 5], [-4, 0]], np.int64)
    status = check_unpermute(rows, rowmap, routemap, np.ones(4, np.float32), True, True)
    assert list(status) == [3, 5, 3, 7]


@pytest.mark.parametrize("dtype", list(DATA_TYPES))
def test_unpermute_empty_and_degenerate(dtype):
    rng = np.random.default_rng(6)
    for T, E, K, R, H in [(0, 3, 2, 4, 5), (3, 2, 4, 0, 3), (4, 1, 3, 2, 1), (3, 3, 1, 5, 7)]:
        rowmap = rng.integers(-1, max(R, 1), (T, E)).astype(np.int32)
        routemap = rng.integers(-1, E, (T, K)).astype(np.int32)
        for weighted in (True, False):
            check_unpermute(
                random_values(rng, (R, H), dtype),
                rowmap,
                routemap,
                rng.random(R, dtype=np.float32),
                weighted,
                False,
            )


def test_unpermute_threads_identical():
    rng = np.random.default_rng(7)
    T, E, K, R, H = 700, 16, 6, 2000, 96
    rowmap = rng.integers(-1, R, (T, E)).astype(np.int32)
    rowmap[rng.random((T, E)) < 0.6] = -1
    rowmap[650, 3] = R + 1
    routemap = rng.integers(-1, E, (T, K)).astype(np.int64)
    routemap[300, 1] = -9
    for dtype in DATA_TYPES:
        rows = random_values(rng, (R, H), dtype)
        probs = random_values(rng, R, np.float32)
        results = []
        for threads in (1, 2, 3):
            moe_cpu.set_num_threads(threads)
            results.append(cpu_unpermute(rows, rowmap, routemap, probs, True, False))
        for a, sa in results[1:]:
            np.testing.assert_array_equal(sa, results[0][1])
            for x, y in zip(a, results[0][0], strict=True):
                np.testing.assert_array_equal(bits(x), bits(y))


def unpermute_arguments(rows_dtype=np.float32, T=3, E=2, K=2, R=4, H=5):
    """Consistent arguments of moe_cpu.unpermute, all -1 maps."""
    return dict(
        rows=np.zeros((R, H), rows_dtype),
        rowmap=np.full((T, E), -1, np.int32),
        routemap=np.full((T, K), -1, np.int32),
        probs=np.zeros(R, np.float32),
        out_hidden=np.empty((T, H), rows_dtype),
        out_probs=np.empty((T, K), np.float32),
        status=np.empty(abi.UNPERMUTE_STATUS_LEN, np.int64),
    )


def test_unpermute_data_type_mismatch():
    flags = dict(weighted=False, mix_precision=True)
    args = unpermute_arguments(np.float32)
    with pytest.raises(ValueError, match="float32 rows need data_type DATA_FLOAT32; got 1"):
        moe_cpu.unpermute(**args, data_type=abi.DATA_BFLOAT16, **flags)
    args = unpermute_arguments(np.uint16)
    with pytest.raises(
        ValueError, match="uint16 rows need data_type DATA_BFLOAT16 or DATA_FLOAT16; got 0"
    ):
        moe_cpu.unpermute(**args, data_type=abi.DATA_FLOAT32, **flags)
    moe_cpu.unpermute(**args, data_type=abi.DATA_FLOAT16, **flags)


@pytest.mark.parametrize(
    "name, shape, message",
    [
        ("routemap", (4, 2), r"routemap must have shape \[T, K\] = \(3, 2\); got \(4, 2\)"),
        ("probs", (5,), r"probs must have shape \[R\] = \(4,\); got \(5,\)"),
        ("out_hidden", (3, 6), r"out_hidden must have shape \[T, H\] = \(3, 5\); got \(3, 6\)"),
        ("out_probs", (3, 1), r"out_probs must have shape \[T, K\] = \(3, 2\); got \(3, 1\)"),
        ("status", (3,), r"status must have shape \[UNPERMUTE_STATUS_LEN\] = \(4,\); got \(3,\)"),
    ],
)
def test_unpermute_shapes_must_agree(name, shape, message):
    args = unpermute_arguments()
    args[name] = np.zeros(shape, args[name].dtype)
    with pytest.raises(ValueError, match=message):
        moe_cpu.unpermute(**args, data_type=abi.DATA_FLOAT32, weighted=True, mix_precision=True)


# ------------------------------------------------------------------------------ conversions


def canonical(values, dtype):
    """Oracle narrowing: round to nearest even, NaN canonical."""
    with np.errstate(invalid="ignore"):
        return bits(oracle.round_to(dtype, values)).view(np.uint16)


def widen(h, data_type):
    out = np.empty(h.size, np.float32)
    _unpermute._widen(h, out, data_type)
    return out


def narrow(f, data_type):
    out = np.empty(f.size, np.uint16)
    _unpermute._narrow(np.ascontiguousarray(f, np.float32), out, data_type)
    return out


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_widen_exhaustive(dtype):
    data_type = DATA_TYPES[np.dtype(dtype)][0]
    h = np.arange(2**16, dtype=np.uint16)
    got = widen(h, data_type)
    expected = h.view(dtype).astype(np.float32)
    nan = np.isnan(expected)
    assert (np.isnan(got) == nan).all()
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], expected.view(np.uint32)[~nan])


def narrowing_edge_cases(dtype):
    """Every representable value, the midpoints between neighbours and the floats next to both."""
    h = np.arange(2**16, dtype=np.uint16).view(dtype).astype(np.float32)
    h = np.sort(h[np.isfinite(h)])
    mid = (h[:-1].astype(np.float64) + h[1:]) / 2  # exact in float32 (fewer than 24 bits)
    mid = mid.astype(np.float32)
    # above the largest finite value: its midpoint to the next power of two (overflow edge)
    top = np.float32(float(h[-1]) + (float(h[-1]) - float(h[-2])) / 2)
    points = np.concatenate([h, mid, [top, -top]])
    near = [np.nextafter(points, np.float32(np.inf)), np.nextafter(points, np.float32(-np.inf))]
    special = np.array(
        [
            0x7F800000,
            0xFF800000,
            0x7F800001,
            0xFFFFFFFF,
            0x7FC00000,
            0x00000001,
            0x807FFFFF,
            0x7F7FFFFF,
            0x33000000,
            0x33000001,
            0xB3000000,
        ],
        np.uint32,
    ).view(np.float32)
    return np.concatenate([points, *near, special]).astype(np.float32)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_narrow_edge_cases_and_random(dtype):
    data_type = DATA_TYPES[np.dtype(dtype)][0]
    rng = np.random.default_rng(8)
    edges = narrowing_edge_cases(dtype)
    # every exponent (both signs) with all patterns of the bits a rounding looks at
    exponents = np.arange(512, dtype=np.uint32) << 23
    low = np.arange(2**13, dtype=np.uint32)
    high = rng.integers(0, 2**10, 4, dtype=np.uint32) << 13
    grid = (exponents[:, None, None] | high[None, :, None] | low[None, None, :]).reshape(-1)
    sample = rng.integers(0, 2**32, 2**22, dtype=np.uint32)
    for values in (edges, grid.view(np.float32), sample.view(np.float32)):
        np.testing.assert_array_equal(narrow(values, data_type), canonical(values, dtype))
