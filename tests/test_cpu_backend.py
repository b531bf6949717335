"""The moe_cpu backend called directly, bit for bit against the NumPy oracle.

The public API and the backend-parametrised suite live elsewhere; these tests build the
backend's raw arguments themselves (byte views, preallocated outputs filled with garbage, so
that an element the backend forgets to write shows up) and compare every output and status word
with ``moe_numba._oracle``.
"""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import moe_cpu
from _cases import HIDDEN_DTYPES, counts_of
from moe_cpu import _unpermute
from moe_numba import _abi, _oracle

GARBAGE = 0xA5
DATA_TYPES = {
    np.dtype(np.float32): (_abi.DATA_FLOAT32, np.float32),
    np.dtype(ml_dtypes.bfloat16): (_abi.DATA_BFLOAT16, np.uint16),
    np.dtype(np.float16): (_abi.DATA_FLOAT16, np.uint16),
}
HYPOTHESIS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def default_threads():
    yield
    moe_cpu.set_num_threads(None)


def garbage(shape, dtype):
    out = np.empty(shape, dtype)
    out.view(np.uint8)[...] = GARBAGE
    return out


def bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


# ---------------------------------------------------------------------------------- permute


def cpu_permute(
    hidden,
    scale,
    routemap,
    probs,
    num_experts,
    tokens_per_expert,
    alignment,
    do_gather=True,
    return_expert_indices=True,
    override_buffer_size=-1,
    validate=False,
):
    """moe_cpu.permute with outputs shaped as the oracle's; returns (outputs, status)."""
    T = routemap.shape[0]
    if override_buffer_size >= 0:
        capacity, R = None, override_buffer_size
    else:
        capacity = np.asarray(tokens_per_expert, np.int64)
        R = int(_oracle.padded_rows(capacity, alignment).sum())
    gather_scale = do_gather and scale is not None
    out_hidden = garbage((R if do_gather else 0, hidden.shape[1]), hidden.dtype)
    out_scale = (
        garbage((R, scale.shape[1]), scale.dtype) if gather_scale else np.zeros(0, np.float32)
    )
    out_rowmap = garbage((T, num_experts), np.int32)
    out_probs = garbage(R, np.float32)
    out_indices = garbage(R, np.int32) if return_expert_indices else None
    status = garbage(_abi.PERMUTE_STATUS_LEN, np.int64)
    moe_cpu.permute(
        bits(hidden) if do_gather else None,
        bits(scale) if gather_scale else None,
        routemap,
        probs,
        capacity,
        alignment,
        out_hidden.view(np.uint8) if do_gather else None,
        out_scale.view(np.uint8) if gather_scale else None,
        out_rowmap,
        out_probs,
        out_indices,
        status,
        validate,
    )
    outputs = (out_hidden, out_rowmap, out_probs, out_scale)
    if return_expert_indices:
        outputs += (out_indices,)
    return outputs, status


def check_permute(
    hidden,
    scale,
    routemap,
    probs,
    num_experts,
    tokens_per_expert,
    alignment,
    do_gather=True,
    return_expert_indices=True,
    override_buffer_size=-1,
):
    """Both validate modes against the oracle; returns the oracle's status."""
    args = (hidden, scale, routemap, probs, num_experts, tokens_per_expert, alignment)
    kwargs = dict(
        do_gather=do_gather,
        return_expert_indices=return_expert_indices,
        override_buffer_size=override_buffer_size,
    )
    expected, expected_status = _oracle.permute(*args, **kwargs)
    got, status = cpu_permute(*args, **kwargs, validate=False)
    np.testing.assert_array_equal(status, expected_status)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_array_equal(bits(g), bits(e))
    got, status = cpu_permute(*args, **kwargs, validate=True)
    np.testing.assert_array_equal(status, expected_status)
    if (expected_status == -1).all():
        for g, e in zip(got, expected, strict=True):
            np.testing.assert_array_equal(bits(g), bits(e))
    return expected_status


def random_bits(rng, shape, dtype):
    dtype = np.dtype(dtype)
    raw = rng.integers(0, 256, (*shape[:-1], shape[-1] * dtype.itemsize), dtype=np.uint8)
    return raw.view(dtype)


