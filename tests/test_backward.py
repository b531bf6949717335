"""moe_permute_backward and moe_unpermute_backward against the NumPy oracle, bit for bit, and
against the forward ops they differentiate."""

import math
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import moe_cpu
from _backends import examples
from _cases import (
    COMBINE_DTYPES,
    assert_same_bits,
    counts_of,
    random_bits,
    random_probs,
    random_routing,
    random_values,
)
from _gradients import (
    check_permute_backward,
    check_unpermute_backward,
    routed,
    run_on,
    spoil,
    token_with_40_rows,
    with_gradients,
)
from moe_numba import (
    moe_permute,
    moe_permute_backward,
    moe_unpermute,
    moe_unpermute_backward,
    oracle,
)
from moe_numba.kernels import settings as kernel_settings
from moe_numba.kernels import use_settings

CANONICAL_NAN_BITS = {
    np.dtype(np.float32): 0x7FC00000,
    np.dtype(ml_dtypes.bfloat16): 0x7FC0,
    np.dtype(np.float16): 0x7E00,
}


# ------------------------------------------------------------------------- random cases


@st.composite
def gradient_cases(draw, small, dtype):
    return dict(
        num_tokens=draw(st.integers(0, 8 if small else 150)),
        hidden=draw(st.integers(1, 6 if small else 300)),
        num_experts=draw(st.integers(1, 5 if small else 40)),
        topk=draw(st.integers(1, 4 if small else 12)),
        alignment=draw(st.integers(1, 3 if small else 8)),
        dtype=dtype,
        routemap_dtype=draw(st.sampled_from([np.int32, np.int64])),
        with_rows=draw(st.booleans()),
        with_probs=draw(st.booleans()),
        repeats=draw(st.sampled_from([0.0, 0.3])),
        drop=draw(st.booleans()),
        malformed=draw(st.booleans()),
        validate=draw(st.booleans()),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def draw_maps(case):
    rng = np.random.default_rng(case["seed"])
    t, e = case["num_tokens"], case["num_experts"]
    routemap, rowmap, r = routed(
        rng, t, case["topk"], e, case["alignment"], repeats=case["repeats"], drop=case["drop"]
    )
    if case["malformed"]:
        rowmap, routemap = spoil(rng, rowmap, routemap, r, e)
    return rng, rowmap, routemap.astype(case["routemap_dtype"]), r


def _settings(parts):
    """60 draws in all, shared by the ``parts`` of a test parametrized by dtype (and more)."""
    return settings(
        max_examples=examples(60, parts),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


_DTYPE = pytest.mark.parametrize("dtype", COMBINE_DTYPES, ids=lambda d: np.dtype(d).name)


@_DTYPE
@_settings(len(COMBINE_DTYPES))
@given(data=st.data())
def test_permute_backward_random(backend, dtype, data):
    gradient_backend = with_gradients(backend)
    case = data.draw(gradient_cases(small=gradient_backend.small, dtype=dtype))
    assume(case["with_rows"] or case["with_probs"])
    rng, rowmap, routemap, r = draw_maps(case)
    grad_rows = (
        random_values(rng, (r, case["hidden"]), case["dtype"]) if case["with_rows"] else None
    )
    grad_probs = random_bits(rng, (r,), np.float32) if case["with_probs"] else None
    check_permute_backward(
        gradient_backend, grad_rows, grad_probs, rowmap, routemap, validate=case["validate"]
    )


@_DTYPE
@pytest.mark.parametrize("weighted", [False, True])
@_settings(2 * len(COMBINE_DTYPES))
@given(data=st.data(), optional_inputs=st.booleans(), column=st.booleans())
def test_unpermute_backward_random(backend, dtype, weighted, data, optional_inputs, column):
    """``optional_inputs``: also pass the rows and probabilities where they are not needed."""
    gradient_backend = with_gradients(backend)
    case = data.draw(gradient_cases(small=gradient_backend.small, dtype=dtype))
    assume(case["with_rows"] or case["with_probs"])
    rng, rowmap, routemap, r = draw_maps(case)
    t, h, dtype = case["num_tokens"], case["hidden"], case["dtype"]
    dy = random_values(rng, (t, h), dtype) if case["with_rows"] else None
    g = random_values(rng, routemap.shape, np.float32) if case["with_probs"] else None
    xu = random_values(rng, (r, h), dtype) if optional_inputs or weighted else None
    p = random_probs(rng, (r, 1) if column else (r,)) if optional_inputs or weighted else None
    check_unpermute_backward(
        gradient_backend,
        dy,
        g,
        xu,
        rowmap,
        routemap,
        p,
        weighted=weighted,
        num_rows=r,
        validate=case["validate"],
    )


# --------------------------------------------------------------------------- edge cases


@pytest.mark.parametrize(
    "num_tokens, hidden, num_experts, topk, alignment, repeats, drop",
    [
        (0, 3, 4, 2, 1, 0.0, False),  # T = 0
        (5, 1, 3, 2, 1, 0.0, False),  # H = 1
        (7, 9, 1, 3, 2, 0.0, False),  # E = 1, K > E
        (9, 33, 3, 7, 4, 0.5, False),  # K > E, repeated experts, odd H
        (12, 17, 6, 3, 1, 0.3, True),  # dropped tokens
        (40, 257, 8, 4, 16, 0.2, True),  # more than one pass of the lanes for every dtype
    ],
)
@pytest.mark.parametrize("dtype", COMBINE_DTYPES, ids=lambda d: np.dtype(d).name)
def test_edge_shapes(
    backend, num_tokens, hidden, num_experts, topk, alignment, repeats, drop, dtype
):
    backend = with_gradients(backend)
    if backend.small:  # the simulator runs every thread in Python: fewer tokens, and
        # every dtype only where the rows take more than one pass of the lanes
        if hidden <= 64 and np.dtype(dtype) != np.dtype(ml_dtypes.bfloat16):
            pytest.skip("the simulator runs the narrow edge shapes in bfloat16 only")
        num_tokens = min(num_tokens, 6)
    rng = np.random.default_rng(num_tokens * 1000 + hidden)
    routemap, rowmap, r = routed(
        rng, num_tokens, topk, num_experts, alignment, repeats=repeats, drop=drop
    )
    grad_rows = random_values(rng, (r, hidden), dtype)
    check_permute_backward(backend, grad_rows, random_probs(rng, (r,)), rowmap, routemap)
    dy = random_values(rng, (num_tokens, hidden), dtype)
    g = random_values(rng, routemap.shape, np.float32)
    xu = random_values(rng, (r, hidden), dtype)
    p = random_probs(rng, (r,))
    for weighted in (False, True):
        check_unpermute_backward(
            backend, dy, g, xu, rowmap, routemap, p, weighted=weighted, num_rows=r
        )


@use_settings(part_words=2)
def test_permute_backward_rows_split_into_parts(backend):
    """The GPU's combine splits a small call's rows among blocks (parts of 2 words here; the
    CPU backend has no parts): each part folds its words, part 0 writes the counted-slot
    probabilities, repeated experts included."""
    backend = with_gradients(backend)
    rng = np.random.default_rng(3)
    routemap, rowmap, r = routed(rng, 5, 3, 6, 2, repeats=0.3)
    for dtype, hidden in ((ml_dtypes.bfloat16, 40), (np.float32, 7)):
        grad_rows = random_values(rng, (r, hidden), dtype)
        check_permute_backward(backend, grad_rows, random_probs(rng, (r,)), rowmap, routemap)


@pytest.mark.parametrize(
    "token_warps", [1, kernel_settings().scatter_token_warps], ids=["whole", "shared"]
)
def test_token_with_more_rows_than_lanes(backend, token_warps):
    """A malformed row map names 40 rows of one token. "whole" (the GPU's plan of a call of
    ``scatter_token_warps`` tokens or more): its warp lists 32 at a time, so the rows go in
    two rounds; rows of 1100 float32 take two batches of dY there, reloaded for the second
    round.
    "shared" (this small call's plan): four warps take 10 rows each, rows without the dot
    product in two parts (the simulator, far slower, takes narrow rows; the CPU backend has
    neither plan)."""
    with use_settings(scatter_token_warps=token_warps):
        _token_with_more_rows_than_lanes(with_gradients(backend))


def _token_with_more_rows_than_lanes(backend):
    rng = np.random.default_rng(2)
    T, K, R = 2, 4, 100
    H = 8 if backend.small else 1100
    routemap, rowmap = token_with_40_rows(rng, R)
    dy = random_values(rng, (T, H), np.float32)
    g = random_values(rng, (T, K), np.float32)
    xu = random_values(rng, (R, H), np.float32)
    p = random_probs(rng, (R,))
    for weighted in (False, True):
        check_unpermute_backward(
            backend, dy, g, xu, rowmap, routemap, p, weighted=weighted, num_rows=R,
            validate=False,
        )  # fmt: skip


def test_empty_buffer_and_tokens_without_rows(backend):
    """R = 0 and rows of -1 only: zeros everywhere, of the right shapes."""
    backend = with_gradients(backend)
    rowmap = np.full((3, 2), -1, np.int32)
    routemap = np.array([[0, 1], [-1, -1], [1, 0]], np.int32)
    rows = np.zeros((0, 5), ml_dtypes.bfloat16)
    dx, dprob = check_permute_backward(backend, rows, np.zeros(0, np.float32), rowmap, routemap)
    assert dx.shape == (3, 5) and not dx.view(np.uint16).any()
    assert dprob.shape == (3, 2) and not dprob.view(np.uint32).any()
    dy = np.ones((3, 5), ml_dtypes.bfloat16)
    drows, dp = check_unpermute_backward(
        backend, dy, np.ones((3, 2), np.float32), rows, rowmap, routemap,
        np.zeros(0, np.float32), weighted=True, num_rows=0,
    )  # fmt: skip
    assert drows.shape == (0, 5) and dp.shape == (0,)
    padded = check_unpermute_backward(
        backend, dy, None, None, rowmap, routemap, None, weighted=False, num_rows=4
    )
    assert not padded[0].view(np.uint16).any() and not padded[1].view(np.uint32).any()


def test_counted_slots_by_hand(backend):
    """Token 0 names expert 1 twice (slots 0, 1) and expert 0 once (slot 2)."""
    backend = with_gradients(backend)
    rowmap = np.array([[3, 1], [-1, 0]], np.int32)  # token 0: expert 0 -> row 3, 1 -> row 1
    routemap = np.array([[1, 1, 0], [1, -1, -1]], np.int64)
    grad_probs = np.array([10.0, 20.0, 30.0, 40.0], np.float32)
    _, dprob = check_permute_backward(backend, None, grad_probs, rowmap, routemap)
    np.testing.assert_array_equal(dprob, [[20.0, 0.0, 40.0], [10.0, 0.0, 0.0]])
    g = np.array([[1.0, 2.0, 4.0], [8.0, 16.0, 32.0]], np.float32)
    _, dp = check_unpermute_backward(
        backend, None, g, None, rowmap, routemap, None, weighted=False, num_rows=5
    )
    np.testing.assert_array_equal(dp, [8.0, 3.0, 0.0, 4.0, 0.0])  # row 1: slots 0 and 1


def test_rows_named_twice(backend):
    """validate=False: such a row gets zero gradients; True: the smallest such row raises."""
    backend = with_gradients(backend)
    rowmap = np.array([[0, 2, 3], [2, 1, 3], [3, -1, 4]], np.int32)  # rows 2 and 3 twice or more
    routemap = np.array([[0, 1, 2], [1, 0, 2], [0, 2, -1]], np.int32)
    dy = np.arange(1, 13, dtype=np.float32).reshape(3, 4)
    g = np.ones((3, 3), np.float32)
    xu = np.ones((5, 4), np.float32)
    p = np.full(5, 0.5, np.float32)
    args = (dy, g, xu, rowmap, routemap, p)
    drows, dp = check_unpermute_backward(backend, *args, weighted=True, num_rows=5, validate=False)
    assert not drows[2:4].any() and not dp[2:4].any()
    np.testing.assert_array_equal(drows[1], dy[1] * 0.5)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "zipped_expertwise_rowmap[0, 1] and zipped_expertwise_rowmap[1, 0] both name row 2"
        ),
    ):
        run_on(backend, moe_unpermute_backward, *args, using_weighted_combine=True, num_rows=5)
    # row 3 is seen twice first (flat entries 0 and 3), row 2 later: row 2 is reported
    rowmap = np.array([[3, -1, -1], [3, 2, -1], [-1, 2, -1]], np.int32)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "zipped_expertwise_rowmap[1, 1] and zipped_expertwise_rowmap[2, 1] both name row 2"
        ),
    ):
        run_on(
            backend, moe_unpermute_backward, None, g, None, rowmap, routemap, None,
            using_weighted_combine=False, num_rows=5,
        )  # fmt: skip


