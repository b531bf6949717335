"""The GPU gradient ops (``moe_numba._gpu``'s permute_backward / unpermute_backward and the
kernels behind them) in numba's CUDA simulator, bit for bit against the NumPy oracle.

The kernels' settings shrink the blocks (``moe_numba.kernels.use_settings``) so that tiny
inputs still take several claim and collide blocks (grid-stride, the ticket), several chunks
per zero worker, rows in several batches and compute steps, tokens with more rows than a
warp lists at once, and list overflows in the combine. Every case of the unpermute's
gradient runs with the scatter's plan of a large call (a warp per token for all its rows)
and with that of a small one (each token's rows shared among warps, rows without the dot
product in parts). Outputs and scratch come from a poisoning allocator passed to the backend
(``empty=``), so an element a kernel forgets to write shows up as a mismatch. The
simulator's ``cuda.fma`` rounds twice; it is replaced by a correctly rounded fma here, so the
dot product is compared exactly too. The lanes stay 32: they are the dot product's order.
"""

import ml_dtypes
import numpy as np
import pytest
from numba import config, cuda

pytestmark = pytest.mark.sim  # calls the kernels with host arrays (conftest skips it elsewhere)

from _cases import (  # noqa: E402
    assert_same_bits,
    garbage,
    plan_of,
    random_bits,
    random_routing,
    random_values,
)
from _gradients import token_with_40_rows  # noqa: E402
from moe_numba import abi, oracle  # noqa: E402
from moe_numba.kernels import Settings, settings, use_settings  # noqa: E402
from moe_numba.ops import (  # noqa: E402
    PERMUTE_BACKWARD,
    UNPERMUTE_BACKWARD,
    PermuteBackwardArrays,
    UnpermuteBackwardArrays,
)

if config.ENABLE_CUDASIM:
    from moe_numba import backends  # noqa: E402
    from moe_numba.kernels import unpermute_backward as UB  # noqa: E402

DTYPES = [np.float32, ml_dtypes.bfloat16, np.float16]
ROW_SHAPES = [  # (dtype, H): the row sizes pick 16-, 8-, 4- and 2-byte words
    (np.float32, 8),
    (np.float32, 6),
    (np.float32, 5),
    (ml_dtypes.bfloat16, 16),
    (ml_dtypes.bfloat16, 12),
    (ml_dtypes.bfloat16, 7),
    (np.float16, 20),
    (np.float16, 3),
]


def _name(x):
    return getattr(x, "__name__", str(x))


# claim and collide in blocks of 16 threads, at most 3 (grid-stride; the last block writes
# the status), zero workers at least 2 (each takes several chunks of 32 rows), a thread holds
# 1 or 2 groups of a row (rows go in several batches), the combine in blocks of 16 threads and
# the check in 3 blocks of 16
SMALL = dict(owner_bd=16, owner_blocks=3, zero_workers=2, batch_groups=((1, 2), (1, 2)))
SMALL.update(combine_bd=16, min_bd=8, check_bd=16, check_blocks=3)


@pytest.fixture(autouse=True)
def small_geometry(monkeypatch):
    """Every test under :data:`SMALL` (``use_settings`` forgets the launch plans on the way
    in and out), with an exact fma."""
    from numba.cuda.simulator import kernelapi

    def exact_fma(self, a, b, c):
        return np.float32(oracle.fma_float32(a, b, c))

    monkeypatch.setattr(kernelapi.FakeCUDAModule, "fma", exact_fma)
    with use_settings(**SMALL):
        yield


@pytest.fixture(params=["whole", "shared"])
def workers(request, small_geometry):
    """The scatter's token workers: "whole", the plan of a call of ``scatter_token_warps``
    tokens or more
    (a warp per token takes all its rows; the dot product's narrow batch); "shared", the plan
    of a small call (each token's rows shared among min(K, E) warps; rows without the dot
    product in parts of at least one group per lane). The launch plans were forgotten by
    ``small_geometry``, before these settings."""
    if request.param == "whole":
        changes = dict(scatter_token_warps=1, wide_dot_warps=0)
    else:
        changes = dict(scatter_token_warps=1 << 20, scatter_part_groups=1)
    with use_settings(**changes):
        yield request.param


