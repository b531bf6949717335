"""A call survives odd arguments (docs/contract.rst, issue 18 items 4-8).

``None`` for an array, sizes whose row count overflows, ``tokens_per_expert`` of odd items,
huge scalars, buffers too large for the machine, counts on the device: each is a TypeError,
ValueError or MemoryError that names the argument and gives the value as the caller wrote it.
"""

import json
import re

import numpy as np
import pytest

from moe_numba import moe_permute, moe_unpermute, oracle
from test_reliability import assert_survived, run_python


def permute_args(**changes):
    """Keyword arguments of a valid moe_permute call (4 tokens, K=2, E=4), with changes."""
    args = dict(
        hidden_states=np.arange(32, dtype=np.float32).reshape(4, 8),
        scale=None,
        expert_routemap_topk=np.array([[0, 1], [1, 2], [2, 3], [3, 0]], np.int32),
        expert_prob_topk=np.full((4, 2), 0.5, np.float32),
        num_experts=4,
        tokens_per_expert=[2, 2, 2, 2],
        padding_alignment=1,
    )
    args.update(changes)
    return args


# ----------------------------------------------------------------- 4: None for a required array

REQUIRED_ARRAYS = [
    ("moe_permute", "hidden_states"),
    ("moe_permute", "expert_routemap_topk"),
    ("moe_permute", "expert_prob_topk"),
    ("moe_unpermute", "hidden_states_unzipped"),
    ("moe_unpermute", "zipped_expertwise_rowmap"),
    ("moe_unpermute", "expert_routemap_topk"),
    ("moe_unpermute", "token_prob_unzipped"),
]


@pytest.mark.parametrize("op,name", REQUIRED_ARRAYS)
def test_none_for_required_array(op, name):
    """A TypeError naming the argument, raised before numba is imported."""
    done = run_python(
        f"""
        import json, sys
        import numpy as np
        from moe_numba import moe_permute, moe_unpermute
        x = np.ones((4, 8), np.float32)
        routemap = np.array([[0, 1], [1, 2], [2, 3], [3, 0]], np.int32)
        probs = np.full((4, 2), 0.5, np.float32)
        rows, rowmap, row_probs, _ = moe_permute(x, None, routemap, probs, 4, [2, 2, 2, 2], 1)
        if "{op}" == "moe_permute":
            call = moe_permute
            args = dict(hidden_states=x, scale=None, expert_routemap_topk=routemap,
                        expert_prob_topk=probs, num_experts=4, tokens_per_expert=[2, 2, 2, 2],
                        padding_alignment=1)
        else:
            call = moe_unpermute
            args = dict(hidden_states_unzipped=rows, zipped_expertwise_rowmap=rowmap,
                        expert_routemap_topk=routemap, token_prob_unzipped=row_probs,
                        total_zipped_tokens=4, num_experts=4)
        args["{name}"] = None
        try:
            call(**args)
            error = ("no error", "")
        except Exception as e:
            error = (type(e).__name__, str(e))
        print(json.dumps([*error, "numba" in sys.modules]))
        """
    )
    assert_survived(done, "[")
    kind, message, numba_imported = json.loads(done.stdout.splitlines()[-1])
    assert kind == "TypeError", f"{kind}: {message}"
    assert message == f"{name} must be a NumPy array, a torch CPU tensor or a CUDA array; got None"
    assert not numba_imported, "a host call with None imported numba"


def test_none_among_torch_tensors():
    """The same TypeError on the torch path (its custom ops would fail on None otherwise)."""
    torch = pytest.importorskip("torch")
    args = {
        k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
        for k, v in permute_args().items()
    }
    rows, rowmap, row_probs, _ = moe_permute(**args)
    args["expert_prob_topk"] = None
    with pytest.raises(
        TypeError,
        match=r"^expert_prob_topk must be a NumPy array, a torch CPU tensor or a CUDA array; "
        r"got None$",
    ):
        moe_permute(**args)
    with pytest.raises(
        TypeError,
        match=r"^token_prob_unzipped must be a NumPy array, a torch CPU tensor or a CUDA array; "
        r"got None$",
    ):
        moe_unpermute(rows, rowmap, args["expert_routemap_topk"], None, 4, 4)


