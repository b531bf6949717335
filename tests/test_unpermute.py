"""moe_unpermute on every backend against the NumPy oracle (bit for bit, except the
simulator's weighted combine, whose fma is not fused)."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _backends import examples
from _cases import (
    COMBINE_DTYPES,
    assert_close_combine,
    assert_same_bits,
    counts_of,
    random_bits,
    random_probs,
    random_routing,
    random_values,
)
from moe_numba import moe_permute, moe_unpermute, oracle


def unpermute_on(backend, rows, rowmap, routemap, probs, num_tokens, num_experts, **flags):
    dev = backend.to_device
    outputs = moe_unpermute(
        dev(rows), dev(rowmap), dev(routemap), dev(probs), num_tokens, num_experts, **flags
    )
    return tuple(backend.to_host(x) for x in outputs)


def check_against_oracle(backend, rows, rowmap, routemap, probs, num_tokens, num_experts, **flags):
    oracle_flags = {k: v for k, v in flags.items() if k != "validate"}
    (expected, expected_probs), status = oracle.unpermute(
        rows, rowmap, routemap, probs, num_tokens, num_experts, **oracle_flags
    )
    if flags.get("validate", True):
        assert (status == -1).all(), f"case meant to be valid has status {status}"
    combined, slot_probs = unpermute_on(
        backend, rows, rowmap, routemap, probs, num_tokens, num_experts, **flags
    )
    assert_same_bits(slot_probs, expected_probs, "expert_prob_topk")
    if backend.exact_fma or not flags.get("using_weighted_combine", False):
        assert_same_bits(combined, expected, "hidden_states")
    else:
        magnitude = oracle.unpermute(
            np.abs(rows.astype(np.float32)),
            rowmap,
            routemap,
            np.abs(probs),
            num_tokens,
            num_experts,
            using_weighted_combine=True,
        )[0][0]
        assert_close_combine(combined, expected, magnitude, num_experts, "hidden_states")
    return combined, slot_probs


def routed_rows(rng, num_tokens, topk, num_experts, alignment, dtype, hidden):
    """A permuted buffer (through the oracle) and its maps."""
    routemap = random_routing(rng, num_tokens, topk, num_experts)
    x = random_values(rng, (num_tokens, hidden), dtype)
    probs = random_probs(rng, (num_tokens, topk))
    (rows, rowmap, row_probs, _), _ = oracle.permute(
        x, None, routemap, probs, num_experts, counts_of(routemap, num_experts), alignment
    )
    rows = random_values(rng, rows.shape, dtype)  # expert outputs differ from their inputs
    return rows, rowmap, routemap, row_probs


@st.composite
def unpermute_cases(draw, small):
    return dict(
        num_tokens=draw(st.integers(0, 8 if small else 200)),
        hidden=draw(st.integers(1, 6 if small else 200)),
        num_experts=draw(st.integers(1, 5 if small else 64)),
        topk=draw(st.integers(1, 4 if small else 16)),
        alignment=draw(st.integers(1, 3 if small else 16)),
        dtype=draw(st.sampled_from(COMBINE_DTYPES)),
        weighted=draw(st.booleans()),
        mix_precision=draw(st.booleans()),
        malformed=draw(st.booleans()),
        prob_column=draw(st.booleans()),
        routemap_dtype=draw(st.sampled_from([np.int32, np.int64])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_cases_match_oracle(backend, data):
    case = data.draw(unpermute_cases(small=backend.small))
    rng = np.random.default_rng(case["seed"])
    t, e = case["num_tokens"], case["num_experts"]
    rows, rowmap, routemap, probs = routed_rows(
        rng, t, case["topk"], e, case["alignment"], case["dtype"], case["hidden"]
    )
    routemap = routemap.astype(case["routemap_dtype"])
    if case["malformed"]:
        r = rows.shape[0]
        wrong = rng.random(rowmap.shape) < 0.1
        rowmap[wrong] = rng.integers(-5, r + 5, rowmap.shape)[wrong]
        bad_ids = rng.random(routemap.shape) < 0.1
        routemap[bad_ids] = rng.integers(-4, e + 4, routemap.shape)[bad_ids]
    if case["prob_column"]:
        probs = probs.reshape(-1, 1)
    check_against_oracle(
        backend,
        rows,
        rowmap,
        routemap,
        probs,
        t,
        e,
        using_weighted_combine=case["weighted"],
        using_mix_precision=case["mix_precision"],
        validate=not case["malformed"],
    )


@pytest.mark.parametrize("dtype", COMBINE_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("weighted", [False, True], ids=["sum", "weighted"])
@pytest.mark.parametrize("mix_precision", [True, False], ids=["mixed", "native"])
def test_flags_and_dtypes(backend, dtype, weighted, mix_precision):
    rng = np.random.default_rng(10)
    t, k, e, h = (6, 3, 4, 5) if backend.small else (120, 6, 12, 67)
    rows, rowmap, routemap, probs = routed_rows(rng, t, k, e, 2, dtype, h)
    check_against_oracle(
        backend,
        rows,
        rowmap,
        routemap,
        probs,
        t,
        e,
        using_weighted_combine=weighted,
        using_mix_precision=mix_precision,
    )


def test_round_trip_recovers_tokens(backend):
    """One expert per token, unweighted: unpermute(permute(x)) == x, bit for bit."""
    rng = np.random.default_rng(11)
    t, h, e = (6, 4, 3) if backend.small else (300, 65, 16)
    x = random_values(rng, (t, h), ml_dtypes.bfloat16, special=0.0)
    routemap = np.full((t, 2), -1, np.int32)
    routemap[:, 1] = rng.integers(0, e, t)
    probs = random_probs(rng, (t, 2))
    dev = backend.to_device
    rows, rowmap, row_probs, _ = moe_permute(
        dev(x), None, dev(routemap), dev(probs), e, counts_of(routemap, e).tolist(), 4
    )
    combined, slot_probs = moe_unpermute(rows, rowmap, dev(routemap), row_probs, t, e)
    assert_same_bits(backend.to_host(combined), x, "round trip")
    np.testing.assert_array_equal(backend.to_host(slot_probs)[:, 1], probs[:, 1])
    assert not backend.to_host(slot_probs)[:, 0].any()


def test_empty_buffer_and_tokens_without_rows(backend):
    rng = np.random.default_rng(12)
    rows = np.zeros((0, 3), ml_dtypes.bfloat16)
    rowmap = np.full((4, 2), -1, np.int32)
    routemap = np.array([[0, -1], [1, 0], [-1, -1], [1, -1]], np.int32)
    combined, slot_probs = check_against_oracle(
        backend, rows, rowmap, routemap, np.zeros(0, np.float32), 4, 2, using_weighted_combine=True
    )
    assert not combined.view(np.uint16).any() and not slot_probs.any()
    assert combined.shape == (4, 3)
    x = random_bits(rng, (3, 2), np.float32)
    check_against_oracle(
        backend,
        x,
        np.full((0, 2), -1, np.int32),
        np.zeros((0, 1), np.int32),
        random_probs(rng, (3,)),
        0,
        2,
    )


def test_nan_results_are_canonical(backend):
    rows = np.array([[np.nan, -np.nan, np.inf, 1.0], [1.0, 2.0, -np.inf, np.nan]], np.float32)
    rows[0, 0] = np.frombuffer(np.uint32(0xFFC00001).tobytes(), np.float32)[0]
    rowmap = np.array([[0, 1]], np.int32)
    routemap = np.array([[0, 1]], np.int32)
    probs = np.array([0.5, 0.25], np.float32)
    for dtype in COMBINE_DTYPES:
        combined, _ = check_against_oracle(
            backend, rows.astype(dtype), rowmap, routemap, probs, 1, 2, using_weighted_combine=True
        )
        assert np.isnan(combined.astype(np.float32)).all()


def test_cpu_threads_do_not_change_bits():
    import moe_cpu

    rng = np.random.default_rng(13)
    rows, rowmap, routemap, probs = routed_rows(rng, 1500, 8, 32, 4, ml_dtypes.bfloat16, 40)
    results = []
    try:
        for threads in (1, 2):
            moe_cpu.set_num_threads(threads)
            results.append(
                moe_unpermute(rows, rowmap, routemap, probs, 1500, 32, using_weighted_combine=True)
            )
    finally:
        moe_cpu.set_num_threads(None)
    for a, b in zip(*results, strict=True):
        assert_same_bits(a, b)
