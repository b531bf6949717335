"""moe_permute on every backend, bit for bit against the NumPy oracle."""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _backends import examples
from _cases import (
    FLOAT8,
    HIDDEN_DTYPES,
    assert_same_bits,
    counts_of,
    random_bits,
    random_probs,
    random_routing,
)
from moe_numba import moe_permute, oracle
from moe_numba._demo import docs_example_inputs

OUTPUT_NAMES = (
    "hidden_states_unzipped",
    "zipped_expertwise_rowmap",
    "token_prob_unzipped",
    "scale_unzipped",
)


def permute_on(
    backend, hidden, scale, routemap, probs, num_experts, tokens_per_expert, alignment, **flags
):
    """Run moe_permute on ``backend``'s arrays; outputs come back as NumPy arrays."""
    dev = backend.to_device
    outputs = moe_permute(
        dev(hidden),
        None if scale is None else dev(scale),
        dev(routemap),
        dev(probs),
        num_experts,
        tokens_per_expert,
        alignment,
        **flags,
    )
    return tuple(backend.to_host(x) for x in outputs)


def check_against_oracle(
    backend, hidden, scale, routemap, probs, num_experts, tokens_per_expert, alignment, **flags
):
    """Outputs of ``backend`` equal the oracle's in every bit; returns them."""
    oracle_flags = {k: v for k, v in flags.items() if k not in ("validate", "using_ue8m0_scale")}
    expected, status = oracle.permute(
        hidden,
        scale,
        routemap,
        probs,
        num_experts,
        tokens_per_expert,
        alignment,
        **oracle_flags,
    )
    if flags.get("validate", True):
        assert (status == -1).all(), f"case meant to be valid has status {status}"
    actual = permute_on(
        backend, hidden, scale, routemap, probs, num_experts, tokens_per_expert, alignment, **flags
    )
    names = OUTPUT_NAMES
    names += ("expert_indices",) if flags.get("return_expert_indices") else ()
    names += ("expert_offsets",) if flags.get("return_expert_offsets") else ()
    assert len(actual) == len(expected) == len(names)
    for name, a, b in zip(names, actual, expected, strict=True):
        assert_same_bits(a, b, name)
    return actual


def test_paddle_docs_example(backend):
    """3 tokens, H=128, topk 8, 3 experts, tokens_per_expert [1, 2, 1], alignment 2."""
    hidden, routemap, probs = docs_example_inputs()
    rows, rowmap, row_probs, scale, indices, ends = check_against_oracle(
        backend,
        hidden,
        None,
        routemap,
        probs,
        3,
        [1, 2, 1],
        2,
        return_expert_indices=True,
        return_expert_offsets=True,
    )
    assert rows.shape == (6, 128)
    np.testing.assert_array_equal(ends, [2, 4, 6])
    assert ends.dtype == np.int32
    np.testing.assert_array_equal(rowmap, [[0, -1, 4], [-1, 2, -1], [-1, 3, -1]])
    np.testing.assert_array_equal(indices, [0, -1, 1, 1, 2, -1])
    np.testing.assert_array_equal(
        row_probs, [probs[0, 5], 0, probs[1, 3], probs[2, 0], probs[0, 1], 0]
    )
    assert_same_bits(rows[[0, 2, 3, 4]], hidden[[0, 1, 2, 0]], "rows")
    assert not rows[[1, 5]].view(np.uint16).any()
    assert scale.shape == (0,) and scale.dtype == np.float32