def test_both_gradients_none(backend):
    rowmap = np.array([[0, -7]], np.int32)  # bad entries are not looked at: nothing is read
    routemap = np.array([[9]], np.int32)
    dev = backend.to_device
    assert moe_permute_backward(None, None, dev(rowmap), dev(routemap)) == (None, None)
    assert moe_unpermute_backward(
        None, None, None, dev(rowmap), dev(routemap), None,
        using_weighted_combine=False, num_rows=1,
    ) == (None, None)  # fmt: skip


# ------------------------------------------------------ the forward ops they differentiate


@pytest.mark.parametrize("dtype", COMBINE_DTYPES, ids=lambda d: np.dtype(d).name)
def test_permute_backward_is_the_unweighted_combine(backend, dtype):
    backend = with_gradients(backend)
    rng = np.random.default_rng(21)
    T = 15 if backend.small else 60  # (the simulator runs every thread in Python)
    routemap, rowmap, r = routed(rng, T, 5, 7, 3, repeats=0.2, drop=True)
    grad_rows = random_values(rng, (r, 45), dtype, special=0.05)
    dx, _ = run_on(backend, moe_permute_backward, grad_rows, None, rowmap, routemap)
    combined, _ = run_on(
        backend, moe_unpermute, grad_rows, rowmap, routemap, np.zeros(r, np.float32),
        total_zipped_tokens=T, num_experts=7,
    )  # fmt: skip
    assert_same_bits(dx, combined, "grad_hidden_states")