def distinct_routes(rng, T, K, E, holes=0.2):
    """Valid routing: distinct experts per token, -1 in some slots (all of them when K > E)."""
    routemap = np.full((T, K), -1, np.int64)
    for t in range(T):
        n = min(K, E)
        routemap[t, rng.permutation(K)[:n]] = rng.permutation(E)[:n]
    routemap[rng.random((T, K)) < holes] = -1
    return routemap


@st.composite
def permute_cases(draw):
    T = draw(st.integers(0, 40))
    K = draw(st.integers(1, 6))
    E = draw(st.integers(1, 9))
    H = draw(st.integers(1, 7))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    index_dtype = draw(st.sampled_from([np.int32, np.int64]))
    if draw(st.booleans()):
        routemap = distinct_routes(rng, T, K, E)
    else:  # bad ids and repeated experts
        routemap = rng.integers(-3, E + 3, (T, K))
    routemap = routemap.astype(index_dtype)
    counts = counts_of(routemap, E)
    alignment = draw(st.integers(1, 5))
    mode = draw(st.sampled_from(["exact", "capacity", "override"]))
    tokens_per_expert = counts.copy()
    override = -1
    if mode == "capacity":
        tokens_per_expert = np.maximum(0, counts + rng.integers(-2, 3, E))
    elif mode == "override":
        needed = int(_oracle.padded_rows(counts, alignment).sum())
        override = max(0, needed + draw(st.integers(-6, 6)))
    scale = None
    if draw(st.booleans()):
        scale_dtype = draw(st.sampled_from([np.float32, np.int32]))
        scale = random_bits(rng, (T, draw(st.integers(1, 3))), scale_dtype)
    return dict(
        hidden=random_bits(rng, (T, H), draw(st.sampled_from(HIDDEN_DTYPES))),
        scale=scale,
        routemap=routemap,
        probs=random_bits(rng, (T, K), np.float32),
        num_experts=E,
        tokens_per_expert=tokens_per_expert,
        alignment=alignment,
        do_gather=draw(st.booleans()) or draw(st.booleans()),
        return_expert_indices=draw(st.booleans()),
        override_buffer_size=override,
    )


@HYPOTHESIS
@given(permute_cases())
def test_permute_random(case):
    check_permute(**case)


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("dtype", HIDDEN_DTYPES)
def test_permute_dtypes(dtype, index_dtype):
    rng = np.random.default_rng(1)
    T, K, E, H = 300, 4, 6, 9
    routemap = distinct_routes(rng, T, K, E).astype(index_dtype)
    scale = random_bits(rng, (T, 2), np.float32)
    status = check_permute(
        random_bits(rng, (T, H), dtype),
        scale,
        routemap,
        random_bits(rng, (T, K), np.float32),
        E,
        counts_of(routemap, E),
        3,
    )
    assert (status == -1).all()


def test_permute_chunks_and_threads():
    """Many token chunks; identical bits with 1, 2 and 3 threads."""
    rng = np.random.default_rng(2)
    T, K, E, H = 3000, 5, 12, 24
    routemap = distinct_routes(rng, T, K, E).astype(np.int32)
    routemap[1700, 2] = 99
    routemap[2900, 3] = routemap[2900, 0] = 4
    args = (
        random_bits(rng, (T, H), ml_dtypes.bfloat16),
        random_bits(rng, (T, 3), np.float32),
        routemap,
        random_bits(rng, (T, K), np.float32),
        E,
    )
    counts = counts_of(routemap, E)
    counts[7] += 1
    results = []
    for threads in (1, 2, 3):
        moe_cpu.set_num_threads(threads)
        results.append(
            [
                cpu_permute(*args, counts, 4),
                cpu_permute(*args, counts, 4, override_buffer_size=2000),
            ]
        )
        if threads == 2:
            check_permute(*args, counts, 4)
    for other in results[1:]:
        for (a, sa), (b, sb) in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(sa, sb)
            for x, y in zip(a, b, strict=True):
                np.testing.assert_array_equal(bits(x), bits(y))