class Poisoned:
    """``empty(shape, dtype)`` for the backend: simulator arrays of garbage bytes; counts the
    scratch allocations (the backend's only uint8 ones)."""

    def __init__(self):
        self.scratch = 0

    def __call__(self, shape, dtype):
        self.scratch += np.dtype(dtype) == np.uint8
        return cuda.to_device(garbage(shape, dtype))


def device(a):
    return None if a is None else cuda.to_device(np.ascontiguousarray(a))


def host(x):
    return None if x is None else x.copy_to_host()


def compare(actual, expected, names):
    for a, b, what in zip(actual, expected, names, strict=True):
        if b is None:
            assert a is None, what
        else:
            assert_same_bits(host(a), b, what)


def run_backend(op, plan, host_arrays, expected, status_expected, scratch, names):
    """The GPU backend's ``op`` (validate on and off) on device copies of ``host_arrays``: every
    output and status word as expected, ``scratch`` (validate, not) scratch allocations, no
    input changed."""
    copies = [None if x is None else x.copy() for x in host_arrays]
    arrays = type(host_arrays)(*(device(x) for x in host_arrays))
    for validate in (True, False):
        empty = Poisoned()
        run_op = getattr(backends.gpu_backend(), op)
        out, status = run_op(plan._replace(validate=validate), arrays, empty=empty)
        assert empty.scratch == scratch[0 if validate else 1]
        if validate:
            np.testing.assert_array_equal(status, status_expected)
        else:
            assert status is None
        compare(out, expected, names)
    for before, after in zip(copies, arrays, strict=True):
        if before is not None:
            assert_same_bits(host(after), before, "an input")


def run_permute_backward(grad_rows, grad_probs, rowmap, routemap):
    """The GPU backend against the oracle (:func:`run_backend`); the status words."""
    host_arrays = PermuteBackwardArrays(grad_rows, grad_probs, rowmap, routemap)
    expected, status = oracle.permute_backward(*host_arrays)
    plan = plan_of(PERMUTE_BACKWARD, host_arrays)
    names = ("grad_hidden_states", "grad_expert_prob_topk")
    run_backend("permute_backward", plan, host_arrays, expected, status, (1, 0), names)
    return status  # (scratch: check's words only)


def run_unpermute_backward(dy, g, xu, rowmap, routemap, p, weighted, num_rows):
    """As :func:`run_permute_backward`, for the unpermute's gradient."""
    host_arrays = UnpermuteBackwardArrays(dy, g, xu, rowmap, routemap, p)
    expected, status = oracle.unpermute_backward(*host_arrays, weighted, num_rows)
    plan = plan_of(
        UNPERMUTE_BACKWARD, host_arrays, using_weighted_combine=weighted, num_rows=num_rows
    )
    names = ("grad_hidden_states_unzipped", "grad_token_prob_unzipped")
    # scratch: the owner words, and check's words with validate
    run_backend("unpermute_backward", plan, host_arrays, expected, status, (2, 1), names)
    return status


def permuted(rng, T, K, E, R, *, repeats=0.0):
    """A routing map and a row map that puts its (token, expert) pairs in distinct random
    rows (fewer rows than pairs: the last pairs are dropped)."""
    routemap = random_routing(rng, T, K, E, repeats=repeats)
    rowmap = np.full((T, E), -1, np.int32)
    free = iter(rng.permutation(R))
    for t in range(T):
        for e in sorted({int(e) for e in routemap[t] if e >= 0}):
            rowmap[t, e] = next(free, -1)
    return routemap, rowmap


def gradients(rng, T, K, R, dtype, H):
    """dY [T, H], g [T, K], Xu [R, H], p [R]: finite values (so that every dot product's
    rounding shows; NaNs and infinities: :func:`test_unpermute_backward_special_bits`)."""
    return (
        random_values(rng, (T, H), dtype, special=0.0),
        rng.standard_normal((T, K)).astype(np.float32),
        random_values(rng, (R, H), dtype, special=0.0),
        rng.random(R, dtype=np.float32),
    )


# ---------------------------------------------------------------------------------------
# moe_unpermute_backward