def test_weighted_probability_gradient_is_the_warp_dot(backend):
    backend = with_gradients(backend)
    rng = np.random.default_rng(22)
    T = 8 if backend.small else 30
    routemap, rowmap, r = routed(rng, T, 4, 6, 2)
    dy = random_values(rng, (T, 300), ml_dtypes.bfloat16, special=0.0)
    xu = random_values(rng, (r, 300), ml_dtypes.bfloat16, special=0.0)
    _, dp = run_on(
        backend, moe_unpermute_backward, dy, None, xu, rowmap, routemap, random_probs(rng, r),
        using_weighted_combine=True, num_rows=r,
    )  # fmt: skip
    t, e = np.nonzero(rowmap >= 0)
    rows = rowmap[t, e]
    expected = np.zeros(r, np.float32)
    expected[rows] = oracle.warp_dot(dy[t], xu[rows])
    assert_same_bits(dp, expected, "grad_token_prob_unzipped")


def test_weighted_without_rows_leaves_out_the_dot(backend):
    """hidden_states_unzipped=None (autograd when the probabilities need no gradient): the
    row gradient is the same, the probability gradient has only the slot terms."""
    backend = with_gradients(backend)
    rng = np.random.default_rng(23)
    T = 8 if backend.small else 20
    routemap, rowmap, r = routed(rng, T, 3, 5, 2)
    dy = random_values(rng, (T, 40), ml_dtypes.bfloat16, special=0.0)
    xu = random_values(rng, (r, 40), ml_dtypes.bfloat16, special=0.0)
    g = random_values(rng, routemap.shape, np.float32)
    p = random_probs(rng, r)
    flags = dict(using_weighted_combine=True, num_rows=r)
    with_rows = run_on(backend, moe_unpermute_backward, dy, g, xu, rowmap, routemap, p, **flags)
    without = run_on(backend, moe_unpermute_backward, dy, g, None, rowmap, routemap, p, **flags)
    assert_same_bits(without[0], with_rows[0], "grad_hidden_states_unzipped")
    slot_only = run_on(backend, moe_unpermute_backward, None, g, None, rowmap, routemap, p, **flags)
    assert_same_bits(without[1], slot_only[1], "grad_token_prob_unzipped")
    (_, expected), _ = oracle.unpermute_backward(dy, g, None, rowmap, routemap, p, True, r)
    assert_same_bits(without[1], expected, "grad_token_prob_unzipped")


