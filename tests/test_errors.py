"""Every error message: the right exception, naming the argument, on every backend."""

import re

import ml_dtypes
import numpy as np
import pytest

from moe_numba import moe_permute, moe_unpermute

PERMUTE_ARGS = (
    "hidden_states",
    "scale",
    "expert_routemap_topk",
    "expert_prob_topk",
    "num_experts",
    "tokens_per_expert",
    "padding_alignment",
)
UNPERMUTE_ARGS = (
    "hidden_states_unzipped",
    "zipped_expertwise_rowmap",
    "expert_routemap_topk",
    "token_prob_unzipped",
    "total_zipped_tokens",
    "num_experts",
)


def permute_defaults():
    """4 tokens, H=3, K=2, E=3: expert counts [2, 2, 1]."""
    return dict(
        hidden_states=np.arange(12, dtype=np.float32).reshape(4, 3).astype(ml_dtypes.bfloat16),
        scale=None,
        expert_routemap_topk=np.array([[0, 1], [1, -1], [2, 0], [-1, -1]], np.int32),
        expert_prob_topk=np.full((4, 2), 0.5, np.float32),
        num_experts=3,
        tokens_per_expert=[2, 2, 1],
        padding_alignment=2,
    )


def unpermute_defaults():
    """The outputs of permute_defaults() (6 rows)."""
    return dict(
        hidden_states_unzipped=np.ones((6, 3), ml_dtypes.bfloat16),
        zipped_expertwise_rowmap=np.array(
            [[0, 2, -1], [-1, 3, -1], [1, -1, 4], [-1, -1, -1]], np.int32
        ),
        expert_routemap_topk=np.array([[0, 1], [1, -1], [2, 0], [-1, -1]], np.int32),
        token_prob_unzipped=np.full(6, 0.5, np.float32),
        total_zipped_tokens=4,
        num_experts=3,
    )


def setter(**changes):
    def change(args):
        args.update(changes)

    return change


def with_array(name, make):
    def change(args):
        args[name] = make(args[name])

    return change


def with_entry(name, index, value):
    def change(args):
        args[name] = args[name].copy()
        args[name][index] = value

    return change