# --------------------------------------------------------------- 5: row counts that overflow


def test_padding_overflow_refused():
    """4 experts padded to 2**62 + 1 rows each need more than 2**63 rows (it wrapped to 4)."""
    with pytest.raises(ValueError, match="padding_alignment"):
        moe_permute(**permute_args(padding_alignment=2**62 + 1))


def test_capacity_sum_overflow_refused():
    """Capacities summing to 2**64 gave R = 0 without validation."""
    with pytest.raises(ValueError, match="tokens_per_expert"):
        moe_permute(**permute_args(tokens_per_expert=[2**62] * 4), validate=False)


# H = 2**16 float32: 2**30 such rows are 2**48 bytes, more than a process can map, so that a
# check that comes too late fails at the allocation instead of filling memory
WIDE = np.ones((4, 1 << 16), np.float32)


def test_rows_past_int32_refused_capacities():
    """R = 2**31 rows cannot be addressed by the int32 row map."""
    with pytest.raises(ValueError, match=r"tokens_per_expert.*2\*\*31|2\*\*31.*tokens_per_expert"):
        moe_permute(
            **permute_args(hidden_states=WIDE, tokens_per_expert=[2**29] * 4), validate=False
        )


def test_rows_past_int32_refused_override():
    with pytest.raises(ValueError, match=r"override_buffer_size.*2\*\*31|2\*\*31.*override_buffer"):
        moe_permute(
            **permute_args(hidden_states=WIDE, tokens_per_expert=None, override_buffer_size=2**31)
        )


# ----------------------------------------------------------------- 6: odd tokens_per_expert


def test_tokens_per_expert_of_0d_arrays_accepted():
    plain = moe_permute(**permute_args())
    odd = moe_permute(**permute_args(tokens_per_expert=[np.array(2)] * 4))
    for a, b in zip(plain, odd, strict=True):
        np.testing.assert_array_equal(a, b)


def test_tokens_per_expert_nested_list_refused():
    with pytest.raises(TypeError, match="tokens_per_expert"):
        moe_permute(**permute_args(tokens_per_expert=[[2], [2], [2], [2]]))


# ------------------------------------------------------------------------ 7: huge scalars

HUGE_SCALARS = [
    ("padding_alignment", dict(padding_alignment=2**63), "9223372036854775808"),
    (
        "override_buffer_size",
        dict(tokens_per_expert=None, override_buffer_size=2**63),
        "9223372036854775808",
    ),
    (
        "num_experts",
        dict(num_experts=2**64, tokens_per_expert=None, override_buffer_size=16),
        "18446744073709551616",
    ),
    (
        "tokens_per_expert",
        dict(tokens_per_expert=np.full(4, 2**63, np.uint64)),
        "9223372036854775808",
    ),
    (
        "tokens_per_expert",
        dict(tokens_per_expert=np.full(4, 2**64 - 1, np.uint64)),
        "18446744073709551615",
    ),
]


@pytest.mark.parametrize(
    "name,changes,value", HUGE_SCALARS, ids=[f"{n}={v}" for n, _, v in HUGE_SCALARS]
)
def test_huge_scalar_named_with_its_value(name, changes, value):
    with pytest.raises((TypeError, ValueError), match=rf"{name}.*{value}") as raised:
        moe_permute(**permute_args(**changes), validate=False)
    assert not isinstance(raised.value, OverflowError)


TOO_LARGE_FOR_MEMORY = [
    ("tokens_per_expert", dict(hidden_states=WIDE, tokens_per_expert=[2**28] * 4)),
    (
        "override_buffer_size",
        dict(hidden_states=WIDE, tokens_per_expert=None, override_buffer_size=2**30),
    ),
    # 2**50 bytes: past the 2**47 bytes a process can map with 4-level page tables, so that
    # malloc fails even where the kernel overcommits memory
    ("num_experts", dict(num_experts=2**46, tokens_per_expert=None, override_buffer_size=16)),
]


@pytest.mark.parametrize(
    "name,changes", TOO_LARGE_FOR_MEMORY, ids=[n for n, _ in TOO_LARGE_FOR_MEMORY]
)
def test_memory_error_names_the_argument(name, changes):
    with pytest.raises(MemoryError, match=name):
        moe_permute(**permute_args(**changes), validate=False)