@pytest.mark.parametrize("dtype", COMBINE_DTYPES, ids=lambda d: np.dtype(d).name)
def test_dot_order_by_hand(backend, dtype):
    """Lane 0 holds 4096 * 4096 = 2^24 and takes three more 1s (each lost to rounding); lane
    1 holds 3; the butterfly's last step gives 2^24 + 3 -> 16777220. A sequential sum gives
    16777216."""
    backend = with_gradients(backend)
    v = 16 // np.dtype(dtype).itemsize
    dy = np.zeros((1, 32 * v + 1), np.float32)
    dy[0, 0] = 4096.0
    dy[0, 1:4] = 1.0  # lane 0
    dy[0, v : v + 3] = 1.0  # lane 1
    dy[0, 32 * v] = 1.0  # lane 0 again, in the second pass
    dy = dy.astype(dtype)
    xu = np.ones_like(dy)
    xu[0, 0] = 4096.0
    _, dp = run_on(
        backend, moe_unpermute_backward, dy, None, xu, np.array([[0]], np.int32),
        np.array([[0]], np.int32), np.ones(1, np.float32), using_weighted_combine=True,
        num_rows=1,
    )  # fmt: skip
    assert dp[0] == np.float32(16777220.0)
    assert oracle.warp_dot(dy, xu)[0] == np.float32(16777220.0)