@pytest.mark.usefixtures("workers")
@pytest.mark.parametrize("weighted", [False, True], ids=["copy", "weighted"])
@pytest.mark.parametrize("dtype,H", ROW_SHAPES, ids=_name)
def test_unpermute_backward_word_widths(dtype, H, weighted):
    rng = np.random.default_rng(H)
    T, K, E, R = 6, 3, 5, 20  # padding rows, a repeated expert (two slots add g)
    routemap, rowmap = permuted(rng, T, K, E, R, repeats=0.5)
    dy, g, xu, p = gradients(rng, T, K, R, dtype, H)
    status = run_unpermute_backward(dy, g, xu, rowmap, routemap, p, weighted, R)
    assert (status == -1).all()


@pytest.mark.usefixtures("workers")
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_unpermute_backward_rows_in_batches(dtype):
    """Rows of more than 64 groups: batches of a group or two a lane (the dot product's
    partials wait in shared memory between batches); "shared": rows without the dot
    product in parts of 64 and 7 groups."""
    rng = np.random.default_rng(1)
    H = 70 * 16 // np.dtype(dtype).itemsize + 3  # 71 groups, the last one short
    T, K, E, R = 3, 2, 3, 8
    routemap, rowmap = permuted(rng, T, K, E, R)
    dy, g, xu, p = gradients(rng, T, K, R, dtype, H)
    run_unpermute_backward(dy, g, xu, rowmap, routemap, p, True, R)
    run_unpermute_backward(dy, None, None, rowmap, routemap, None, False, R)


@pytest.mark.usefixtures("workers")
def test_unpermute_backward_tokens_with_more_rows_than_lanes():
    """A malformed row map names 40 rows of one token among 45 experts: "whole", a warp
    lists 32 at a time (the rows go in two rounds); "shared", four warps take 10 rows each,
    counted across the two listing rounds. Narrow rows: the simulator's shuffles are slow;
    the rounds with rows that take two batches run on the GPU (test_backward.py)."""
    rng = np.random.default_rng(2)
    T, K, R = 2, 4, 100
    H = 8  # float32: two groups
    routemap, rowmap = token_with_40_rows(rng, R)
    dy, g, xu, p = gradients(rng, T, K, R, np.float32, H)
    run_unpermute_backward(dy, g, xu, rowmap, routemap, p, True, R)
    run_unpermute_backward(dy, g, xu, rowmap, routemap, p, False, R)


@use_settings(Settings())  # (the defaults, not SMALL's)
def test_scatter_plans_keep_large_calls_and_share_small_ones():
    """From ``scatter_token_warps`` tokens on, a warp per token for all its rows (the plan
    of before); fewer tokens share each token's rows among up to K warps, and rows without
    the dot product go in parts of at least ``scatter_part_groups`` groups per lane; with
    few token workers the dot product takes the wide batch. bf16, H = 7168: 896 groups."""
    s = settings()
    assert s.scatter_token_warps == 4096 and s.scatter_part_groups == 4
    for dot in (False, True):
        assert UB._token_workers(16384, 8, 64, 896, dot) == (1, 1, 896)
        assert UB._token_workers(4096, 8, 64, 896, dot) == (1, 1, 896)
    assert UB._token_workers(1024, 8, 64, 896, True) == (4, 1, 896)
    assert UB._token_workers(256, 8, 64, 896, True) == (8, 1, 896)
    assert UB._token_workers(256, 8, 64, 896, False) == (8, 2, 448)
    assert UB._token_workers(16, 8, 256, 896, False) == (8, 7, 128)
    assert UB._token_workers(16, 8, 4, 896, True) == (4, 1, 896)  # (a token has <= E rows)
    narrow, wide = s.batch_groups[True][0], s.batch_groups[True][-1]
    assert UB._batch_groups(16, 896, True, s.wide_dot_warps + 1) == narrow
    assert UB._batch_groups(16, 896, True, s.wide_dot_warps) == wide


