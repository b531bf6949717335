"""The GPU backend (``moe_numba._gpu`` and the kernels behind it) in numba's CUDA simulator,
bit for bit against the NumPy oracle (the intrinsics' twins: tests/test_cuda_intrinsics.py).

The kernels' settings shrink the blocks (``moe_numba.kernels.use_settings``) so that tiny
inputs still span several token chunks, expert tiles, destination batches, padding blocks
and list overflows. Outputs and scratch come from a poisoning allocator passed to the backend
(``empty=``), so an element a kernel forgets to write shows up as a mismatch. The simulator's
``cuda.fma`` rounds twice; it is replaced here by a correctly rounded fma so the weighted
combine is compared exactly too.
"""

import ml_dtypes
import numpy as np
import pytest
from numba import config, cuda

pytestmark = pytest.mark.sim  # calls the kernels with host arrays (conftest skips it elsewhere)


from _cases import plan_of  # noqa: E402
from moe_numba import abi, oracle  # noqa: E402
from moe_numba.kernels import use_settings  # noqa: E402
from moe_numba.ops import PERMUTE, UNPERMUTE, PermuteArrays, UnpermuteArrays  # noqa: E402
from moe_numba.runtime import get_runtime  # noqa: E402

if config.ENABLE_CUDASIM:
    from moe_numba import _gpu  # noqa: E402
    from moe_numba.kernels import permute as PM  # noqa: E402
    from moe_numba.kernels import unpermute as UP  # noqa: E402

# Tiny blocks: a chunk is at most 32 tokens and 128 routing ids, a count block sees 4 experts,
# a gather warp has 4 lanes (4 destinations at a time) and holds 1 or 2 words per lane (rows
# go in several batches), padding goes in chunks of 3 rows to at least 2 workers (a worker
# takes several chunks when routing slots are empty), 5 blocks take every item, a token's list
# holds 256 rows (4 in two tests), the unpermute's check runs 3 blocks of 16 threads
# (grid-stride).
SMALL = dict(ct=32, etile=4, rmt=128, gather_lanes=4, batch_words=(1, 2), pad_rows=3)
SMALL.update(count_bd=16, scan_bd=64, gather_blocks=5, pad_workers=2, nc_target=2)
SMALL.update(combine_bd=16, min_bd=8, check_bd=16, check_blocks=3)


@pytest.fixture(autouse=True)
def small_geometry(monkeypatch):
    """Every test under :data:`SMALL` (no launch plan outlives the settings it was made
    for: ``use_settings`` forgets them on the way in and out), with an exact fma."""
    from numba.cuda.simulator import kernelapi

    def exact_fma(self, a, b, c):
        return np.float32(oracle.fma_float32(a, b, c))

    monkeypatch.setattr(kernelapi.FakeCUDAModule, "fma", exact_fma)
    with use_settings(**SMALL):
        yield


class Poisoned:
    """``empty(shape, dtype)`` for the backend: simulator arrays whose every byte is 0x5A.

    Records each allocation's dtype (scratch is the backend's only uint8 allocation).
    """

    def __init__(self):
        self.dtypes = []

    def __call__(self, shape, dtype):
        self.dtypes.append(np.dtype(dtype))
        a = np.empty(shape, dtype)
        a.reshape(-1).view(np.uint8)[:] = 0x5A
        return cuda.to_device(a)

    @property
    def scratch(self):
        return self.dtypes.count(np.dtype(np.uint8))


def device(a):
    return None if a is None else cuda.to_device(np.ascontiguousarray(a))


def bits(x):
    """The bit patterns of a host copy of ``x`` (same-sized unsigned integers)."""
    a = x.copy_to_host()
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def random_routemap(rng, T, K, E, dtype=np.int32, fill=0.8):
    rm = np.full((T, K), -1, dtype)
    for t in range(T):
        n = min(E, int(rng.binomial(K, fill)))
        rm[t, :n] = rng.choice(E, n, replace=False)
        rng.shuffle(rm[t])
    return rm