PERMUTE_ERRORS = [
    (
        "hidden dtype",
        with_array("hidden_states", lambda x: x.astype(np.int32)),
        TypeError,
        "hidden_states must have dtype .*; got int32",
    ),
    (
        "hidden float64",
        with_array("hidden_states", lambda x: x.astype(np.float64)),
        TypeError,
        "hidden_states must have dtype .*; got float64",
    ),
    (
        "hidden 1-D",
        with_array("hidden_states", lambda x: x.reshape(-1)),
        ValueError,
        r"hidden_states must be 2-D \[num_tokens, hidden\]; got shape \(12,\)",
    ),
    (
        "hidden no columns",
        with_array("hidden_states", lambda x: x[:, :0].copy()),
        ValueError,
        "hidden_states must have at least one column",
    ),
    (
        "hidden a list",
        setter(hidden_states=[[1.0, 2.0]]),
        TypeError,
        "hidden_states must be a NumPy array, a torch CPU tensor or a CUDA array .*got "
        "builtins.list",
    ),
    (
        "routemap dtype",
        with_array("expert_routemap_topk", lambda x: x.astype(np.float32)),
        TypeError,
        "expert_routemap_topk must have dtype int32, int64; got float32",
    ),
    (
        "routemap 1-D",
        with_array("expert_routemap_topk", lambda x: x[:, 0].copy()),
        ValueError,
        r"expert_routemap_topk must be 2-D \[num_tokens, topk\]",
    ),
    (
        "routemap tokens",
        with_array("expert_routemap_topk", lambda x: x[:3].copy()),
        ValueError,
        r"expert_routemap_topk must have shape \[num_tokens, topk\] = \(4, 2\); got \(3, 2\)",
    ),
    (
        "routemap no slots",
        with_array("expert_routemap_topk", lambda x: x[:, :0].copy()),
        ValueError,
        "expert_routemap_topk must have topk >= 1",
    ),
    (
        "probs dtype",
        with_array("expert_prob_topk", lambda x: x.astype(np.float64)),
        TypeError,
        "expert_prob_topk must have dtype float32; got float64",
    ),
    (
        "probs shape",
        with_array("expert_prob_topk", lambda x: x[:, :1].copy()),
        ValueError,
        r"expert_prob_topk must have shape \[num_tokens, topk\] = \(4, 2\); got \(4, 1\)",
    ),
    (
        "scale dtype",
        setter(scale=np.ones((4, 1), np.int32)),
        TypeError,
        "scale must have dtype float32 with using_ue8m0_scale=False; got int32",
    ),
    (
        "ue8m0 scale dtype",
        setter(scale=np.ones((4, 1), np.float32), using_ue8m0_scale=True),
        TypeError,
        "scale must have dtype int32 with using_ue8m0_scale=True; got float32",
    ),
    (
        "scale tokens",
        setter(scale=np.ones((3, 1), np.float32)),
        ValueError,
        r"scale must have shape \[num_tokens, scale_width >= 1\] .*got \(3, 1\)",
    ),
    (
        "scale no columns",
        setter(scale=np.ones((4, 0), np.float32)),
        ValueError,
        r"scale must have shape \[num_tokens, scale_width >= 1\]",
    ),
    ("scale 1-D", setter(scale=np.ones(4, np.float32)), ValueError, "scale must be 2-D"),
    (
        "float8 without scale",
        with_array("hidden_states", lambda x: x.astype(ml_dtypes.float8_e4m3fn)),
        ValueError,
        "scale is required for float8 hidden_states",
    ),
    ("num_experts zero", setter(num_experts=0), ValueError, "num_experts must be >= 1; got 0"),
    (
        "num_experts float",
        setter(num_experts=3.0),
        TypeError,
        "num_experts must be an int; got float 3.0",
    ),
    ("num_experts bool", setter(num_experts=True), TypeError, "num_experts must be an int"),
    (
        "alignment zero",
        setter(padding_alignment=0),
        ValueError,
        "padding_alignment must be >= 1; got 0",
    ),
    (
        "tokens_per_expert length",
        setter(tokens_per_expert=[2, 2]),
        ValueError,
        r"tokens_per_expert must hold num_experts = 3 values; got shape \(2,\)",
    ),
    (
        "tokens_per_expert negative",
        setter(tokens_per_expert=[2, -1, 1]),
        ValueError,
        r"tokens_per_expert must be >= 0; got tokens_per_expert\[1\] = -1",
    ),
    (
        "tokens_per_expert None",
        setter(tokens_per_expert=None),
        TypeError,
        "tokens_per_expert must be a sequence of num_experts ints",
    ),
    (
        "tokens_per_expert floats",
        setter(tokens_per_expert=[2.0, 2.0, 1.0]),
        TypeError,
        "tokens_per_expert must hold ints; got dtype float64",
    ),
    (
        "override below -1",
        setter(override_buffer_size=-2),
        ValueError,
        "override_buffer_size must be >= -1; got -2",
    ),
    (
        "do_gather not bool",
        setter(do_gather="yes"),
        TypeError,
        "do_gather must be a bool; got str 'yes'",
    ),
    (
        "ue8m0 flag not bool",
        setter(using_ue8m0_scale=1),
        TypeError,
        "using_ue8m0_scale must be a bool",
    ),
    (
        "indices flag not bool",
        setter(return_expert_indices=None),
        TypeError,
        "return_expert_indices must be a bool",
    ),
    (
        "offsets flag not bool",
        setter(return_expert_offsets="yes"),
        TypeError,
        "return_expert_offsets must be a bool; got str 'yes'",
    ),
    ("validate not bool", setter(validate=1), TypeError, "validate must be a bool; got int 1"),
    # values: validate=True only
    (
        "bad expert id",
        with_entry("expert_routemap_topk", (2, 1), 7),
        ValueError,
        r"expert_routemap_topk\[2, 1\] = 7 is not an expert id: ids must be -1 or in "
        r"\[0, num_experts=3\)",
    ),
    (
        "negative expert id",
        with_entry("expert_routemap_topk", (3, 0), -2),
        ValueError,
        r"expert_routemap_topk\[3, 0\] = -2 is not an expert id",
    ),
    (
        "repeated expert",
        with_entry("expert_routemap_topk", (0, 1), 0),
        ValueError,
        r"expert_routemap_topk\[0, 1\] = 0 repeats an expert of an earlier slot of token 0",
    ),
    (
        "count mismatch",
        setter(tokens_per_expert=[2, 3, 1]),
        ValueError,
        r"tokens_per_expert\[1\] = 3 but the routing map sends 2 tokens to expert 1",
    ),
    (
        "override too small",
        setter(override_buffer_size=5),
        ValueError,
        "override_buffer_size = 5 rows is too small: the routing map needs 6 rows with "
        "padding_alignment = 2",
    ),
]