def test_gradients_are_adjoints_of_the_forward_ops():
    """float32, in float64 sums: <permute(x), G> = <x, dx>, the same for the probabilities,
    and central differences of the weighted unpermute (linear in both inputs) in random
    directions equal the gradient."""
    rng = np.random.default_rng(23)
    t, h, e, k = 50, 37, 6, 3
    routemap = random_routing(rng, t, k, e, repeats=0.3)
    x = rng.standard_normal((t, h)).astype(np.float32)
    probs = random_probs(rng, (t, k))
    rows, rowmap, row_probs, _ = moe_permute(
        x, None, routemap, probs, e, counts_of(routemap, e).tolist(), 4, validate=False
    )  # validate=False: repeated experts (the first slot counts)
    r = rows.shape[0]
    grad_rows = rng.standard_normal((r, h)).astype(np.float32)
    grad_row_probs = rng.standard_normal(r).astype(np.float32)
    dx, dprob = moe_permute_backward(grad_rows, grad_row_probs, rowmap, routemap)

    def inner(a, b):  # float32 products are exact in float64; fsum rounds the sum once
        return math.fsum((np.float64(a) * np.float64(b)).ravel())

    np.testing.assert_allclose(inner(rows, grad_rows), inner(x, dx), rtol=1e-5)
    assert inner(row_probs, grad_row_probs) == inner(probs, dprob)  # copies: exact

    dy = rng.standard_normal((t, h)).astype(np.float32)
    g = rng.standard_normal((t, k)).astype(np.float32)

    def loss(xu, p):
        combined, slot_probs = moe_unpermute(
            xu, rowmap, routemap, p, t, e, using_weighted_combine=True
        )
        return inner(combined, dy) + inner(slot_probs, g)

    drows, dp = moe_unpermute_backward(
        dy, g, grad_rows, rowmap, routemap, row_probs, using_weighted_combine=True, num_rows=r
    )
    direction = rng.standard_normal(r).astype(np.float32)
    step = np.float32(0.25)
    change = loss(grad_rows, row_probs + step * direction) - loss(
        grad_rows, row_probs - step * direction
    )
    np.testing.assert_allclose(change / (2 * step), inner(dp, direction), rtol=1e-4)
    direction = rng.standard_normal((r, h)).astype(np.float32)
    change = loss(grad_rows + step * direction, row_probs) - loss(
        grad_rows - step * direction, row_probs
    )
    np.testing.assert_allclose(change / (2 * step), inner(drows, direction), rtol=1e-4)


# ------------------------------------------------------------- NaN, bits and threads


def nan_bits(values, dtype):
    width = np.uint32 if np.dtype(dtype).itemsize == 4 else np.uint16
    return np.asarray(values, dtype=np.uint64).astype(width).view(dtype)