def test_permute_many_experts_and_slots():
    rng = np.random.default_rng(3)
    T, K, E = 40, 64, 1024
    routemap = distinct_routes(rng, T, K, E, holes=0.1).astype(np.int32)
    check_permute(
        random_bits(rng, (T, 3), np.float16),
        None,
        routemap,
        random_bits(rng, (T, K), np.float32),
        E,
        counts_of(routemap, E),
        16,
    )


def test_permute_status_words():
    T, K, E = 6, 3, 4
    routemap = np.array(
        [[0, 1, -1], [2, 2, 9], [-1, -1, -1], [3, -7, 0], [1, 0, 1], [2, 3, 0]], np.int64
    )
    probs = np.arange(T * K, dtype=np.float32).reshape(T, K)
    hidden = np.arange(T * 2, dtype=np.float32).reshape(T, 2)
    counts = counts_of(routemap, E)
    status = check_permute(hidden, None, routemap, probs, E, counts + [0, 2, 0, 0], 2)
    assert status[_abi.PERMUTE_BAD_ID] == 5 and status[_abi.PERMUTE_BAD_ID_VALUE] == 9
    assert status[_abi.PERMUTE_DUPLICATE] == 4 and status[_abi.PERMUTE_DUPLICATE_VALUE] == 2
    assert status[_abi.PERMUTE_MISMATCH] == 1
    assert status[_abi.PERMUTE_MISMATCH_COUNT] == counts[1]
    assert status[_abi.PERMUTE_ROWS_NEEDED] == -1
    status = check_permute(hidden, None, routemap, probs, E, None, 3, override_buffer_size=5)
    assert status[_abi.PERMUTE_ROWS_NEEDED] == 6 + 3 * 3 and status[_abi.PERMUTE_MISMATCH] == -1


def test_permute_extreme_ids():
    routemap = np.array([[-1, 2**40], [-(2**40), 0]], np.int64)
    probs = np.ones((2, 2), np.float32)
    status = check_permute(np.ones((2, 1), np.float32), None, routemap, probs, 2, [1, 0], 1)
    assert status[_abi.PERMUTE_BAD_ID_VALUE] == 2**40
    routemap32 = np.array([[np.iinfo(np.int32).min, np.iinfo(np.int32).max]], np.int32)
    check_permute(np.ones((1, 1), np.float32), None, routemap32, probs[:1], 2, [0, 0], 1)


@pytest.mark.parametrize("override", [-1, 0, 7])
def test_permute_degenerate_shapes(override):
    rng = np.random.default_rng(4)
    for T, K, E, H in [(0, 2, 3, 4), (5, 1, 1, 1), (7, 5, 2, 3), (9, 3, 3, 1)]:
        routemap = distinct_routes(rng, T, K, E).astype(np.int32)
        for gather in (True, False):
            check_permute(
                random_bits(rng, (T, H), ml_dtypes.bfloat16),
                None,
                routemap,
                random_bits(rng, (T, K), np.float32),
                E,
                counts_of(routemap, E),
                2,
                do_gather=gather,
                override_buffer_size=override,
            )
    routemap = np.full((4, 3), -1, np.int32)  # all -1 rows
    check_permute(
        np.ones((4, 2), np.float16), None, routemap, np.ones((4, 3), np.float32), 3, [0, 2, 0], 4
    )


def test_permute_large_alignment_and_capacity():
    """Huge capacities or alignments only drop rows; nothing overflows or runs out of bounds."""
    routemap = np.array([[0, 1], [1, 0]], np.int32)
    probs = np.ones((2, 2), np.float32)
    hidden = np.ones((2, 3), np.float32)
    capacity = np.array([2**62, 1], np.int64)
    out = np.empty((5, 12), np.uint8)
    rowmap = np.empty((2, 2), np.int32)
    status = np.empty(_abi.PERMUTE_STATUS_LEN, np.int64)
    row_probs = np.empty(5, np.float32)
    for cap, alignment in [(capacity, 3), (None, 2**62), (capacity, 2**62 + 1)]:
        moe_cpu.permute(
            bits(hidden),
            None,
            routemap,
            probs,
            cap,
            alignment,
            out,
            None,
            rowmap,
            row_probs,
            None,
            status,
            False,
        )
        assert rowmap[0, 0] == 0 and rowmap[1, 0] == 1
        assert (rowmap[:, 1] == -1).all() and (out[2:] == 0).all()
        if cap is None:  # the sum of padded rows saturates
            assert status[_abi.PERMUTE_ROWS_NEEDED] == np.iinfo(np.int64).max