ROW_LIMIT = "at most 2**31 - 1 are possible (zipped_expertwise_rowmap holds int32 row numbers)"


@pytest.mark.parametrize(
    "changes,rows",
    [
        (dict(padding_alignment=2**62 + 1), 4 * (2**62 + 1)),  # wrapped to 4 in int64
        (dict(tokens_per_expert=[2**62] * 4), 2**64),  # wrapped to 0
        (dict(tokens_per_expert=[0, 0, 2**31 - 2, 1], padding_alignment=2), 2**31),
    ],
)
def test_rows_past_int32_message(changes, rows):
    """The exact row count, however far past int64, and what sized it."""
    align = changes.get("padding_alignment", 1)
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"tokens_per_expert padded to multiples of padding_alignment = {align} need "
            f"{rows} rows; {ROW_LIMIT}"
        ),
    ):
        moe_permute(**permute_args(**changes), validate=False)


def test_rows_at_the_int32_limit_pass_the_check():
    """2**31 - 1 rows are planned (the allocation, of 2**47 bytes here, is what fails)."""
    with pytest.raises(MemoryError, match=r"\(2147483647, 65536\)"):
        moe_permute(
            **permute_args(hidden_states=WIDE, tokens_per_expert=[2**31 - 4, 1, 1, 1]),
            validate=False,
        )


@pytest.mark.parametrize(
    "op,name,value,limit",
    [
        ("permute", "num_experts", 2**64, "2**63 - 1 (int64)"),
        ("permute", "padding_alignment", np.uint64(2**64 - 1), "2**63 - 1 (int64)"),
        (
            "permute",
            "override_buffer_size",
            2**31,
            "2**31 - 1 (zipped_expertwise_rowmap holds int32 row numbers)",
        ),
        ("unpermute", "total_zipped_tokens", 2**63, "2**63 - 1 (int64)"),
        ("unpermute", "num_experts", np.uint64(2**63), "2**63 - 1 (int64)"),
    ],
)
def test_scalar_past_its_limit_message(op, name, value, limit):
    """The limit, where it comes from, and the value as given (never wrapped)."""
    message = f"{name} must be at most {limit}; got {int(value)}"
    with pytest.raises(ValueError, match=re.escape(message) + "$"):
        if op == "permute":
            moe_permute(**permute_args(**{name: value}), validate=False)
        else:
            rows, rowmap, probs, _ = moe_permute(**permute_args())
            args = [rows, rowmap, permute_args()["expert_routemap_topk"], probs, 4, 4]
            args[4 if name == "total_zipped_tokens" else 5] = value
            moe_unpermute(*args)


@pytest.mark.parametrize(
    "counts,message",
    [
        (np.full(4, 2**64 - 1, np.uint64), "at most 2**63 - 1 (int64); got "),
        ([0, 2**64, 0, 0], "at most 2**63 - 1 (int64); got "),  # no NumPy integer type
        ([0, -1, 2**63, 0], ">= 0; got "),  # NumPy reads these as float64
    ],
)
def test_capacity_out_of_int64_message(counts, message):
    e = 1 if isinstance(counts, list) else 0
    value = int(counts[e])
    with pytest.raises(
        ValueError,
        match=re.escape(f"tokens_per_expert must be {message}tokens_per_expert[{e}] = {value}"),
    ):
        moe_permute(**permute_args(tokens_per_expert=counts), validate=False)


def test_nested_capacities_message():
    with pytest.raises(
        TypeError,
        match=re.escape(
            "tokens_per_expert must be a flat sequence of ints; got a sequence of sequences "
            "(shape (4, 1))"
        ),
    ):
        moe_permute(**permute_args(tokens_per_expert=[[2], [2], [2], [2]]))


def test_capacities_array_of_wrong_shape_stays_a_value_error():
    with pytest.raises(ValueError, match=re.escape("got shape (4, 1)")):
        moe_permute(**permute_args(tokens_per_expert=np.full((4, 1), 2)))