@pytest.mark.parametrize("token_warps,shares", [(12, 3), (1 << 20, 5)], ids=["3", "5"])
def test_unpermute_backward_rows_shared_among_warps(token_warps, shares):
    """A small call shares each token's rows among warps, each taking every shares-th row it
    lists (3 warps of 2, 2 and 1 of K = 5 rows, or a warp per row); a row's dot product
    stays one warp's (two batches of 64 and 7 groups); rows without it go in parts of 64
    and 7 groups, a group per lane at a time (two batches, then one)."""
    changes = dict(scatter_token_warps=token_warps, scatter_part_groups=1)
    with use_settings(**changes, batch_groups=((1,), (1, 2))):
        _rows_shared_among_warps(shares)


def _rows_shared_among_warps(shares):
    rng = np.random.default_rng(9)
    T, K, E, R = 3, 5, 7, 24
    H = 70 * 8 + 3  # bf16: 71 groups, the last one short
    assert UB._token_workers(T, K, E, 71, True) == (shares, 1, 71)
    assert UB._token_workers(T, K, E, 71, False) == (shares, 2, 64)
    routemap, rowmap = permuted(rng, T, K, E, R, repeats=0.3)
    dy, g, xu, p = gradients(rng, T, K, R, ml_dtypes.bfloat16, H)
    run_unpermute_backward(dy, g, xu, rowmap, routemap, p, True, R)
    run_unpermute_backward(dy, g, None, rowmap, routemap, None, False, R)


@use_settings(scatter_token_warps=1 << 20)
def test_unpermute_backward_shares_with_more_rows_than_lanes():
    """A malformed row map names 70 rows of one token among 80 experts, shared by two warps:
    each takes 35 of the rows listed in three rounds of 31, 31 and 8 (more than 32: a
    warp's rows go in two rounds)."""
    rng = np.random.default_rng(10)
    T, K, E, R = 2, 2, 80, 100
    assert UB._token_workers(T, K, E, 2, True) == (2, 1, 2)
    routemap = np.array([[3, 77], [0, 1]], np.int32)
    rowmap = np.full((T, E), -1, np.int32)
    rows = rng.permutation(R)
    experts = [*range(31), *range(33, 72)]
    rowmap[0, experts] = rows[:70]
    rowmap[1, :2] = rows[70:72]
    dy, g, xu, p = gradients(rng, T, K, R, np.float32, 8)
    run_unpermute_backward(dy, g, xu, rowmap, routemap, p, True, R)


@pytest.mark.usefixtures("workers")
def test_unpermute_backward_rows_named_twice():
    """Rows named by two and by three entries: zero gradients, and the status names the
    smallest such row and its first two entries in flat order."""
    rng = np.random.default_rng(3)
    T, K, E, R, H = 7, 3, 4, 30, 8
    routemap, rowmap = permuted(rng, T, K, E, R)
    rowmap[np.isin(rowmap, [9, 11])] = -1
    rowmap[1, 0], rowmap[5, 3] = 11, 11  # row 11 twice
    rowmap[2, 1], rowmap[4, 1], rowmap[6, 2] = 9, 9, 9  # row 9 three times: the smallest
    dy, g, xu, p = gradients(rng, T, K, R, ml_dtypes.bfloat16, H)
    status = run_unpermute_backward(dy, g, xu, rowmap, routemap, p, True, R)
    assert status[abi.UNPERMUTE_BACKWARD_DUPLICATE_ROW] == 9
    assert status[abi.UNPERMUTE_BACKWARD_DUPLICATE_FIRST] == 2 * E + 1
    assert status[abi.UNPERMUTE_BACKWARD_DUPLICATE_SECOND] == 4 * E + 1
    run_unpermute_backward(dy, None, None, rowmap, routemap, None, False, R)