UNPERMUTE_ERRORS = [
    (
        "rows dtype",
        with_array("hidden_states_unzipped", lambda x: x.astype(np.int16)),
        TypeError,
        "hidden_states_unzipped must have dtype .*; got int16",
    ),
    (
        "rows float8",
        with_array("hidden_states_unzipped", lambda x: x.astype(ml_dtypes.float8_e4m3fn)),
        TypeError,
        "hidden_states_unzipped must have dtype .*; got float8_e4m3fn",
    ),
    (
        "rows 1-D",
        with_array("hidden_states_unzipped", lambda x: x.reshape(-1)),
        ValueError,
        r"hidden_states_unzipped must be 2-D \[rows, hidden\]",
    ),
    (
        "rows no columns",
        with_array("hidden_states_unzipped", lambda x: x[:, :0].copy()),
        ValueError,
        "hidden_states_unzipped must have at least one column",
    ),
    (
        "rowmap dtype",
        with_array("zipped_expertwise_rowmap", lambda x: x.astype(np.int64)),
        TypeError,
        "zipped_expertwise_rowmap must have dtype int32; got int64",
    ),
    (
        "rowmap experts",
        setter(num_experts=4),
        ValueError,
        r"zipped_expertwise_rowmap must have shape \[total_zipped_tokens, num_experts\] = "
        r"\(4, 4\); got \(4, 3\)",
    ),
    (
        "tokens",
        setter(total_zipped_tokens=5),
        ValueError,
        r"zipped_expertwise_rowmap must have shape .* = \(5, 3\); got \(4, 3\)",
    ),
    (
        "tokens negative",
        setter(total_zipped_tokens=-1),
        ValueError,
        "total_zipped_tokens must be >= 0; got -1",
    ),
    (
        "routemap tokens",
        with_array("expert_routemap_topk", lambda x: x[:2].copy()),
        ValueError,
        r"expert_routemap_topk must have shape \[total_zipped_tokens, topk\] = \(4, 2\); "
        r"got \(2, 2\)",
    ),
    (
        "routemap dtype",
        with_array("expert_routemap_topk", lambda x: x.astype(np.int16)),
        TypeError,
        "expert_routemap_topk must have dtype int32, int64; got int16",
    ),
    (
        "probs shape",
        with_array("token_prob_unzipped", lambda x: x[:5].copy()),
        ValueError,
        r"token_prob_unzipped must have shape \[rows\] or \[rows, 1\] with rows = 6 .*got \(5,\)",
    ),
    (
        "probs dtype",
        with_array("token_prob_unzipped", lambda x: x.astype(np.float16)),
        TypeError,
        "token_prob_unzipped must have dtype float32; got float16",
    ),
    (
        "weighted not bool",
        setter(using_weighted_combine="no"),
        TypeError,
        "using_weighted_combine must be a bool",
    ),
    (
        "mix not bool",
        setter(using_mix_precision=0),
        TypeError,
        "using_mix_precision must be a bool",
    ),
    # values: validate=True only
    (
        "row out of range",
        with_entry("zipped_expertwise_rowmap", (1, 2), 6),
        ValueError,
        r"zipped_expertwise_rowmap\[1, 2\] = 6 is not a row: entries must be -1 or in "
        r"\[0, rows=6\)",
    ),
    (
        "row below -1",
        with_entry("zipped_expertwise_rowmap", (3, 0), -7),
        ValueError,
        r"zipped_expertwise_rowmap\[3, 0\] = -7 is not a row",
    ),
    (
        "bad expert id",
        with_entry("expert_routemap_topk", (1, 1), 3),
        ValueError,
        r"expert_routemap_topk\[1, 1\] = 3 is not an expert id",
    ),
]