def counts_of(rm, E):
    c = np.zeros(E, np.int64)
    for row in rm:
        for e in {int(x) for x in row if 0 <= x < E}:
            c[e] += 1
    return c


def run_permute(
    hidden,
    scale,
    rm,
    probs,
    E,
    tpe,
    A,
    do_gather=True,
    indices=True,
    override=-1,
    backend=None,
    calls=None,
):
    """Run the GPU backend (validate on and off) and the oracle; assert every output and
    status word is identical (``indices``: the expert indices and the expert offsets asked
    for). Returns the status words.

    ``backend``: the GPU backend to run (default: the one in use); ``calls``: a list that
    gets each call's allocations (:class:`moe_numba._gpu._Call`, which says whether the call
    staged its capacities)."""
    backend = _gpu.gpu_backend() if backend is None else backend
    T, K = rm.shape
    (expected, status_expected) = oracle.permute(
        hidden, scale, rm, probs, E, tpe, A, do_gather, indices, override, indices
    )
    plan = plan_of(
        PERMUTE,
        PermuteArrays(hidden, scale, rm, probs),
        tpe,
        num_experts=E,
        padding_alignment=A,
        do_gather=do_gather,
        using_ue8m0_scale=scale is not None and scale.dtype == np.int32,
        return_expert_indices=indices,
        override_buffer_size=override,
        return_expert_offsets=indices,
    )
    assert plan.num_rows == expected[2].shape[0]
    arrays = PermuteArrays(device(hidden), device(scale), device(rm), device(probs))
    for validate in (True, False):
        empty = Poisoned()
        call = _gpu._Call(arrays.hidden_states, empty)
        if calls is not None:
            calls.append(call)
        out, status = backend.permute(plan._replace(validate=validate), arrays, call=call)
        assert empty.scratch == 1
        if validate:
            np.testing.assert_array_equal(status, status_expected)
        else:
            assert status is None
        np.testing.assert_array_equal(out.rowmap.copy_to_host(), expected[1])
        np.testing.assert_array_equal(bits(out.probs), expected[2].view(np.uint32))
        if do_gather:
            np.testing.assert_array_equal(bits(out.hidden), _bits_of(expected[0]))
        if plan.gather_scale:
            np.testing.assert_array_equal(bits(out.scale), expected[3].view(np.uint32))
        if indices:
            np.testing.assert_array_equal(out.indices.copy_to_host(), expected[4])
            np.testing.assert_array_equal(out.offsets.copy_to_host(), expected[5])
        else:
            assert out.indices is None and out.offsets is None
    return status_expected


def _bits_of(a):
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


# ---------------------------------------------------------------------------------------
# permute


def test_permute_bf16_odd_hidden_with_scale():
    rng = np.random.default_rng(0)
    T, K, E, H, A = 70, 6, 10, 5, 4  # 3 chunks, 3 expert tiles, 2 destination batches
    rm = random_routemap(rng, T, K, E)
    probs = rng.random((T, K), dtype=np.float32)
    hidden = rng.standard_normal((T, H)).astype(ml_dtypes.bfloat16)
    scale = rng.random((T, 3), dtype=np.float32)
    status = run_permute(hidden, scale, rm, probs, E, counts_of(rm, E), A)
    assert (status == -1).all()


def test_permute_wide_words_int64_routemap():
    rng = np.random.default_rng(1)
    T, K, E, H, A = 40, 3, 5, 16, 8  # bf16 rows of 32 bytes: 16-byte words; scale 8-byte
    rm = random_routemap(rng, T, K, E, np.int64)
    probs = rng.random((T, K), dtype=np.float32)
    hidden = rng.standard_normal((T, H)).astype(ml_dtypes.bfloat16)
    scale = rng.random((T, 2), dtype=np.float32)
    run_permute(hidden, scale, rm, probs, E, counts_of(rm, E), A)