@pytest.mark.usefixtures("workers")
def test_unpermute_backward_bad_entries():
    """Row-map entries outside [-1, R) and routing ids outside [-1, E) count as -1; the
    status reports the first of each (and a row named twice)."""
    rng = np.random.default_rng(4)
    T, K, E, R, H = 9, 3, 6, 25, 6
    routemap, rowmap = permuted(rng, T, K, E, R)
    routemap = routemap.astype(np.int64)
    rowmap[3, 2], rowmap[6, 0], rowmap[2, 5] = R, -7, 2**31 - 1
    routemap[4, 1], routemap[7, 0] = E, -2
    routemap[8, 2] = routemap[8, 0] + 2**32  # equal to a valid id in its low 32 bits
    rowmap[rowmap == 3] = -1
    rowmap[0, 0], rowmap[8, 5] = 3, 3
    dy, g, xu, p = gradients(rng, T, K, R, np.float16, H)
    status = run_unpermute_backward(dy, g, xu, rowmap, routemap, p, True, R)
    assert status[abi.UNPERMUTE_BAD_ROW] == 2 * E + 5
    assert status[abi.UNPERMUTE_BAD_ID] == 4 * K + 1
    assert status[abi.UNPERMUTE_BACKWARD_DUPLICATE_ROW] == 3


@pytest.mark.usefixtures("workers")
@pytest.mark.parametrize("weighted", [False, True], ids=["copy", "weighted"])
def test_unpermute_backward_optional_inputs(weighted):
    rng = np.random.default_rng(5)
    T, K, E, R, H = 5, 2, 3, 12, 4
    routemap, rowmap = permuted(rng, T, K, E, R, repeats=0.5)
    dy, g, xu, p = gradients(rng, T, K, R, np.float32, H)
    run_unpermute_backward(dy, None, xu if weighted else None, rowmap, routemap, p, weighted, R)
    run_unpermute_backward(None, g, None, rowmap, routemap, p if weighted else None, weighted, R)
    run_unpermute_backward(None, g, None, rowmap, routemap[:, ::-1].copy(), None, False, R)


@pytest.mark.usefixtures("workers")
@pytest.mark.parametrize("dtype,H", ROW_SHAPES[::3] + [(ml_dtypes.bfloat16, 600)], ids=_name)
def test_unpermute_backward_weighted_without_the_dot_product(dtype, H):
    """A weighted combine's gradient without the rows (what autograd asks for when the
    probabilities need no gradient): dXu = rnd(dY * p), dp has the g terms only. The plan
    says so itself here (``dot`` false)."""
    rng = np.random.default_rng(8)
    T, K, E, R = 5, 3, 4, 16
    routemap, rowmap = permuted(rng, T, K, E, R, repeats=0.5)
    dy, g, xu, p = gradients(rng, T, K, R, dtype, H)
    (rows, _), status = oracle.unpermute_backward(dy, g, xu, rowmap, routemap, p, True, R)
    (_, dp), _ = oracle.unpermute_backward(dy, g, None, rowmap, routemap, None, False, R)
    host_arrays = UnpermuteBackwardArrays(dy, g, xu, rowmap, routemap, p)
    plan = plan_of(UNPERMUTE_BACKWARD, host_arrays, using_weighted_combine=True, num_rows=R)

    class WithoutDot(type(plan)):
        __slots__ = ()
        dot = False

    host_arrays = host_arrays._replace(hidden_states_unzipped=None)
    names = ("grad_hidden_states_unzipped", "grad_token_prob_unzipped")
    run_backend(
        "unpermute_backward", WithoutDot(*plan), host_arrays, (rows, dp), status, (2, 1), names
    )


@pytest.mark.usefixtures("workers")
def test_unpermute_backward_empty():
    rng = np.random.default_rng(6)
    rowmap = np.full((4, 3), -1, np.int32)
    rowmap[1, 2] = 0  # out of range when R = 0
    routemap = np.array([[0, 2], [2, -1], [1, 1], [-1, -1]], np.int32)
    dy, g, xu, p = gradients(rng, 4, 2, 0, ml_dtypes.bfloat16, 5)
    run_unpermute_backward(dy, g, xu, rowmap, routemap, p, True, 0)  # R = 0
    dy, g, xu, p = gradients(rng, 0, 2, 7, ml_dtypes.bfloat16, 5)
    run_unpermute_backward(dy, g, xu, rowmap[:0], routemap[:0], p, True, 7)  # T = 0: zeros