def _device_args(backend, args):
    return {k: backend.to_device(v) if isinstance(v, np.ndarray) else v for k, v in args.items()}


@pytest.mark.parametrize(
    "change, error, message",
    [case[1:] for case in PERMUTE_ERRORS],
    ids=[case[0] for case in PERMUTE_ERRORS],
)
def test_permute_errors(backend, change, error, message):
    args = permute_defaults()
    change(args)
    if backend.name == "cupy" and any(
        isinstance(v, np.ndarray) and v.dtype.name.startswith("float8") for v in args.values()
    ):
        pytest.skip("CuPy has no float8 dtype")
    with pytest.raises(error, match=message):
        moe_permute(**_device_args(backend, args))


@pytest.mark.parametrize(
    "change, error, message",
    [case[1:] for case in UNPERMUTE_ERRORS],
    ids=[case[0] for case in UNPERMUTE_ERRORS],
)
def test_unpermute_errors(backend, change, error, message):
    args = unpermute_defaults()
    change(args)
    if backend.name == "cupy" and args["hidden_states_unzipped"].dtype.name.startswith("float8"):
        pytest.skip("CuPy has no float8 dtype")
    with pytest.raises(error, match=message):
        moe_unpermute(**_device_args(backend, args))


def test_defaults_are_valid(backend):
    """The tables above change one thing in a call that succeeds."""
    moe_permute(**_device_args(backend, permute_defaults()))
    moe_unpermute(**_device_args(backend, unpermute_defaults()))


def test_strided_input_is_rejected(backend):
    args = _device_args(backend, permute_defaults())
    args["expert_prob_topk"] = backend.to_device(np.full((4, 4), 0.5, np.float32))[:, ::2]
    with pytest.raises(ValueError, match=re.escape("expert_prob_topk must be C-contiguous")):
        moe_permute(**args)


def test_checks_are_remembered_per_call_key(backend):
    """A call's checks are remembered by its arrays' type, shape, dtype, strides and device
    and its scalars' types and values; a call that differs in any of them is checked anew."""
    args = _device_args(backend, permute_defaults())
    moe_permute(**args)
    strided = dict(args, expert_prob_topk=backend.to_device(np.full((4, 4), 0.5, np.float32)))
    strided["expert_prob_topk"] = strided["expert_prob_topk"][:, ::2]  # same shape and dtype
    for _ in range(2):
        with pytest.raises(ValueError, match=re.escape("expert_prob_topk must be C-contiguous")):
            moe_permute(**strided)
    with pytest.raises(TypeError, match="num_experts must be an int; got float 3.0"):
        moe_permute(**dict(args, num_experts=3.0))  # equal to 3 and hashed alike
    with pytest.raises(TypeError, match="tokens_per_expert must hold ints; got dtype float64"):
        moe_permute(**dict(args, tokens_per_expert=[2.0, 2.0, 1.0]))
    moe_permute(**args)
    moe_unpermute(**_device_args(backend, unpermute_defaults()))
    with pytest.raises(TypeError, match="using_weighted_combine must be a bool; got int 1"):
        moe_unpermute(**_device_args(backend, unpermute_defaults()), using_weighted_combine=1)


def test_value_errors_are_raised_only_with_validate(backend):
    args = permute_defaults()
    args["expert_routemap_topk"] = np.array([[0, 0], [1, 9], [2, 0], [-1, -1]], np.int32)
    args["tokens_per_expert"] = [1, 5, 0]
    outputs = moe_permute(**_device_args(backend, args), validate=False)
    rowmap = backend.to_host(outputs[1])
    # expert 0: tokens 0 and 2 (its repeat in token 0 ignored) but capacity 1: token 2 dropped;
    # expert 2 has capacity 0: token 2 dropped; the id 9 is ignored
    np.testing.assert_array_equal(rowmap, [[0, -1, -1], [-1, 2, -1], [-1, -1, -1], [-1, -1, -1]])
    with pytest.raises(ValueError, match=r"expert_routemap_topk\[1, 1\] = 9 is not an expert id"):
        moe_permute(**_device_args(backend, args))