@pytest.mark.parametrize("dtype", COMBINE_DTYPES, ids=lambda d: np.dtype(d).name)
def test_nan_results_are_canonical_and_copies_keep_bits(backend, dtype):
    backend = with_gradients(backend)
    dtype = np.dtype(dtype)
    payloads = (
        [0xFFC00001, 0x7F800001, 0x7FC12345]
        if dtype.itemsize == 4
        else ([0xFFC1, 0x7F81, 0x7FD3] if dtype == ml_dtypes.bfloat16 else [0xFE01, 0x7C01, 0x7E77])
    )
    odd_nans = nan_bits(payloads, dtype)
    rowmap = np.array([[0, 1], [2, -1]], np.int32)
    routemap = np.array([[0, 1], [0, -1]], np.int32)
    rows = np.stack([odd_nans, np.ones(3, dtype), odd_nans[::-1]])
    nan32 = nan_bits([0xFFC00001, 0x7F800001, 0x7FC12345], np.float32)
    dx, dprob = check_permute_backward(backend, rows, nan32, rowmap, routemap)
    assert (np.ascontiguousarray(dx).view(f"u{dtype.itemsize}") == CANONICAL_NAN_BITS[dtype]).all()
    assert_same_bits(dprob, np.array([[nan32[0], nan32[1]], [nan32[2], 0.0]], np.float32))

    dy = np.stack([odd_nans, odd_nans[::-1]])
    g = nan_bits([[0x7F800001, 0xFFC00001], [0x7FC00005, 0]], np.float32)
    for weighted in (False, True):
        drows, dp = check_unpermute_backward(
            backend, dy, g, rows, rowmap, routemap, np.full(3, 0.5, np.float32),
            weighted=weighted, num_rows=3,
        )  # fmt: skip
        assert (np.ascontiguousarray(dp).view(np.uint32) == 0x7FC00000).all()
        if weighted:
            assert (drows.view(f"u{dtype.itemsize}") == CANONICAL_NAN_BITS[dtype]).all()
        else:
            assert_same_bits(drows, dy[[0, 0, 1]], "copied rows")


def test_cpu_threads_do_not_change_bits():
    rng = np.random.default_rng(24)
    routemap, rowmap, r = routed(rng, 2000, 8, 32, 4, repeats=0.1, drop=True)
    rowmap, routemap = spoil(rng, rowmap, routemap, r, 32)
    dtype = ml_dtypes.bfloat16
    grad_rows = random_values(rng, (r, 40), dtype)
    grad_probs = random_probs(rng, (r,))
    dy = random_values(rng, (2000, 40), dtype)
    g = random_values(rng, routemap.shape, np.float32)
    xu = random_values(rng, (r, 40), dtype)
    p = random_probs(rng, (r,))
    results, errors = [], []
    try:
        for threads in (1, 2):
            moe_cpu.set_num_threads(threads)
            results.append(
                moe_permute_backward(grad_rows, grad_probs, rowmap, routemap, validate=False)
                + moe_unpermute_backward(
                    dy, g, xu, rowmap, routemap, p, using_weighted_combine=True,
                    num_rows=r, validate=False,
                )
            )  # fmt: skip
            for call in (
                lambda: moe_permute_backward(grad_rows, grad_probs, rowmap, routemap),
                lambda: moe_unpermute_backward(
                    dy, g, xu, rowmap, routemap, p, using_weighted_combine=True, num_rows=r
                ),
            ):
                with pytest.raises(ValueError) as error:
                    call()
                errors.append(str(error.value))
    finally:
        moe_cpu.set_num_threads(None)
    for a, b in zip(*results, strict=True):
        assert_same_bits(a, b)
    assert errors[:2] == errors[2:]


def test_torch_cpu_tensors_in_and_out():
    """torch CPU tensors run on the CPU backend through NumPy views: the same bits as NumPy,
    torch tensors back; mixing them with NumPy arrays is refused as in the forward ops."""
    torch = pytest.importorskip("torch")
    from _torch_cases import from_numpy, to_numpy

    rng = np.random.default_rng(25)
    routemap, rowmap, r = routed(rng, 20, 3, 5, 2, repeats=0.2)
    dtype = ml_dtypes.bfloat16
    grad_rows = random_values(rng, (r, 9), dtype)
    grad_probs = random_probs(rng, (r,))
    dy = random_values(rng, (20, 9), dtype)
    g = random_values(rng, routemap.shape, np.float32)
    calls = [
        (moe_permute_backward, (grad_rows, grad_probs, rowmap, routemap), {}),
        (
            moe_unpermute_backward,
            (dy, g, grad_rows, rowmap, routemap, grad_probs),
            dict(using_weighted_combine=True, num_rows=r),
        ),
    ]
    for op, arrays, flags in calls:
        expected = op(*arrays, **flags)
        actual = op(*map(from_numpy, arrays), **flags)
        for a, b in zip(actual, expected, strict=True):
            assert isinstance(a, torch.Tensor)
            assert_same_bits(to_numpy(a), b)
        with pytest.raises(TypeError, match="pass every array as a torch tensor"):
            op(from_numpy(arrays[0]), *arrays[1:], **flags)