@pytest.mark.usefixtures("workers")
@pytest.mark.parametrize("dtype", DTYPES, ids=_name)
def test_unpermute_backward_special_bits(dtype):
    """Copies keep every bit (NaN payloads, -0.0); products and dot products of NaNs,
    infinities and subnormals round like the oracle, NaN canonical."""
    rng = np.random.default_rng(7)
    T, K, E, R, H = 5, 3, 4, 16, 16
    routemap, rowmap = permuted(rng, T, K, E, R, repeats=0.3)
    dy = random_bits(rng, (T, H), dtype)
    xu = random_bits(rng, (R, H), dtype)
    g = random_bits(rng, (T, K), np.float32)
    p = random_values(rng, (R,), np.float32, special=0.3)
    run_unpermute_backward(dy, g, xu, rowmap, routemap, p, True, R)
    run_unpermute_backward(dy, g, None, rowmap, routemap, None, False, R)


# ---------------------------------------------------------------------------------------
# moe_permute_backward


@pytest.mark.parametrize("dtype,H", ROW_SHAPES, ids=_name)
def test_permute_backward_word_widths(dtype, H):
    rng = np.random.default_rng(10 + H)
    T, K, E, R = 7, 4, 5, 24
    routemap, rowmap = permuted(rng, T, K, E, R, repeats=0.6)  # repeated: a 0 slot
    grad_rows = random_values(rng, (R, H), dtype)
    grad_probs = rng.standard_normal(R).astype(np.float32)
    status = run_permute_backward(grad_rows, grad_probs, rowmap, routemap)
    assert (status == -1).all()


@use_settings(lmax=2)  # tokens with > 2 rows walk the rowmap instead
def test_permute_backward_optional_inputs_and_bad_entries():
    rng = np.random.default_rng(11)
    T, K, E, R, H = 8, 3, 5, 20, 6
    routemap, rowmap = permuted(rng, T, K, E, R, repeats=0.5)
    routemap = routemap.astype(np.int64)
    rowmap[2, 4], rowmap[5, 0] = R + 3, -4
    routemap[1, 2], routemap[6, 0] = E + 1, -9
    grad_rows = random_bits(rng, (R, H), ml_dtypes.bfloat16)
    grad_probs = random_bits(rng, (R,), np.float32)  # copied: every bit kept
    status = run_permute_backward(grad_rows, grad_probs, rowmap, routemap)
    assert status[abi.UNPERMUTE_BAD_ROW] == 2 * E + 4
    assert status[abi.UNPERMUTE_BAD_ID] == 1 * K + 2
    run_permute_backward(grad_rows, None, rowmap, routemap)
    run_permute_backward(None, grad_probs, rowmap, routemap)


def test_permute_backward_empty():
    rng = np.random.default_rng(12)
    rowmap = np.full((3, 2), -1, np.int32)
    routemap = np.array([[0, 1], [1, 1], [-1, 0]], np.int32)
    run_permute_backward(np.zeros((0, 3), np.float16), np.zeros(0, np.float32), rowmap, routemap)
    rows = rng.standard_normal((4, 3)).astype(np.float16)
    run_permute_backward(rows, np.ones(4, np.float32), rowmap[:0], routemap[:0])


# ---------------------------------------------------------------------------------------
# the bench's gradient calls (benchmarks/gradients.py)


def test_bench_gradient_calls_match_the_cpu_backend():
    from benchmarks import gradients as _gradients
    from benchmarks.cases import Case
    from benchmarks.target import CudaTarget

    case = Case(tokens=6, hidden=12, experts=4, topk=2, alignment=4, dtype="bf16")
    target = CudaTarget("numba")
    _gradients.check(case, target)  # raises if an output differs
    ops = _gradients.operations(case, target)
    assert [op.name for op in ops] == [
        "permute_backward",
        "permute_backward validate=False",
        "unpermute_backward weighted",
        "unpermute_backward weighted validate=False",
        "unpermute_backward",
        "unpermute_backward validate=False",
    ]
    row_bytes = 12 * 2
    R = sum(-(-n // 4) * 4 for n in _gradients.make_inputs(case).counts)
    assert [op.nbytes for op in ops[::2]] == [
        (6 * 2 + 6) * row_bytes,
        (6 + 6 * 2 + R) * row_bytes,
        (6 + R) * row_bytes,
    ]
    for op in ops:
        op.call()