# -------------------------------------------------------------------------------- unpermute


def cpu_unpermute(rows, rowmap, routemap, probs, weighted, mix_precision):
    data_type, kernel_dtype = DATA_TYPES[rows.dtype]
    T, K = routemap.shape
    out_hidden = garbage((T, rows.shape[1]), rows.dtype)
    out_probs = garbage((T, K), np.float32)
    status = garbage(_abi.UNPERMUTE_STATUS_LEN, np.int64)
    moe_cpu.unpermute(
        rows.view(kernel_dtype),
        rowmap,
        routemap,
        probs,
        out_hidden.view(kernel_dtype),
        out_probs,
        status,
        data_type,
        weighted,
        mix_precision,
    )
    return (out_hidden, out_probs), status


def check_unpermute(rows, rowmap, routemap, probs, weighted, mix_precision):
    T, E = rowmap.shape
    with np.errstate(all="ignore"):  # the oracle's float64 work on NaN/inf inputs
        expected, expected_status = _oracle.unpermute(
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


def test_unpermute_data_type_mismatch():
    rows = np.ones((2, 2), np.float32)
    args = (np.zeros((1, 1), np.int32), np.zeros((1, 1), np.int32), np.ones(2, np.float32))
    with pytest.raises(ValueError, match="DATA_FLOAT32"):
        moe_cpu.unpermute(
            rows,
            *args,
            np.empty((1, 2), np.float32),
            np.empty((1, 1), np.float32),
            np.empty(4, np.int64),
            _abi.DATA_BFLOAT16,
            False,
            True,
        )
    with pytest.raises(ValueError, match="DATA_BFLOAT16"):
        moe_cpu.unpermute(
            np.ones((2, 2), np.uint16),
            *args,
            np.empty((1, 2), np.uint16),
            np.empty((1, 1), np.float32),
            np.empty(4, np.int64),
            _abi.DATA_FLOAT32,
            False,
            True,
        )


# ------------------------------------------------------------------------------ conversions


def canonical(values, dtype):
    """Oracle narrowing: round to nearest even, NaN canonical."""
    with np.errstate(invalid="ignore"):
        return bits(_oracle.round_to(dtype, values)).view(np.uint16)


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


# ---------------------------------------------------------------------------- thread control


def test_threads_api():
    default = moe_cpu.get_num_threads()
    assert default >= 1
    moe_cpu.set_num_threads(1)
    assert moe_cpu.get_num_threads() == 1
    moe_cpu.set_num_threads(3)
    assert moe_cpu.get_num_threads() == (3 if moe_cpu.openmp_enabled() else 1)
    moe_cpu.set_num_threads(None)
    assert moe_cpu.get_num_threads() == default
    with pytest.raises(ValueError, match="n must be a positive int or None, got 0"):
        moe_cpu.set_num_threads(0)
    with pytest.raises(TypeError, match="n must be a positive int or None, got float"):
        moe_cpu.set_num_threads(2.0)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("size", [0, 1, 5, 1 << 20 | 3])
def test_copy_rows(size, threads):
    moe_cpu.set_num_threads(threads)
    src = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    dst = garbage(size, np.uint8)
    moe_cpu.copy_rows(src, dst)
    np.testing.assert_array_equal(dst, src)
    src2d = src[: size // 2 * 2].reshape(-1, 2) if size > 1 else src.reshape(-1, 1)
    dst2d = garbage(src2d.shape, np.uint8)
    moe_cpu.copy_rows(src2d, dst2d)
    np.testing.assert_array_equal(dst2d, src2d)
    with pytest.raises(ValueError, match=f"dst must have {size} elements, got {size + 1}"):
        moe_cpu.copy_rows(src, np.empty(size + 1, np.uint8))
