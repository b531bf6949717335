"""The CPU backend's permute through its real glue (``moe_numba._cpu``), bit for bit against
the oracle; the tables moe_cpu shares with the API; thread control.

The public API and the backend-parametrised suite live elsewhere; these tests plan a call
with the contract, run ``_cpu.permute`` with an allocator that fills every output and status
word with garbage (so that an element the backend forgets to write shows up), and compare
everything with ``moe_numba.oracle``. ``moe_cpu.permute`` is called directly where the glue
would not pass the arguments (shape errors, saturation). The unpermute's tests are in
``test_cpu_unpermute.py``.
"""

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import moe_cpu
from _cases import FLOAT8, HIDDEN_DTYPES, bits, counts_of, garbage, plan_of
from moe_cpu._parallel import copy_rows
from moe_numba import abi, backends, oracle
from moe_numba.ops import PERMUTE, PermuteArrays

HYPOTHESIS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(autouse=True)
def default_threads():
    yield
    moe_cpu.set_num_threads(None)


def test_moe_cpu_tables_equal_the_api_tables():
    assert moe_cpu.STATUS_SLOTS == abi.STATUS_SLOTS
    assert moe_cpu.DATA_TYPES == abi.DATA_TYPES
    abi.check_tables("moe_cpu", moe_cpu.STATUS_SLOTS, moe_cpu.DATA_TYPES)
    # every op's slots are in the checked table (an op whose prefix abi._OPS lacks is not)
    ops = {name for name in vars(abi) if name.endswith("_STATUS_LEN")}
    assert ops == {
        "PERMUTE_STATUS_LEN",
        "UNPERMUTE_STATUS_LEN",
        "UNPERMUTE_BACKWARD_STATUS_LEN",
        "SORT_STATUS_LEN",
    }
    assert ops <= abi.STATUS_SLOTS.keys()