@pytest.mark.parametrize("width", [3, 4, 11, 24], ids=lambda w: f"scale{w}")
def test_permute_scale_rows_shorter_and_longer_than_a_warp(width):
    """A warp loads the first LANES words of a scale row with the hidden row and the rest
    after placing it: rows of 3 4-byte words, one 16-byte word, 11 4-byte and 6 16-byte
    words (LANES = 4 here)."""
    rng = np.random.default_rng(width)
    T, K, E, H, A = 37, 3, 6, 32, 4
    rm = random_routemap(rng, T, K, E)
    probs = rng.random((T, K), dtype=np.float32)
    hidden = rng.integers(0, 256, (T, H), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    scale = rng.random((T, width), dtype=np.float32)
    run_permute(hidden, scale, rm, probs, E, counts_of(rm, E), A)


def test_permute_fp8_rows_and_special_bits():
    rng = np.random.default_rng(2)
    T, K, E, H, A = 33, 2, 3, 3, 3  # 3-byte rows: 1-byte words; alignment not a power of 2
    rm = random_routemap(rng, T, K, E)
    probs = rng.random((T, K), dtype=np.float32)
    probs[0, 0] = np.float32(-0.0)
    probs.view(np.uint32)[1, :] = 0x7FC01234  # NaN payloads survive
    hidden = rng.integers(0, 256, (T, H), dtype=np.uint8).view(ml_dtypes.float8_e4m3fn)
    scale = rng.random((T, 1), dtype=np.float32)
    run_permute(hidden, scale, rm, probs, E, counts_of(rm, E), A)


@use_settings(rmt=3)  # K > rmt: the count kernel reads routing from memory
def test_permute_malformed_routing_and_capacities():
    rng = np.random.default_rng(3)
    T, K, E, H, A = 50, 4, 6, 4, 2
    rm = random_routemap(rng, T, K, E, np.int64)
    rm[7, 1] = 99  # bad id
    rm[3, 3] = -7  # bad id (earlier)
    rm[9, :2] = [2, 2]  # repeated expert: the first slot counts
    rm[20, 0], rm[20, 3] = 4, 4
    probs = rng.random((T, K), dtype=np.float32)
    hidden = rng.standard_normal((T, H)).astype(np.float16)
    tpe = counts_of(rm, E)
    tpe[1] += 5  # more capacity than tokens: padding rows
    tpe[4] = max(0, tpe[4] - 3)  # less: the last tokens are dropped
    tpe[5] = 0
    status = run_permute(hidden, None, rm, probs, E, tpe, A)
    assert status[abi.PERMUTE_BAD_ID] == 3 * K + 3
    assert status[abi.PERMUTE_DUPLICATE] == 9 * K + 1
    assert status[abi.PERMUTE_MISMATCH] == 1


def test_permute_capacities_met_first_are_staged_then_copied():
    """Capacities met for the first time are read from host words (runtime._staged); from
    their second call on from a device copy, and on a stream being captured from host words
    kept for good. Every call matches the oracle (run_permute calls the backend twice:
    validate on, then off)."""
    rng = np.random.default_rng(11)
    T, K, E, H, A = 20, 2, 4, 2, 2
    rm = random_routemap(rng, T, K, E)
    probs = rng.random((T, K), dtype=np.float32)
    hidden = rng.standard_normal((T, H)).astype(np.float32)
    tpe = counts_of(rm, E)
    calls = []
    run_permute(hidden, None, rm, probs, E, tpe, A, calls=calls)
    assert [call.staged for call in calls] == [True, False]  # staged, then copied
    run_permute(hidden, None, rm, probs, E, tpe, A, calls=calls)
    assert [call.staged for call in calls[2:]] == [False, False]  # the copy serves them
    more = list(tpe)
    more[0] += 3
    # (the simulator captures no stream: a backend that is told every stream is captured)
    captured = _gpu._GPUBackend(capturing=lambda stream: True)
    run_permute(hidden, None, rm, probs, E, more, A, backend=captured, calls=calls)
    assert [call.staged for call in calls[4:]] == [False, False]
    assert len(captured._capacities) == 0  # kept for good, not cached:
    assert more in [list(words.sim_array) for words in get_runtime().kept.values()]


@pytest.mark.parametrize("rows", [0, 23, 200])
def test_permute_override(rows):
    rng = np.random.default_rng(4)
    T, K, E, H, A = 36, 3, 5, 2, 4
    rm = random_routemap(rng, T, K, E)
    probs = rng.random((T, K), dtype=np.float32)
    hidden = rng.standard_normal((T, H)).astype(np.float32)  # 8-byte rows
    status = run_permute(hidden, None, rm, probs, E, None, A, override=rows)
    needed = int((-(-counts_of(rm, E) // A) * A).sum())
    assert status[abi.PERMUTE_ROWS_NEEDED] == (needed if needed > rows else -1)


def test_permute_no_gather_no_indices():
    rng = np.random.default_rng(5)
    T, K, E, A = 40, 2, 7, 5
    rm = random_routemap(rng, T, K, E)
    probs = rng.random((T, K), dtype=np.float32)
    hidden = np.zeros((T, 6), ml_dtypes.bfloat16)
    run_permute(hidden, None, rm, probs, E, counts_of(rm, E), A, do_gather=False, indices=False)


def test_permute_single_expert_topk_above_experts():
    rng = np.random.default_rng(6)
    T, K, E, H = 20, 3, 1, 1
    rm = np.full((T, K), -1, np.int32)
    rm[::2, 1] = 0
    rm[1::4, 2] = 0
    probs = rng.random((T, K), dtype=np.float32)
    hidden = rng.standard_normal((T, H)).astype(ml_dtypes.bfloat16)
    run_permute(hidden, None, rm, probs, E, counts_of(rm, E), 1)


def test_permute_one_expert_one_slot():
    """Scratch arrays of one word each (a simulator copy-back once clobbered a neighbour)."""
    rm = np.zeros((6, 1), np.int32)
    probs = np.random.default_rng(8).random((6, 1), dtype=np.float32)
    hidden = np.arange(6, dtype=np.float32).reshape(6, 1)
    run_permute(hidden, None, rm, probs, 1, [6], 1)
    run_permute(hidden, None, rm, probs, 1, [6], 1, do_gather=False, indices=False)


@pytest.mark.parametrize("T", [32, 33])  # 32: one chunk (count_scan when validate=False)
def test_permute_one_block_and_chunked(T):
    rng = np.random.default_rng(T)
    K, E, H, A = 3, 4, 3, 2
    rm = random_routemap(rng, T, K, E)
    rm[5, 0] = 9  # bad id
    rm[7] = [2, 1, 1]  # repeated id
    probs = rng.random((T, K), dtype=np.float32)
    hidden = rng.standard_normal((T, H)).astype(np.float32)
    counts = counts_of(rm, E)
    status = run_permute(hidden, None, rm, probs, E, counts + [0, 1, 0, 3], A)
    assert status[abi.PERMUTE_BAD_ID] == 5 * K and status[abi.PERMUTE_DUPLICATE] == 7 * K + 2
    assert status[abi.PERMUTE_MISMATCH] == 1
    status = run_permute(hidden, None, rm, probs, E, None, A, override=5)
    assert status[abi.PERMUTE_ROWS_NEEDED] > 5


@use_settings(one_block_slots=64)
def test_permute_one_block_only_for_few_slots():
    """count_scan takes validate=False calls of one chunk up to one_block_slots slots; more
    slots (or validate) count in chunks."""

    def one_block(T, K, validate=False):
        return PM._plan_launches(
            T, K, 4, T * K, 4, 2, 4, 0, 32, validate, 1, False, False, False
        ).one_block

    assert one_block(32, 2) and not one_block(32, 3) and not one_block(32, 2, validate=True)
    rng = np.random.default_rng(13)
    rm = random_routemap(rng, 32, 3, 4)
    hidden = rng.standard_normal((32, 3)).astype(np.float32)
    probs = rng.random((32, 3), dtype=np.float32)
    run_permute(hidden, None, rm, probs, 4, counts_of(rm, 4), 2)


@pytest.mark.parametrize("extra", [0, 1, 2])
def test_permute_padding_chunks_span_many_experts(extra):
    """Runs of empty experts: a chunk of padding (3 rows) meets more experts than a warp (4
    lanes) lists in one round, and the expert past them is all padding."""
    rng = np.random.default_rng(11)
    T, K, E = 10, 1, 12
    rm = rng.choice([0, 6], size=(T, K)).astype(np.int32)
    probs = rng.random((T, K), dtype=np.float32)
    hidden = rng.standard_normal((T, 2)).astype(np.float32)
    tpe = counts_of(rm, E)
    tpe[0] += 1
    tpe[6] += extra  # moves expert 11's rows against the chunks
    tpe[3] = 1  # capacity without tokens
    tpe[11] = 2  # after four empty experts
    run_permute(hidden, None, rm, probs, E, tpe, 1)
    run_permute(hidden, None, rm, probs, E, None, 2, override=40)


@pytest.mark.parametrize("token_warps", [60, 4096], ids=["2parts", "4parts"])
def test_permute_rows_split_into_parts(token_warps):
    """Small calls split rows among warps: bf16 rows of 25 4-byte words in parts of 8 words
    (2 lanes' worth) whose last part is one word, or in 2 parts; part 0 writes the rowmap,
    probs, indices and scale rows; padding chunks of 1 row (3 // parts) or 3, malformed
    routing, dropped tokens and capacity without tokens."""
    with use_settings(part_batch=1, token_warps=token_warps):
        _permute_rows_split_into_parts(token_warps)


def _permute_rows_split_into_parts(token_warps):
    rng = np.random.default_rng(12)
    T, K, E, H, A = 30, 3, 7, 50, 4
    assert PM._row_parts(T, H // 2) == ((4, 8) if token_warps == 4096 else (2, 16))
    rm = random_routemap(rng, T, K, E, np.int64)
    rm[4, 1] = 70  # bad id
    probs = rng.random((T, K), dtype=np.float32)
    hidden = rng.standard_normal((T, H)).astype(ml_dtypes.bfloat16)
    scale = rng.random((T, 5), dtype=np.float32)
    tpe = counts_of(rm, E)
    tpe[2] += 9
    tpe[5] = max(0, tpe[5] - 2)
    run_permute(hidden, scale, rm, probs, E, tpe, A)
    run_permute(hidden, scale, rm, probs, E, None, A, override=50)


def test_permute_empty_routing_and_zero_tokens():
    rng = np.random.default_rng(7)
    rm = np.full((9, 2), -1, np.int32)
    probs = rng.random((9, 2), dtype=np.float32)
    hidden = rng.standard_normal((9, 3)).astype(np.float32)
    run_permute(hidden, None, rm, probs, 3, [0, 0, 0], 4)
    run_permute(hidden, None, rm, probs, 3, [0, 2, 0], 4)  # capacity without tokens: padding
    empty = np.zeros((0, 2), np.int32)
    run_permute(hidden[:0], None, empty, probs[:0], 3, [0, 0, 0], 4)
    run_permute(hidden[:0], None, empty, probs[:0], 3, [1, 0, 0], 4)


# ---------------------------------------------------------------------------------------
# unpermute


def run_unpermute(rows, rowmap, rm, probs, E, weighted, mix):
    """Run the GPU backend (validate on and off) and the oracle; assert every output and
    status word is identical. Returns the status words."""
    T, K = rm.shape
    R, H = rows.shape
    (expected, expected_probs), status_expected = oracle.unpermute(
        rows, rowmap, rm, probs, T, E, mix, weighted
    )
    plan = plan_of(
        UNPERMUTE,
        UnpermuteArrays(rows, rowmap, rm, probs),
        total_zipped_tokens=T,
        num_experts=E,
        using_mix_precision=mix,
        using_weighted_combine=weighted,
    )
    arrays = UnpermuteArrays(device(rows), device(rowmap), device(rm), device(probs))
    for validate in (True, False):
        empty = Poisoned()
        unpermute = _gpu.gpu_backend().unpermute
        (out, out_probs), status = unpermute(plan._replace(validate=validate), arrays, empty=empty)
        if validate:
            assert empty.scratch == 1  # check's minima and ticket
            np.testing.assert_array_equal(status, status_expected)
        else:
            assert empty.scratch == 0 and status is None
        np.testing.assert_array_equal(bits(out_probs), expected_probs.view(np.uint32))
        np.testing.assert_array_equal(bits(out), _bits_of(expected))
    return status_expected


def unzipped(rng, T, K, E, R, dtype, H, scale=1.0):
    """A permuted layout: rows, rowmap, routemap, probs."""
    rm = random_routemap(rng, T, K, E)
    rowmap = np.full((T, E), -1, np.int32)
    free = rng.permutation(R)
    i = 0
    for t in range(T):
        for e in rm[t]:
            if e >= 0 and i < R:
                rowmap[t, e] = free[i]
                i += 1
    rows = (rng.standard_normal((R, H)) * scale).astype(dtype)
    probs = rng.random(R, dtype=np.float32)
    return rows, rowmap, rm, probs


CASES = [  # (dtype, H): the row sizes pick 16-, 8-, 4- and 2-byte words
    (np.float32, 4),
    (np.float32, 2),
    (np.float32, 3),
    (ml_dtypes.bfloat16, 8),
    (ml_dtypes.bfloat16, 6),
    (ml_dtypes.bfloat16, 3),
    (np.float16, 12),
    (np.float16, 4),
    (np.float16, 1),
]


@pytest.mark.parametrize("weighted", [False, True], ids=["sum", "weighted"])
@pytest.mark.parametrize("mix", [True, False], ids=["mix", "nomix"])
@pytest.mark.parametrize(
    "dtype,H", CASES[::4] + CASES[1::4][:1], ids=lambda x: getattr(x, "__name__", str(x))
)
def test_unpermute_flags(dtype, H, weighted, mix):
    rng = np.random.default_rng(10 + H)
    rows, rowmap, rm, probs = unzipped(rng, 9, 4, 6, 30, dtype, H, scale=50.0)
    status = run_unpermute(rows, rowmap, rm, probs, 6, weighted, mix)
    assert (status == -1).all()


@pytest.mark.parametrize("dtype,H", CASES, ids=lambda x: getattr(x, "__name__", str(x)))
def test_unpermute_word_widths(dtype, H):
    rng = np.random.default_rng(20 + H)
    rows, rowmap, rm, probs = unzipped(rng, 6, 3, 5, 16, dtype, H)
    run_unpermute(rows, rowmap, rm, probs, 5, True, True)


# the simulated combine adds NumPy float32 scalars: sums past the largest float overflow to
# infinity, as they should (the simulator's threads do not see np.errstate)
@pytest.mark.filterwarnings("ignore:overflow encountered in scalar add:RuntimeWarning")
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_unpermute_special_values(dtype):
    """Subnormals, infinities, NaNs (made canonical) and overflow to infinity."""
    rng = np.random.default_rng(30)
    T, K, E, R, H = 6, 3, 4, 14, 8
    rows, rowmap, rm, probs = unzipped(rng, T, K, E, R, dtype, H)
    info = ml_dtypes.finfo(dtype)
    flat = rows.reshape(-1)
    flat[0::5] = np.asarray(info.smallest_subnormal, dtype)
    flat[1::7] = np.asarray(info.max, dtype)
    flat[2::11] = np.asarray(np.inf, dtype)
    flat[3::13] = np.asarray(-np.inf, dtype)
    flat[4::17] = np.asarray(np.nan, dtype)
    flat[5::19] = -np.asarray(info.tiny, dtype) * 3
    for weighted in (False, True):
        run_unpermute(rows, rowmap, rm, probs, E, weighted, True)
    run_unpermute(rows, rowmap, rm, probs, E, False, False)


@pytest.mark.parametrize("lmax", [256, 4], ids=["list", "list_overflow"])
@pytest.mark.parametrize(
    "dtype,H", [(ml_dtypes.bfloat16, 40), (np.float32, 7)], ids=["bf16", "f32"]
)
def test_unpermute_rows_split_into_parts(dtype, H, lmax):
    """Small calls split rows among blocks: 5 16-byte words in parts of 3 and 2, or 7 4-byte
    words in parts of 3, 3 and 1; part 0 writes the slot probabilities. With a list of 4
    rows, tokens with more walk their rowmap row, part by part too."""
    with use_settings(part_words=2, lmax=lmax):
        _unpermute_rows_split_into_parts(dtype, H)


def _unpermute_rows_split_into_parts(dtype, H):
    rng = np.random.default_rng(50 + H)
    T, K, E, R = 7, 6, 8, 40
    words = H * np.dtype(dtype).itemsize // (16 if H == 40 else 4)
    assert UP._row_parts(T, words) == ((2, 3) if H == 40 else (3, 3))
    rows, rowmap, rm, probs = unzipped(rng, T, K, E, R, dtype, H)
    for weighted in (False, True):
        run_unpermute(rows, rowmap, rm, probs, E, weighted, True)
    run_unpermute(rows, rowmap, rm, probs, E, True, False)


def test_unpermute_tokens_with_groups_of_rows():
    """A token's rows are loaded eight at a time: tokens of 1, 7, 8, 9, 16 and 17 rows (part
    of a group, one group, a group and a row, two groups, two groups and a row), weighted
    and not, mix precision and not."""
    rng = np.random.default_rng(45)
    T, E, R, H = 6, 17, 90, 12
    rowmap = np.full((T, E), -1, np.int32)
    free = rng.permutation(R)
    i = 0
    for t, n in enumerate((1, 7, 8, 9, 16, 17)):
        for e in np.sort(rng.choice(E, n, replace=False)):
            rowmap[t, e] = free[i]
            i += 1
    rm = np.stack([rng.choice(np.flatnonzero(rowmap[t] >= 0), 1) for t in range(T)])
    rows = rng.standard_normal((R, H)).astype(ml_dtypes.bfloat16)
    probs = rng.random(R, dtype=np.float32)
    for weighted in (False, True):
        for mix in (False, True):
            run_unpermute(rows, rowmap, rm.astype(np.int32), probs, E, weighted, mix)


@use_settings(lmax=4)  # tokens with > 4 valid rows walk the rowmap instead
def test_unpermute_malformed_and_list_overflow():
    rng = np.random.default_rng(40)
    T, K, E, R, H = 8, 3, 7, 30, 4
    rows = rng.standard_normal((R, H)).astype(ml_dtypes.bfloat16)
    rowmap = np.where(rng.random((T, E)) < 0.7, rng.integers(0, R, (T, E)), -1).astype(np.int32)
    rowmap[2, 5] = R  # bad rows
    rowmap[1, 6] = -3
    rm = rng.integers(-1, E, (T, K)).astype(np.int64)
    rm[4, 2] = E  # bad ids
    rm[5, 0] = -2
    probs = rng.random(R, dtype=np.float32)
    status = run_unpermute(rows, rowmap, rm, probs, E, True, True)
    assert status[abi.UNPERMUTE_BAD_ROW] == 1 * E + 6
    assert status[abi.UNPERMUTE_BAD_ID] == 4 * K + 2
    run_unpermute(rows, rowmap, rm, probs, E, False, False)


def test_unpermute_empty():
    rng = np.random.default_rng(50)
    rows = np.zeros((0, 5), np.float16)
    rowmap = np.full((4, 3), -1, np.int32)
    rowmap[1, 2] = 0  # every entry >= 0 is out of range when R = 0
    rm = rng.integers(-1, 3, (4, 2)).astype(np.int32)
    run_unpermute(rows, rowmap, rm, np.zeros(0, np.float32), 3, True, True)
    run_unpermute(rows, rowmap[:0], rm[:0], np.zeros(0, np.float32), 3, False, True)


def test_the_gpu_backend_offers_a_method_per_op():
    """``moe_numba.backends``' promise for the GPU backend: one method per op, named as the
    op, taking ``(plan, arrays, empty)`` first."""
    import inspect

    from moe_numba import backends
    from moe_numba.ops import OPS

    backend = backends.gpu_backend()
    for op in OPS:
        method = getattr(backend, op.name)
        assert list(inspect.signature(method).parameters)[:3] == ["plan", "arrays", "empty"]
