"""moe_sort_chunks on every backend against the NumPy oracle, bit for bit; its errors; the
rule for bad sizes on the device. (The PTX of its kernels: tests/test_ptx.py, which compiles
every family of ``moe_numba.kernels.families()``.)"""

import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import moe_cpu
from _backends import examples
from _cases import FLOAT8, HIDDEN_DTYPES, assert_same_bits, random_bits
from moe_numba import abi, backends, moe_sort_chunks, oracle
from moe_numba.kernels import use_settings
from moe_numba.ops import SORT_CHUNKS, SortArrays, SortScalars

DTYPES = [*HIDDEN_DTYPES, np.int8, np.int32, np.int64, np.uint16, np.float64, np.bool_]


def sort_chunks_arrays(x, split_sizes, order, probs=None, *, validate=True):
    """Every output of ``moe_sort_chunks`` (its ``lengths`` too: the sizes of the inverse
    sort, which the torch backward uses), through the core."""
    scalars = SortScalars(order=order, host_split_sizes=split_sizes, validate=validate)
    return backends.outputs(SORT_CHUNKS, SortArrays(x, probs, None), scalars)


def sort_on(backend, x, split_sizes, order, probs=None, *, device_sizes=False, **flags):
    dev = backend.to_device
    sizes = dev(np.asarray(split_sizes, dtype=np.int64)) if device_sizes else split_sizes
    y, probs_y = moe_sort_chunks(
        dev(x), sizes, order, None if probs is None else dev(probs), **flags
    )
    return backend.to_host(y), None if probs_y is None else backend.to_host(probs_y)


def check_against_oracle(backend, x, split_sizes, order, probs=None, **flags):
    (expected, expected_probs), status = oracle.sort_chunks(x, split_sizes, order, probs)
    if flags.get("validate", True):
        assert (status == -1).all(), f"case meant to be valid has status {status}"
    y, probs_y = sort_on(backend, x, split_sizes, order, probs, **flags)
    assert_same_bits(y, expected, "y")
    if probs is None:
        assert probs_y is None
    else:
        assert_same_bits(probs_y, expected_probs, "probs_y")
    return y, probs_y