def test_capacities_of_0d_arrays_are_not_remembered():
    """Unhashable capacities are read anew on every call (a memo keyed on anything less than
    their values would reuse the first call's)."""
    moe_permute(**permute_args(tokens_per_expert=[np.array(2)] * 4))
    wrong = [np.array(2), np.array(3), np.array(1), np.array(2)]
    with pytest.raises(ValueError, match=r"tokens_per_expert\[1\] = 3 but the routing map"):
        moe_permute(**permute_args(tokens_per_expert=wrong))


OVERRIDE = dict(tokens_per_expert=None, override_buffer_size=16)


def test_padding_of_counted_tokens_past_int64_refused():
    """Under override_buffer_size the counts are found on the device, where their padding is
    int64: an alignment with which 8 (token, expert) pairs could need more than 2**63 - 1 rows
    is refused."""
    largest = (2**63 - 1 - 8) // 4 + 1  # 8 + 4 * (A - 1) rows at most
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"padding_alignment = {largest + 1} is too large: 8 (token, expert) pairs padded "
            "to it could need more than 2**63 - 1 rows (int64)"
        ),
    ):
        moe_permute(**permute_args(padding_alignment=largest + 1, **OVERRIDE), validate=False)
    # the largest accepted: 4 experts of 2 tokens, each padded to it, exactly
    with pytest.raises(
        ValueError, match=f"the routing map needs {4 * largest} rows with padding_alignment"
    ):
        moe_permute(**permute_args(padding_alignment=largest, **OVERRIDE))


@pytest.mark.parametrize(
    "changes,output,shape,nbytes,sized_by",
    [
        (
            dict(num_experts=2**61, **OVERRIDE),  # past what a size in bytes can hold
            "zipped_expertwise_rowmap",
            (4, 2**61),
            2**65,
            "num_experts",
        ),
        (
            dict(hidden_states=WIDE, tokens_per_expert=[2**28] * 4),
            "hidden_states_unzipped",
            (2**30, 2**16),
            2**48,
            "tokens_per_expert and padding_alignment",
        ),
        (
            dict(hidden_states=WIDE, tokens_per_expert=None, override_buffer_size=2**30),
            "hidden_states_unzipped",
            (2**30, 2**16),
            2**48,
            "override_buffer_size",
        ),
    ],
)
def test_memory_error_message(changes, output, shape, nbytes, sized_by):
    message = f"cannot allocate {output} of shape {shape} ("
    with pytest.raises(MemoryError, match=re.escape(message)) as raised:
        moe_permute(**permute_args(**changes), validate=False)
    assert str(raised.value).endswith(f"): {nbytes} bytes, sized by {sized_by}")


def test_unpermute_memory_error_names_total_zipped_tokens():
    """2**22 tokens of 2**24 float32 columns: 2**48 bytes (the inputs are zero pages)."""
    T, H = 2**22, 2**24
    rows = np.zeros((1, H), np.float32)
    rowmap = np.zeros((T, 1), np.int32)
    routemap = np.zeros((T, 1), np.int32)
    with pytest.raises(
        MemoryError,
        match=re.escape(
            f"cannot allocate hidden_states of shape ({T}, {H}) (float32): {2**48} bytes, "
            "sized by total_zipped_tokens"
        ),
    ):
        moe_unpermute(rows, rowmap, routemap, np.ones(1, np.float32), T, 1, validate=False)


# ------------------------------------------- 8: a device array as tokens_per_expert (simulator)


@pytest.mark.sim
def test_simulator_device_tokens_per_expert_refused():
    """As on a real GPU: counts on the device are refused, never copied to the host."""
    from numba import cuda

    args = {
        k: cuda.to_device(v) if isinstance(v, np.ndarray) else v for k, v in permute_args().items()
    }
    args["tokens_per_expert"] = cuda.to_device(np.array([2, 2, 2, 2], np.int64))
    with pytest.raises(TypeError, match=r"tokens_per_expert must be a host sequence"):
        moe_permute(**args)


def test_permute_args_are_valid():
    """The base case of the tests above is a valid call (so each refusal is the change's)."""
    want, _ = oracle.permute(**permute_args())
    for got, expected in zip(moe_permute(**permute_args()), want, strict=True):
        np.testing.assert_array_equal(got, expected)