def test_a_table_that_differs_is_an_import_error():
    slots = dict(moe_cpu.STATUS_SLOTS, PERMUTE_MISMATCH=9)
    del slots["UNPERMUTE_BAD_ROW"]
    with pytest.raises(
        ImportError,
        match=r"moe_cpu was built from other sources than moe_numba "
        r"\(STATUS_SLOTS\['PERMUTE_MISMATCH'\] is 4 in moe_numba.abi but 9 in moe_cpu; "
        r"STATUS_SLOTS\['UNPERMUTE_BAD_ROW'\] is 2 in moe_numba.abi but None in moe_cpu\)",
    ):
        abi.check_tables("moe_cpu", slots, moe_cpu.DATA_TYPES)
    with pytest.raises(ImportError, match=r"DATA_TYPES\['DATA_FLOAT16'\] is 2 .* but 5 in moe_cpu"):
        abi.check_tables("moe_cpu", moe_cpu.STATUS_SLOTS, dict(moe_cpu.DATA_TYPES, DATA_FLOAT16=5))


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
    """``_cpu.permute`` on a plan made by the contract, into garbage-filled outputs.

    Returns the output tuple and the status words (None with ``validate=False``).
    """
    arrays = PermuteArrays(hidden, scale, routemap, probs)
    plan = plan_of(
        PERMUTE,
        arrays,
        tokens_per_expert,
        num_experts=num_experts,
        padding_alignment=alignment,
        do_gather=do_gather,
        using_ue8m0_scale=scale is not None and scale.dtype == np.int32,
        return_expert_indices=return_expert_indices,
        override_buffer_size=override_buffer_size,
        validate=validate,
    )
    outputs, status = backends.cpu_backend().permute(plan, arrays, garbage)
    return outputs.result(), status


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
    """Both validate modes against the oracle; returns the oracle's status.

    ``validate=False`` writes every output whatever the values; ``validate=True`` returns the
    status words, and writes the outputs only where they report nothing.
    """
    args = (hidden, scale, routemap, probs, num_experts, tokens_per_expert, alignment)
    kwargs = dict(
        do_gather=do_gather,
        return_expert_indices=return_expert_indices,
        override_buffer_size=override_buffer_size,
    )
    expected, expected_status = oracle.permute(*args, **kwargs)
    got, status = cpu_permute(*args, **kwargs, validate=False)
    assert status is None
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
        needed = int(oracle.padded_rows(counts, alignment).sum())
        override = max(0, needed + draw(st.integers(-6, 6)))
    dtype = np.dtype(draw(st.sampled_from(HIDDEN_DTYPES)))
    do_gather = draw(st.booleans()) or draw(st.booleans())
    scale = None
    # the contract requires a scale with float8 rows that are gathered
    if draw(st.booleans()) or (do_gather and dtype in FLOAT8):
        scale_dtype = draw(st.sampled_from([np.float32, np.int32]))
        scale = random_bits(rng, (T, draw(st.integers(1, 3))), scale_dtype)
    return dict(
        hidden=random_bits(rng, (T, H), dtype),
        scale=scale,
        routemap=routemap,
        probs=random_bits(rng, (T, K), np.float32),
        num_experts=E,
        tokens_per_expert=tokens_per_expert,
        alignment=alignment,
        do_gather=do_gather,
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
        # validate=False: every output; validate=True: the status words (they report errors)
        results.append(
            [
                cpu_permute(*args, counts, 4, override_buffer_size=override, validate=validate)
                for override in (-1, 2000)
                for validate in (False, True)
            ]
        )
        if threads == 2:
            check_permute(*args, counts, 4)
    for other in results[1:]:
        for (a, sa), (b, sb) in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(sa, sb)
            for x, y in zip(a, b, strict=True):
                np.testing.assert_array_equal(bits(x), bits(y))
    assert results[0][1][1][abi.PERMUTE_BAD_ID] == 1700 * 5 + 2


def test_permute_streamed_outputs():
    """Outputs of 8 MiB and more are written with streaming stores (x86-64): odd row and
    scale widths, padding, malformed routing, capacities that drop rows and a buffer too
    small, each against the oracle."""
    rng = np.random.default_rng(9)
    T, K, E, H = 600, 4, 8, 4101
    routemap = distinct_routes(rng, T, K, E).astype(np.int32)
    routemap[17, 1] = E + 2
    routemap[40, 3] = routemap[40, 0]
    hidden = random_bits(rng, (T, H), ml_dtypes.float8_e4m3fn)
    scale = random_bits(rng, (T, 33), np.float32)
    probs = random_bits(rng, (T, K), np.float32)
    counts = counts_of(routemap, E)
    assert (counts.sum() + 16 * E) * (H + 33 * 4) >= 8 << 20
    check_permute(hidden, scale, routemap, probs, E, counts, 16)
    fewer = np.maximum(counts - rng.integers(0, 30, E), 0)  # rows dropped
    check_permute(hidden, scale, routemap, probs, E, fewer, 16)
    check_permute(hidden, scale, routemap, probs, E, None, 16, override_buffer_size=2000)


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
    assert status[abi.PERMUTE_BAD_ID] == 5 and status[abi.PERMUTE_BAD_ID_VALUE] == 9
    assert status[abi.PERMUTE_DUPLICATE] == 4 and status[abi.PERMUTE_DUPLICATE_VALUE] == 2
    assert status[abi.PERMUTE_MISMATCH] == 1
    assert status[abi.PERMUTE_MISMATCH_COUNT] == counts[1]
    assert status[abi.PERMUTE_ROWS_NEEDED] == -1
    status = check_permute(hidden, None, routemap, probs, E, None, 3, override_buffer_size=5)
    assert status[abi.PERMUTE_ROWS_NEEDED] == 6 + 3 * 3 and status[abi.PERMUTE_MISMATCH] == -1


def test_permute_extreme_ids():
    routemap = np.array([[-1, 2**40], [-(2**40), 0]], np.int64)
    probs = np.ones((2, 2), np.float32)
    status = check_permute(np.ones((2, 1), np.float32), None, routemap, probs, 2, [1, 0], 1)
    assert status[abi.PERMUTE_BAD_ID_VALUE] == 2**40
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
    status = np.empty(abi.PERMUTE_STATUS_LEN, np.int64)
    row_probs = np.empty(5, np.float32)
    for cap, alignment in [(capacity, 3), (None, 2**62), (capacity, 2**62 + 1)]:
        moe_cpu.permute(
            bits(hidden),
            None,
            routemap,
            probs,
            cap,
            out,
            None,
            rowmap,
            row_probs,
            None,
            None,
            status,
            alignment=alignment,
            validate=False,
        )
        assert rowmap[0, 0] == 0 and rowmap[1, 0] == 1
        assert (rowmap[:, 1] == -1).all() and (out[2:] == 0).all()
        if cap is None:  # the sum of padded rows saturates
            assert status[abi.PERMUTE_ROWS_NEEDED] == np.iinfo(np.int64).max


def permute_arguments(T=3, K=2, E=4, R=6, hb=8, sb=4):
    """Consistent arguments of moe_cpu.permute (rows and scale rows gathered)."""
    return dict(
        hidden=np.zeros((T, hb), np.uint8),
        scale=np.zeros((T, sb), np.uint8),
        routemap=np.full((T, K), -1, np.int32),
        probs=np.zeros((T, K), np.float32),
        capacity=np.zeros(E, np.int64),
        out_hidden=np.empty((R, hb), np.uint8),
        out_scale=np.empty((R, sb), np.uint8),
        out_rowmap=np.empty((T, E), np.int32),
        out_probs=np.empty(R, np.float32),
        out_indices=np.empty(R, np.int32),
        out_offsets=np.empty(E, np.int32),
        status=np.empty(abi.PERMUTE_STATUS_LEN, np.int64),
    )


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("probs", np.zeros((3, 3), np.float32), r"probs must have shape \[T, K\] = \(3, 2\); "),
        ("out_rowmap", np.zeros((2, 4), np.int32), r"out_rowmap must have shape \[T, E\] = "),
        ("capacity", np.zeros(5, np.int64), r"capacity must have shape \[E\] = \(4,\); got"),
        ("hidden", np.zeros((4, 8), np.uint8), r"hidden must have shape \[T, hb\] = \(3, 8\)"),
        ("out_hidden", np.zeros((6, 7), np.uint8), r"out_hidden must have shape \[R, hb\] = "),
        ("scale", np.zeros((2, 4), np.uint8), r"scale must have shape \[T, sb\] = \(3, 4\)"),
        ("out_scale", np.zeros((5, 4), np.uint8), r"out_scale must have shape \[R, sb\] = "),
        ("out_indices", np.zeros(7, np.int32), r"out_indices must have shape \[R\] = \(6,\)"),
        ("out_offsets", np.zeros(3, np.int32), r"out_offsets must have shape \[E\] = \(4,\)"),
        ("status", np.zeros(8, np.int64), r"status must have shape \[PERMUTE_STATUS_LEN\]"),
        (
            "out_hidden",
            None,
            "hidden and out_hidden must both be arrays or both be None; "
            "got hidden=an array, out_hidden=None",
        ),
        (
            "scale",
            None,
            "scale and out_scale must both be arrays or both be None; "
            "got scale=None, out_scale=an array",
        ),
    ],
)
def test_permute_shapes_must_agree(name, value, message):
    args = permute_arguments()
    args[name] = value
    with pytest.raises(ValueError, match=message):
        moe_cpu.permute(**args, alignment=1, validate=False)