@st.composite
def sort_cases(draw, small, float8=True):
    num_rows = draw(st.integers(0, 12 if small else 300))
    num_chunks = draw(st.integers(0, 6 if small else 40))
    cuts = sorted(
        draw(st.lists(st.integers(0, num_rows), min_size=num_chunks + 1, max_size=num_chunks + 1))
    )
    return dict(
        num_rows=num_rows,
        hidden=draw(st.integers(0, 5 if small else 70)),
        dtype=draw(st.sampled_from([d for d in DTYPES if float8 or np.dtype(d) not in FLOAT8])),
        sizes=np.diff(cuts).tolist() if num_chunks else [],
        order=draw(st.permutations(range(num_chunks))),
        with_probs=draw(st.booleans()),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def _inputs(case):
    rng = np.random.default_rng(case["seed"])
    x = random_bits(rng, (case["num_rows"], case["hidden"]), case["dtype"])
    probs = random_bits(rng, (case["num_rows"],), np.float32) if case["with_probs"] else None
    return x, probs


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_matches_oracle(backend, data):
    case = data.draw(sort_cases(backend.small, backend.supports_float8))
    x, probs = _inputs(case)
    x_copy = x.copy()
    check_against_oracle(backend, x, case["sizes"], case["order"], probs)
    assert_same_bits(x, x_copy, "x (input modified)")


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_inverse_sort_restores_the_rows(backend, data):
    """The gradient's rule: the sizes in output order and the inverse order undo a sort."""
    case = data.draw(sort_cases(backend.small, backend.supports_float8))
    x, probs = _inputs(case)
    sizes, order = case["sizes"], case["order"]
    y, probs_y = sort_on(backend, x, sizes, order, probs)
    inverse = np.argsort(order).tolist()  # (inverse[order[i]] = i)
    back, probs_back = sort_on(backend, y, [sizes[c] for c in order], inverse, probs_y)
    assert_same_bits(back, x, "x after sort and inverse sort")
    if probs is not None:
        assert_same_bits(probs_back, probs, "probs after sort and inverse sort")


def test_worked_example(backend):
    x = np.arange(12, dtype=np.float32).reshape(6, 2).astype(ml_dtypes.bfloat16)
    probs = np.arange(6, dtype=np.float32) / 8
    y, probs_y = check_against_oracle(backend, x, [1, 2, 2], [2, 0, 1], probs)
    assert y[:, 0].astype(np.float32).tolist() == [6, 8, 0, 2, 4, 10]
    assert probs_y.tolist() == [0.375, 0.5, 0.0, 0.125, 0.25, 0.625]


def test_rows_past_the_chunks_are_copied(backend):
    x = np.arange(7, dtype=np.int32).reshape(7, 1)
    y, _ = check_against_oracle(backend, x, [2, 1], [1, 0])
    assert y.ravel().tolist() == [2, 0, 1, 3, 4, 5, 6]


@pytest.mark.parametrize("hidden,dtype", [(8, np.float32), (3, np.float16), (5, np.int8)])
def test_every_word_width(backend, hidden, dtype):
    """Rows of 32, 6 and 5 bytes: 16-, 2- and 1-byte words on the GPU."""
    rng = np.random.default_rng(hidden)
    x = random_bits(rng, (9, hidden), dtype)
    check_against_oracle(backend, x, [4, 0, 3, 2], [3, 1, 0, 2])


def test_thread_counts_give_the_same_bits():
    rng = np.random.default_rng(7)
    x = random_bits(rng, (3000, 64), np.float32)  # 768 KiB: several parallel pieces
    sizes = rng.multinomial(2900, np.ones(17) / 17).tolist()
    order = rng.permutation(17).tolist()
    results = []
    for threads in (1, 2):
        moe_cpu.set_num_threads(threads)
        try:
            results.append(moe_sort_chunks(x, sizes, order)[0])
        finally:
            moe_cpu.set_num_threads(None)
    assert_same_bits(results[0], results[1], "1 vs 2 threads")
    assert_same_bits(results[0], oracle.sort_chunks(x, sizes, order)[0][0], "oracle")


# ---------------------------------------------------------------------------------------------
# sizes on the device


def effective_lengths(sizes, order, num_rows):
    """The rows each output position really gets under the rule for bad sizes."""
    ends = np.minimum(np.cumsum(np.maximum(np.array(sizes, dtype=object), 0)), num_rows)
    starts = np.concatenate([[0], ends[:-1]]) if len(sizes) else ends
    return [int(ends[c] - starts[c]) for c in order]


def _needs_device(backend):
    if backend.name == "cpu":
        pytest.skip("split sizes in a CUDA array need a CUDA backend (cudasim or a GPU)")


BAD_SIZES = [
    ([2, -1, 20], [2, 0, 1]),  # negative, then past the end
    ([5, -3, 7, 1], [3, 1, 0, 2]),
    ([0, 0, 12, 4], [1, 3, 2, 0]),  # one chunk ends past the end
    ([3, 2**62, 2**62, 1], [0, 3, 1, 2]),  # sizes whose sum overflows int64
    ([-(2**62), 4, 2], [2, 1, 0]),
]


@pytest.mark.parametrize("sizes_dtype", [np.int32, np.int64])
def test_device_sizes_match_host_sizes(backend, sizes_dtype):
    _needs_device(backend)
    rng = np.random.default_rng(3)
    x = random_bits(rng, (10, 3), ml_dtypes.bfloat16)
    probs = random_bits(rng, (10,), np.float32)
    dev = backend.to_device
    for validate in (True, False):
        y, probs_y = moe_sort_chunks(
            dev(x),
            dev(np.array([3, 0, 4, 2], sizes_dtype)),
            [2, 3, 0, 1],
            dev(probs),
            validate=validate,
        )
        expected = oracle.sort_chunks(x, [3, 0, 4, 2], [2, 3, 0, 1], probs)[0]
        assert_same_bits(backend.to_host(y), expected[0], "y")
        assert_same_bits(backend.to_host(probs_y), expected[1], "probs_y")


@pytest.mark.parametrize("sizes,order", BAD_SIZES)
def test_bad_device_sizes_follow_the_rule_without_validate(backend, sizes, order):
    _needs_device(backend)
    rng = np.random.default_rng(4)
    x = random_bits(rng, (11, 2), np.float32)
    probs = random_bits(rng, (11,), np.float32)
    (expected, expected_probs), status = oracle.sort_chunks(x, sizes, order, probs)
    assert (status != -1).any()
    dev = backend.to_device
    out = sort_chunks_arrays(
        dev(x), dev(np.array(sizes, np.int64)), order, dev(probs), validate=False
    )
    assert_same_bits(backend.to_host(out.y), expected, "y")
    assert_same_bits(backend.to_host(out.probs), expected_probs, "probs_y")
    # the sizes of the inverse sort (what the torch backward uses)
    assert backend.to_host(out.lengths).tolist() == effective_lengths(sizes, order, 11)


@pytest.mark.parametrize("bad", [False, True])
@use_settings(plan_bd=32)  # (the simulator's blocks stay small)
def test_chunks_beyond_one_block_of_the_plan(backend, bad):
    """More chunks than the plan block has threads: the tiles carry their row counts (and
    the first bad size of a later tile is still the smallest), with host and device sizes."""
    _needs_device(backend)
    rng = np.random.default_rng(6)
    sizes = rng.integers(0, 3, 70).tolist()
    order = rng.permutation(70).tolist()
    x = random_bits(rng, (sum(sizes) + 3, 2), np.float32)
    if bad:
        sizes[40], sizes[65] = -2, 10**6  # both in the second tile and later
    (expected, _), status = oracle.sort_chunks(x, sizes, order)
    dev = backend.to_device
    if not bad:
        assert_same_bits(sort_on(backend, x, sizes, order)[0], expected, "y (host sizes)")
    out = sort_chunks_arrays(dev(x), dev(np.array(sizes, np.int64)), order, validate=False)
    assert_same_bits(backend.to_host(out.y), expected, "y (device sizes)")
    assert backend.to_host(out.lengths).tolist() == effective_lengths(sizes, order, x.shape[0])
    if bad:
        with pytest.raises(ValueError, match=r"split_sizes\[40\] = -2"):
            sort_on(backend, x, sizes, order, device_sizes=True)
        assert status[abi.SORT_PAST_END] == 65


def test_status_is_read_only_for_device_sizes_with_validate(backend):
    """One status read for sizes on the device with validate=True (the call's only sync);
    none with validate=False, and none for host sizes (checked before the launch)."""
    _needs_device(backend)
    from moe_numba.runtime import get_runtime

    runtime = get_runtime()
    dev = backend.to_device
    x = dev(np.zeros((6, 2), np.float32))
    sizes = dev(np.array([2, 1, 3], np.int64))
    for split_sizes, validate, expected in (
        (sizes, True, 1),
        (sizes, False, 0),
        ([2, 1, 3], True, 0),
        ([2, 1, 3], False, 0),
    ):
        before = runtime.status_reads
        moe_sort_chunks(x, split_sizes, [2, 0, 1], validate=validate)
        assert runtime.status_reads - before == expected, (split_sizes, validate)


def test_device_rows_with_host_probs_are_refused(backend):
    _needs_device(backend)
    rows = backend.to_device(np.zeros((6, 2), np.float32))
    with pytest.raises(TypeError, match=r"probs is a numpy.ndarray \(host array\) but x is a"):
        moe_sort_chunks(rows, [2, 1, 3], [2, 0, 1], np.zeros(6, np.float32))


@pytest.mark.parametrize("sizes,order", BAD_SIZES)
def test_bad_device_sizes_raise_like_host_sizes(backend, sizes, order):
    _needs_device(backend)
    x = np.zeros((11, 2), np.float32)
    with pytest.raises(ValueError, match=r"split_sizes") as host:
        moe_sort_chunks(x, sizes, order)
    with pytest.raises(ValueError, match=re.escape(str(host.value))):
        sort_on(backend, x, sizes, order, device_sizes=True)


@pytest.mark.parametrize("sizes,order", BAD_SIZES)
def test_cpu_kernel_follows_the_rule(sizes, order):
    """The Cython kernel never sees bad sizes from the API (host sizes are checked first);
    called directly it follows the same rule and reports the same status words."""
    rng = np.random.default_rng(5)
    x = random_bits(rng, (11, 3), np.uint8)
    probs = random_bits(rng, (11,), np.float32)
    (expected, expected_probs), expected_status = oracle.sort_chunks(x, sizes, order, probs)
    y = np.empty_like(x)
    probs_y = np.empty_like(probs)
    lengths = np.empty(len(sizes), np.int64)
    status = np.empty(abi.SORT_STATUS_LEN, np.int64)
    moe_cpu.sort_chunks(
        x,
        np.array(sizes, np.int64),
        np.array(order, np.int64),
        probs,
        y,
        probs_y,
        lengths,
        status,
    )
    assert_same_bits(y, expected, "y")
    assert_same_bits(probs_y, expected_probs, "probs_y")
    assert status.tolist() == expected_status.tolist()
    assert lengths.tolist() == effective_lengths(sizes, order, x.shape[0])


def _kernel_arguments():
    return dict(
        x=np.zeros((6, 3), np.uint8),
        sizes=np.array([2, 1, 3], np.int64),
        order=np.array([2, 0, 1], np.int64),
        probs=np.zeros(6, np.float32),
        y=np.zeros((6, 3), np.uint8),
        probs_y=np.zeros(6, np.float32),
        lengths=np.zeros(3, np.int64),
        status=np.zeros(abi.SORT_STATUS_LEN, np.int64),
    )


@pytest.mark.parametrize(
    "name,value,message",
    [
        ("y", np.zeros((6, 4), np.uint8), r"y must have shape \[N, row_bytes\] = \(6, 3\); got"),
        ("order", np.zeros(2, np.int64), r"order must have shape \[C\] = \(3,\); got \(2,\)"),
        ("lengths", np.zeros(4, np.int64), r"lengths must have shape \[C\] = \(3,\)"),
        ("probs", np.zeros(5, np.float32), r"probs must have shape \[N\] = \(6,\); got"),
        ("probs_y", np.zeros(7, np.float32), r"probs_y must have shape \[N\] = \(6,\)"),
        ("status", np.zeros(4, np.int64), r"status must have shape \[SORT_STATUS_LEN\] = \(5,\)"),
        ("probs_y", None, r"probs and probs_y must both be given or both be None; got probs "),
    ],
)
def test_cpu_kernel_shape_errors(name, value, message):
    arguments = _kernel_arguments()
    arguments[name] = value
    with pytest.raises(ValueError, match=message):
        moe_cpu.sort_chunks(*arguments.values())


# ---------------------------------------------------------------------------------------------
# errors


def defaults():
    return dict(
        x=np.zeros((6, 2), np.float32),
        split_sizes=[2, 1, 3],
        order=[2, 0, 1],
        probs=np.zeros(6, np.float32),
    )


ERRORS = [
    ("x", np.zeros(6, np.float32), ValueError, r"x must be 2-D \[rows, hidden\]; got shape \(6,\)"),
    (
        "x",
        np.zeros((6, 2), object),
        TypeError,
        r"x must have a fixed-size numeric dtype; got object",
    ),
    ("probs", np.zeros(6, np.float64), TypeError, r"probs must have dtype float32; got float64"),
    (
        "probs",
        np.zeros(5, np.float32),
        ValueError,
        r"probs must have shape \[rows\] .* = \(6,\); got \(5,\)",
    ),
    (
        "split_sizes",
        [2.0, 1, 3],
        TypeError,
        r"split_sizes must hold ints \(int64 range\); got dtype float64",
    ),
    (
        "split_sizes",
        [[2, 1, 3]],
        ValueError,
        r"split_sizes must be 1-D \[num_chunks\]; got shape \(1, 3\)",
    ),
    ("split_sizes", None, TypeError, r"split_sizes must be a sequence of ints; got NoneType"),
    (
        "split_sizes",
        [2**70, 1, 3],
        ValueError,
        rf"split_sizes must be at most 2\*\*63 - 1 \(int64\); got split_sizes\[0\] = {2**70}",
    ),
    ("split_sizes", [2, -1, 3], ValueError, r"split_sizes must be >= 0; got split_sizes\[1\] = -1"),
    (
        "split_sizes",
        [2, 1, 4],
        ValueError,
        r"split_sizes must sum to at most the rows of x \(6\); got split_sizes\[2\] = 4 "
        r"starting at row 3",
    ),
    ("order", [2, 0], ValueError, r"order must hold num_chunks = 3 values .*; got 2"),
    (
        "order",
        [2, 0, 3],
        ValueError,
        r"order must be a permutation of range\(num_chunks = 3\); order\[2\] = 3 is not a "
        r"chunk index",
    ),
    ("order", [2, 0, -1], ValueError, r"order\[2\] = -1 is not a chunk index"),
    ("order", [2, 0, 2], ValueError, r"order\[2\] = 2 repeats order\[0\]"),
    ("order", "abc", TypeError, r"order must be a sequence of ints; got str"),
    ("order", [0.5, 1, 2], TypeError, r"order must hold ints"),
    ("validate", 1, TypeError, r"validate must be a bool; got int 1"),
]


@pytest.mark.parametrize(
    "name,value,error,message", ERRORS, ids=[f"{e[0]}-{i}" for i, e in enumerate(ERRORS)]
)
def test_errors(backend, name, value, error, message):
    args = defaults()
    args[name] = value
    if args["x"].dtype != object:  # (object arrays have no device form: all stay on the host)
        args["x"] = backend.to_device(args["x"])
        args["probs"] = backend.to_device(args["probs"])
    validate = args.pop("validate", True)
    with pytest.raises(error, match=message):
        moe_sort_chunks(**args, validate=validate)


class _FakeCudaArray:
    __cuda_array_interface__ = {"shape": (3,), "typestr": "<i8", "data": (0, False), "version": 3}


def test_order_on_the_device_is_refused():
    with pytest.raises(TypeError, match=r"order must be a host sequence of ints .*got a CUDA"):
        moe_sort_chunks(np.zeros((6, 2), np.float32), [2, 1, 3], _FakeCudaArray())


def test_host_rows_with_device_sizes_are_refused():
    with pytest.raises(TypeError, match=r"x is a numpy.ndarray \(host array\) but split_sizes"):
        moe_sort_chunks(np.zeros((6, 2), np.float32), _FakeCudaArray(), [2, 0, 1])


@pytest.mark.parametrize(
    "sizes,error,message",
    [
        (
            np.array([2.0, 1, 3], np.float32),
            TypeError,
            r"split_sizes must have dtype int32, int64; got float32",
        ),
        (
            np.array([[2, 1, 3]], np.int64),
            ValueError,
            r"split_sizes must be 1-D \[num_chunks\]; got shape \(1, 3\)",
        ),
        (np.array([2, 1], np.int64), ValueError, r"order must hold num_chunks = 2 values"),
    ],
)
def test_device_sizes_errors(backend, sizes, error, message):
    _needs_device(backend)
    dev = backend.to_device
    with pytest.raises(error, match=message):
        moe_sort_chunks(dev(np.zeros((6, 2), np.float32)), dev(sizes), [2, 0, 1])


@pytest.mark.parametrize("size", [2**63, 2**64 - 1])
def test_sizes_past_int64_are_refused_as_given(size):
    x = np.zeros((4, 2), np.float32)
    with pytest.raises(ValueError, match=rf"split_sizes\[0\] = {size}$"):
        moe_sort_chunks(x, [size, 1], [0, 1])