@st.composite
def permute_cases(draw, small, float8=True):
    """Random shapes, dtypes (float8 only where the library has it), flags and one of four
    ways to size the buffer."""
    num_tokens = draw(st.integers(0, 10 if small else 300))
    hidden = draw(st.integers(1, 7 if small else 300))
    num_experts = draw(st.integers(1, 6 if small else 300))
    topk = draw(st.integers(1, 5 if small else 24))
    alignment = draw(st.integers(1, 4 if small else 256))
    alignment = min(alignment, max(1, 30000 // num_experts))  # keeps R * H affordable
    return dict(
        num_tokens=num_tokens,
        hidden=hidden,
        num_experts=num_experts,
        topk=topk,
        alignment=alignment,
        dtype=draw(
            st.sampled_from([d for d in HIDDEN_DTYPES if float8 or np.dtype(d) not in FLOAT8])
        ),
        mode=draw(st.sampled_from(["exact", "capacity", "override", "malformed"])),
        scale=draw(st.sampled_from([None, "float32", "ue8m0"])),
        do_gather=draw(st.booleans()),
        return_expert_indices=draw(st.booleans()),
        return_expert_offsets=draw(st.booleans()),
        routemap_dtype=draw(st.sampled_from([np.int32, np.int64])),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def build_permute_case(case):
    """Arrays and arguments of a drawn case; validate only where the case is well-formed."""
    rng = np.random.default_rng(case["seed"])
    t, h, e, k = case["num_tokens"], case["hidden"], case["num_experts"], case["topk"]
    malformed = case["mode"] == "malformed"
    routemap = random_routing(
        rng,
        t,
        k,
        e,
        dtype=case["routemap_dtype"],
        bad=0.1 if malformed else 0.0,
        repeats=0.2 if malformed else 0.0,
    )
    counts = counts_of(routemap, e)
    hidden = random_bits(rng, (t, h), case["dtype"])
    scale = None
    if case["scale"] == "float32" or (case["scale"] is None and np.dtype(case["dtype"]) in FLOAT8):
        scale = random_bits(rng, (t, -(-h // 128)), np.float32)
    elif case["scale"] == "ue8m0":
        scale = random_bits(rng, (t, max(1, -(-h // 512))), np.int32)
    flags = dict(
        do_gather=case["do_gather"],
        return_expert_indices=case["return_expert_indices"],
        return_expert_offsets=case["return_expert_offsets"],
        using_ue8m0_scale=case["scale"] == "ue8m0",
        validate=case["mode"] == "exact",
    )
    tokens_per_expert = counts.tolist()
    if case["mode"] in ("capacity", "malformed"):
        tokens_per_expert = np.maximum(0, counts + rng.integers(-3, 4, e)).tolist()
    elif case["mode"] == "override":
        needed = int(oracle.padded_rows(counts, case["alignment"]).sum())
        flags["override_buffer_size"] = int(rng.integers(0, needed + 2 * case["alignment"] + 1))
        flags["validate"] = flags["override_buffer_size"] >= needed
    probs = random_probs(rng, (t, k))
    return (hidden, scale, routemap, probs, e, tokens_per_expert, case["alignment"]), flags


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_cases_match_oracle(backend, data):
    case = data.draw(permute_cases(small=backend.small, float8=backend.supports_float8))
    args, flags = build_permute_case(case)
    check_against_oracle(backend, *args, **flags)


@pytest.mark.parametrize("dtype", HIDDEN_DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_dtype_keeps_every_bit(backend, dtype):
    if not backend.supports_float8 and np.dtype(dtype) in FLOAT8:
        pytest.skip(f"{backend.name} has no float8 dtype")
    rng = np.random.default_rng(1)
    t, h, e, k = (6, 5, 3, 2) if backend.small else (64, 33, 8, 4)
    routemap = random_routing(rng, t, k, e)
    hidden = random_bits(rng, (t, h), dtype)  # NaN payloads, -0.0, subnormals
    scale = random_bits(rng, (t, 2), np.float32)
    check_against_oracle(
        backend,
        hidden,
        scale,
        routemap,
        random_probs(rng, (t, k)),
        e,
        counts_of(routemap, e).tolist(),
        3,
        return_expert_indices=True,
    )


def test_override_pads_extra_rows_and_drops_overflow(backend):
    rng = np.random.default_rng(2)
    t, h, e, k = (8, 3, 3, 2) if backend.small else (100, 17, 5, 3)
    routemap = random_routing(rng, t, k, e, empty=0.0)
    args = (
        random_bits(rng, (t, h), np.float32),
        None,
        routemap,
        random_probs(rng, (t, k)),
        e,
        None,
        2,
    )
    padded = oracle.padded_rows(counts_of(routemap, e), 2)
    needed = int(padded.sum())
    for rows in (needed + 5, needed, needed // 2, 0):
        *_, ends = check_against_oracle(
            backend,
            *args,
            override_buffer_size=rows,
            return_expert_indices=True,
            return_expert_offsets=True,
            validate=rows >= needed,
        )
        # each expert's block ends where its padded count says, cut at the buffer's end
        np.testing.assert_array_equal(ends, np.minimum(np.cumsum(padded), rows))


def test_do_gather_false_keeps_maps(backend):
    rng = np.random.default_rng(3)
    t, h, e, k = (7, 4, 3, 2) if backend.small else (50, 9, 6, 3)
    routemap = random_routing(rng, t, k, e)
    hidden = random_bits(rng, (t, h), ml_dtypes.float8_e4m3fn)
    if not backend.supports_float8:
        hidden = random_bits(rng, (t, h), ml_dtypes.bfloat16)
    probs = random_probs(rng, (t, k))
    outputs = check_against_oracle(
        backend,
        hidden,
        None,
        routemap,
        probs,
        e,
        counts_of(routemap, e).tolist(),
        4,
        do_gather=False,
        return_expert_indices=True,
    )
    assert outputs[0].shape == (0, h) and outputs[3].shape == (0,)


def test_edge_shapes(backend):
    rng = np.random.default_rng(4)
    cases = [
        (0, 3, 2, 2),  # no tokens
        (5, 1, 1, 1),  # H = 1, one expert, topk 1
        (4, 3, 2, 5),  # K > E: -1 slots
    ]
    for t, h, e, k in cases:
        routemap = random_routing(rng, t, k, e)
        check_against_oracle(
            backend,
            random_bits(rng, (t, h), ml_dtypes.bfloat16),
            None,
            routemap,
            random_probs(rng, (t, k)),
            e,
            counts_of(routemap, e).tolist(),
            3,
        )
    all_empty = np.full((3, 2), -1, np.int32)
    check_against_oracle(
        backend,
        random_bits(rng, (3, 2), np.float16),
        None,
        all_empty,
        random_probs(rng, (3, 2)),
        2,
        [0, 0],
        4,
        return_expert_indices=True,
    )


def test_many_experts_and_slots():
    """E = 1024, K = 64 on the CPU (the simulator covers small E; the GPU run covers both)."""
    rng = np.random.default_rng(5)
    from _backends import BACKENDS

    routemap = random_routing(rng, 40, 64, 1024, empty=0.1)
    check_against_oracle(
        BACKENDS["cpu"],
        random_bits(rng, (40, 3), ml_dtypes.bfloat16),
        None,
        routemap,
        random_probs(rng, (40, 64)),
        1024,
        counts_of(routemap, 1024).tolist(),
        1,
        return_expert_indices=True,
    )


def test_inputs_are_not_modified(backend):
    rng = np.random.default_rng(6)
    t, h, e, k = (6, 3, 3, 3) if backend.small else (40, 8, 4, 3)
    routemap = random_routing(rng, t, k, e, bad=0.2, repeats=0.3)
    hidden = random_bits(rng, (t, h), ml_dtypes.bfloat16)
    scale = random_bits(rng, (t, 1), np.float32)
    probs = random_probs(rng, (t, k))
    inputs = [routemap, hidden, scale, probs]
    device_inputs = [backend.to_device(x) for x in inputs]
    moe_permute(
        device_inputs[1],
        device_inputs[2],
        device_inputs[0],
        device_inputs[3],
        e,
        [1] * e,
        2,
        validate=False,
    )
    for before, after in zip(inputs, device_inputs, strict=True):
        assert_same_bits(backend.to_host(after), before, "input")


def test_cpu_threads_do_not_change_bits():
    import moe_cpu

    rng = np.random.default_rng(7)
    routemap = random_routing(rng, 2000, 6, 40, bad=0.05, repeats=0.1)
    hidden = random_bits(rng, (2000, 24), ml_dtypes.bfloat16)
    probs = random_probs(rng, (2000, 6))
    capacities = np.maximum(0, counts_of(routemap, 40) - 3).tolist()
    results = []
    try:
        for threads in (1, 2):
            moe_cpu.set_num_threads(threads)
            assert moe_cpu.get_num_threads() == (threads if moe_cpu.openmp_enabled() else 1)
            results.append(
                moe_permute(
                    hidden,
                    None,
                    routemap,
                    probs,
                    40,
                    capacities,
                    8,
                    return_expert_indices=True,
                    validate=False,
                )
            )
    finally:
        moe_cpu.set_num_threads(None)
    for a, b in zip(*results, strict=True):
        assert_same_bits(a, b)