def test_permute_alignment_below_one():
    with pytest.raises(ValueError, match="alignment must be >= 1; got 0"):
        moe_cpu.permute(**permute_arguments(), alignment=0, validate=False)
    moe_cpu.permute(**permute_arguments(), alignment=1, validate=False)


def test_the_glue_allocates_every_output_and_status_word_with_empty():
    """``empty=`` serves every array the glue makes (so garbage would show up anywhere)."""
    requests = []

    def recording(shape, dtype):
        requests.append((tuple(shape), np.dtype(dtype)))
        return garbage(shape, dtype)

    hidden = np.ones((3, 2), ml_dtypes.bfloat16)
    arrays = PermuteArrays(
        hidden, np.ones((3, 1), np.float32), np.zeros((3, 1), np.int32), np.ones((3, 1), np.float32)
    )
    plan = plan_of(
        PERMUTE, arrays, [3, 0], num_experts=2, padding_alignment=2, return_expert_indices=True
    )
    outputs, status = backends.cpu_backend().permute(plan, arrays, recording)
    assert requests == [
        ((4, 2), np.dtype(ml_dtypes.bfloat16)),
        ((3, 2), np.dtype(np.int32)),
        ((4,), np.dtype(np.float32)),
        ((4, 1), np.dtype(np.float32)),
        ((4,), np.dtype(np.int32)),
        ((abi.PERMUTE_STATUS_LEN,), np.dtype(np.int64)),
    ]
    assert (status == -1).all() and outputs.result()[1].tolist() == [[0, -1], [1, -1], [2, -1]]


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
    copy_rows(src, dst)
    np.testing.assert_array_equal(dst, src)
    src2d = src[: size // 2 * 2].reshape(-1, 2) if size > 1 else src.reshape(-1, 1)
    dst2d = garbage(src2d.shape, np.uint8)
    copy_rows(src2d, dst2d)
    np.testing.assert_array_equal(dst2d, src2d)
    with pytest.raises(ValueError, match=f"dst must have {size} elements, got {size + 1}"):
        copy_rows(src, np.empty(size + 1, np.uint8))
