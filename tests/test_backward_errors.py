"""Every error of the gradient ops, on every backend; and their CPU glue and kernels called
directly (outputs from a poisoning allocator, the status table, the kernels' own checks)."""

import re

import ml_dtypes
import numpy as np
import pytest

import moe_cpu
from _cases import plan_of
from _gradients import with_gradients
from moe_cpu import _backward
from moe_numba import abi, backends, moe_permute_backward, moe_unpermute_backward, oracle
from moe_numba.ops import (
    PERMUTE_BACKWARD,
    UNPERMUTE_BACKWARD,
    PermuteBackwardArrays,
    UnpermuteBackwardArrays,
)

ROWMAP = np.array([[0, 2, -1], [-1, 3, -1], [1, -1, 4], [-1, -1, -1]], np.int32)  # R = 6
ROUTEMAP = np.array([[0, 1], [1, -1], [2, 0], [-1, -1]], np.int32)


def permute_defaults():
    return dict(
        grad_hidden_states_unzipped=np.ones((6, 3), ml_dtypes.bfloat16),
        grad_token_prob_unzipped=np.ones(6, np.float32),
        zipped_expertwise_rowmap=ROWMAP.copy(),
        expert_routemap_topk=ROUTEMAP.copy(),
    )


def unpermute_defaults():
    return dict(
        grad_hidden_states=np.ones((4, 3), ml_dtypes.bfloat16),
        grad_expert_prob_topk=np.ones((4, 2), np.float32),
        hidden_states_unzipped=np.ones((6, 3), ml_dtypes.bfloat16),
        zipped_expertwise_rowmap=ROWMAP.copy(),
        expert_routemap_topk=ROUTEMAP.copy(),
        token_prob_unzipped=np.full(6, 0.5, np.float32),
        using_weighted_combine=True,
        num_rows=6,
    )


def change(**changes):
    """Replace arguments; a callable value is applied to the default array."""

    def apply(args):
        for name, value in changes.items():
            args[name] = value(args[name]) if callable(value) else value

    return apply


def entry(name, index, value):
    def apply(args):
        args[name] = args[name].copy()
        args[name][index] = value

    return apply


MAP_ERRORS = [
    ("validate", change(validate=1), TypeError, "validate must be a bool; got int 1"),
    (
        "rowmap 1-D",
        change(zipped_expertwise_rowmap=lambda x: x.reshape(-1)),
        ValueError,
        r"zipped_expertwise_rowmap must be 2-D \[num_tokens, num_experts\]; got shape \(12,\)",
    ),
    (
        "rowmap dtype",
        change(zipped_expertwise_rowmap=lambda x: x.astype(np.int64)),
        TypeError,
        "zipped_expertwise_rowmap must have dtype int32; got int64",
    ),
    (
        "rowmap no experts",
        change(zipped_expertwise_rowmap=lambda x: x[:, :0].copy()),
        ValueError,
        r"zipped_expertwise_rowmap must have num_experts >= 1 columns; got shape \(4, 0\)",
    ),
    (
        "routemap dtype",
        change(expert_routemap_topk=lambda x: x.astype(np.float32)),
        TypeError,
        "expert_routemap_topk must have dtype int32, int64; got float32",
    ),
    (
        "routemap 1-D",
        change(expert_routemap_topk=lambda x: x[:, 0].copy()),
        ValueError,
        r"expert_routemap_topk must be 2-D \[num_tokens, topk\]; got shape \(4,\)",
    ),
    (
        "routemap tokens",
        change(expert_routemap_topk=lambda x: x[:3].copy()),
        ValueError,
        r"expert_routemap_topk must have shape \[num_tokens, topk >= 1\] with num_tokens = 4 "
        r"\(the rows of zipped_expertwise_rowmap\); got \(3, 2\)",
    ),
    (
        "routemap no slots",
        change(expert_routemap_topk=lambda x: x[:, :0].copy()),
        ValueError,
        r"expert_routemap_topk must have shape \[num_tokens, topk >= 1\] .*got \(4, 0\)",
    ),
    (
        "rowmap a list",
        change(zipped_expertwise_rowmap=lambda x: x.tolist()),
        TypeError,
        "zipped_expertwise_rowmap must be a NumPy array, a torch CPU tensor or a CUDA array .*got "
        "builtins.list",
    ),
]


def rows_errors(name, tokens):
    """The errors of gradient rows ``name`` (``tokens`` of them by default)."""
    return [
        (
            f"{name} float8",
            change(**{name: lambda x: x.astype(ml_dtypes.float8_e4m3fn)}),
            TypeError,
            f"{name} has dtype float8_e4m3fn: float8 rows have no gradient",
        ),
        (
            f"{name} dtype",
            change(**{name: lambda x: x.astype(np.int32)}),
            TypeError,
            f"{name} must have dtype bfloat16, float16, float32; got int32",
        ),
        (
            f"{name} 1-D",
            change(**{name: lambda x: x.reshape(-1)}),
            ValueError,
            rf"{name} must be 2-D \[rows, hidden\]; got shape \({tokens * 3},\)",
        ),
        (
            f"{name} no columns",
            change(**{name: lambda x: x[:, :0].copy()}),
            ValueError,
            rf"{name} must have at least one column; got shape \({tokens}, 0\)",
        ),
    ]


PERMUTE_ERRORS = [
    *MAP_ERRORS,
    *rows_errors("grad_hidden_states_unzipped", 6),
    (
        "probs dtype",
        change(grad_token_prob_unzipped=lambda x: x.astype(np.float64)),
        TypeError,
        "grad_token_prob_unzipped must have dtype float32; got float64",
    ),
    (
        "probs rows",
        change(grad_token_prob_unzipped=lambda x: x[:5].copy()),
        ValueError,
        r"grad_token_prob_unzipped must have shape \[rows of grad_hidden_states_unzipped\] = "
        r"\(6,\); got \(5,\)",
    ),
    (
        "probs alone 2-D",
        change(grad_hidden_states_unzipped=None, grad_token_prob_unzipped=np.ones((6, 1))),
        TypeError,
        "grad_token_prob_unzipped must have dtype float32; got float64",
    ),
    (
        "probs alone 2-D float32",
        change(grad_hidden_states_unzipped=None, grad_token_prob_unzipped=np.ones((6, 1), "f4")),
        ValueError,
        r"grad_token_prob_unzipped must be 1-D \[rows\]; got shape \(6, 1\)",
    ),
    (
        "bad row",
        entry("zipped_expertwise_rowmap", (1, 0), 6),
        ValueError,
        r"zipped_expertwise_rowmap\[1, 0\] = 6 is not a row: entries must be -1 or in "
        r"\[0, rows=6\)",
    ),
    (
        "bad row, R from the probabilities",
        change(grad_hidden_states_unzipped=None, grad_token_prob_unzipped=np.ones(4, "f4")),
        ValueError,
        r"zipped_expertwise_rowmap\[2, 2\] = 4 is not a row: .*\[0, rows=4\)",
    ),
    (
        "bad id",
        entry("expert_routemap_topk", (1, 1), 3),
        ValueError,
        r"expert_routemap_topk\[1, 1\] = 3 is not an expert id: ids must be -1 or in "
        r"\[0, num_experts=3\)",
    ),
]

UNPERMUTE_ERRORS = [
    *MAP_ERRORS,
    *rows_errors("grad_hidden_states", 4),
    (
        "weighted not bool",
        change(using_weighted_combine=None),
        TypeError,
        "using_weighted_combine must be a bool; got NoneType None",
    ),
    ("num_rows float", change(num_rows=6.0), TypeError, "num_rows must be an int; got float 6.0"),
    ("num_rows negative", change(num_rows=-1), ValueError, "num_rows must be >= 0; got -1"),
    (
        "grad tokens",
        change(grad_hidden_states=lambda x: x[:3].copy()),
        ValueError,
        r"grad_hidden_states must have shape \[num_tokens, hidden\] = \(4, 3\); got \(3, 3\)",
    ),
    (
        "slot grad dtype",
        change(grad_expert_prob_topk=lambda x: x.astype(np.float16)),
        TypeError,
        "grad_expert_prob_topk must have dtype float32; got float16",
    ),
    (
        "slot grad shape",
        change(grad_expert_prob_topk=lambda x: x[:, :1].copy()),
        ValueError,
        r"grad_expert_prob_topk must have shape \[num_tokens, topk\] = \(4, 2\); got \(4, 1\)",
    ),
    (
        "rows dtype",
        change(hidden_states_unzipped=lambda x: x.astype(np.float16)),
        TypeError,
        r"hidden_states_unzipped must have the dtype of grad_hidden_states \(bfloat16\); got "
        "float16",
    ),
    (
        "rows dtype without grad",
        change(grad_hidden_states=None, hidden_states_unzipped=lambda x: x.astype(np.int32)),
        TypeError,
        "hidden_states_unzipped must have dtype bfloat16, float16, float32; got int32",
    ),
    (
        "rows count",
        change(hidden_states_unzipped=lambda x: x[:5].copy()),
        ValueError,
        r"hidden_states_unzipped must have shape \[num_rows, hidden\] = \(6, 3\); got \(5, 3\)",
    ),
    (
        "rows width",
        change(hidden_states_unzipped=lambda x: x[:, :2].copy()),
        ValueError,
        r"hidden_states_unzipped must have shape \[num_rows, hidden\] = \(6, 3\); got \(6, 2\)",
    ),
    (
        "rows count without grad",
        change(grad_hidden_states=None, num_rows=5),
        ValueError,
        r"hidden_states_unzipped must have shape \[num_rows, hidden\] = \(5, 3\); got \(6, 3\)",
    ),
    (
        "rows 1-D",
        change(hidden_states_unzipped=lambda x: x.reshape(-1)),
        ValueError,
        r"hidden_states_unzipped must be 2-D \[num_rows, hidden\]; got shape \(18,\)",
    ),
    (
        "probs missing",
        change(token_prob_unzipped=None),
        TypeError,
        "token_prob_unzipped is required when using_weighted_combine=True; got None",
    ),
    (
        "probs dtype",
        change(token_prob_unzipped=lambda x: x.astype(np.float64)),
        TypeError,
        "token_prob_unzipped must have dtype float32; got float64",
    ),
    (
        "probs count",
        change(token_prob_unzipped=lambda x: x[:5].copy()),
        ValueError,
        r"token_prob_unzipped must have shape \[num_rows\] or \[num_rows, 1\] with num_rows = 6; "
        r"got \(5,\)",
    ),
    (
        "bad row",
        entry("zipped_expertwise_rowmap", (3, 2), -3),
        ValueError,
        r"zipped_expertwise_rowmap\[3, 2\] = -3 is not a row: entries must be -1 or in "
        r"\[0, rows=6\)",
    ),
    (
        "bad id",
        entry("expert_routemap_topk", (3, 0), -9),
        ValueError,
        r"expert_routemap_topk\[3, 0\] = -9 is not an expert id",
    ),
    (
        "row named twice",
        entry("zipped_expertwise_rowmap", (3, 1), 3),
        ValueError,
        re.escape(
            "zipped_expertwise_rowmap[1, 1] and zipped_expertwise_rowmap[3, 1] both name row 3: "
            "each row holds one (token, expert) pair, as moe_permute writes them"
        ),
    ),
]


def _ids(table):
    return [case[0] for case in table]


# found by the backend (its status words), not by the metadata checks
VALUE_ERRORS = {"bad row", "bad row, R from the probabilities", "bad id", "row named twice"}


@pytest.mark.parametrize("what, apply, error, message", PERMUTE_ERRORS, ids=_ids(PERMUTE_ERRORS))
def test_permute_backward_errors(backend, what, apply, error, message):
    if what in VALUE_ERRORS:
        backend = with_gradients(backend)
    args = permute_defaults()
    apply(args)
    dev = backend.to_device
    args = {k: dev(v) if isinstance(v, np.ndarray) else v for k, v in args.items()}
    positional = [args.pop(k) for k in list(permute_defaults())]
    with pytest.raises(error, match=message):
        moe_permute_backward(*positional, **args)


@pytest.mark.parametrize(
    "what, apply, error, message", UNPERMUTE_ERRORS, ids=_ids(UNPERMUTE_ERRORS)
)
def test_unpermute_backward_errors(backend, what, apply, error, message):
    if what in VALUE_ERRORS:
        backend = with_gradients(backend)
    args = unpermute_defaults()
    apply(args)
    dev = backend.to_device
    args = {k: dev(v) if isinstance(v, np.ndarray) else v for k, v in args.items()}
    positional = [args.pop(k) for k in list(unpermute_defaults())[:6]]
    with pytest.raises(error, match=message):
        moe_unpermute_backward(*positional, **args)


def test_strided_input_is_rejected(backend):
    dev = backend.to_device
    strided = dev(np.repeat(ROWMAP, 2, axis=1))[:, ::2]  # a view made on the array's device
    match = re.escape("zipped_expertwise_rowmap must be C-contiguous")
    with pytest.raises(ValueError, match=match):
        moe_permute_backward(None, dev(np.ones(6, np.float32)), strided, dev(ROUTEMAP))
    with pytest.raises(ValueError, match=match):
        moe_unpermute_backward(
            None, dev(np.ones((4, 2), np.float32)), None, strided, dev(ROUTEMAP), None,
            using_weighted_combine=False, num_rows=6,
        )  # fmt: skip


def test_validate_false_never_raises_for_values(backend):
    dev = with_gradients(backend).to_device
    rowmap = dev(np.array([[9, 1, -4], [1, 0, 2]], np.int32))  # 9, -4: bad; row 1 twice
    routemap = dev(np.array([[7, 0], [-2, 2]], np.int32))
    rows = dev(np.ones((3, 2), np.float32))
    probs = dev(np.ones(3, np.float32))
    moe_permute_backward(rows, probs, rowmap, routemap, validate=False)
    moe_unpermute_backward(
        dev(np.ones((2, 2), np.float32)), None, rows, rowmap, routemap, probs,
        using_weighted_combine=True, num_rows=3, validate=False,
    )  # fmt: skip


# -------------------------------------------------------------- the CPU glue, white box


def poison(shape, dtype):
    """Outputs full of 0xFF bytes (NaN for every float dtype): an unwritten element shows."""
    out = np.empty(shape, dtype)
    out.view(np.uint8)[...] = 0xFF
    return out


@pytest.mark.parametrize("given", ["both", "rows", "probs"])
@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.float16])
def test_cpu_glue_writes_every_output(given, dtype):
    rng = np.random.default_rng(31)
    rows = rng.standard_normal((6, 5)).astype(dtype) if given != "probs" else None
    probs = rng.standard_normal(6).astype(np.float32) if given != "rows" else None
    arrays = PermuteBackwardArrays(rows, probs, ROWMAP, ROUTEMAP)
    plan = plan_of(PERMUTE_BACKWARD, arrays, validate=True)
    outputs, status = backends.cpu_backend().permute_backward(plan, arrays, poison)
    expected, expected_status = oracle.permute_backward(*arrays)
    for a, b in zip(outputs, expected, strict=True):
        assert (a is None and b is None) or a.tobytes() == b.tobytes()
    assert status.tolist() == expected_status.tolist()

    dy = rng.standard_normal((4, 5)).astype(dtype) if given != "probs" else None
    g = rng.standard_normal((4, 2)).astype(np.float32) if given != "rows" else None
    xu = rng.standard_normal((6, 5)).astype(dtype)
    p = rng.random(6, dtype=np.float32)
    arrays = UnpermuteBackwardArrays(dy, g, xu, ROWMAP, ROUTEMAP, p)
    plan = plan_of(UNPERMUTE_BACKWARD, arrays, using_weighted_combine=True, num_rows=6)
    outputs, status = backends.cpu_backend().unpermute_backward(plan, arrays, poison)
    expected, expected_status = oracle.unpermute_backward(*arrays, True, 6)
    for a, b in zip(outputs, expected, strict=True):
        assert (a is None and b is None) or a.tobytes() == b.tobytes()
    assert status.tolist() == expected_status.tolist()


def test_status_slots_are_published():
    """moe_numba checks moe_cpu.STATUS_SLOTS against abi at import: the gradient slots must
    be among them."""
    for name in ("UNPERMUTE_BACKWARD_DUPLICATE_ROW", "UNPERMUTE_BACKWARD_STATUS_LEN"):
        assert moe_cpu.STATUS_SLOTS[name] == getattr(abi, name) == abi.STATUS_SLOTS[name]


def kernel_args():
    """moe_cpu.permute_backward_probs's and unpermute_backward's arguments for ROWMAP."""
    f4 = np.float32
    permute = dict(
        grad_probs=np.zeros(6, f4),
        rowmap=ROWMAP,
        routemap=ROUTEMAP,
        out_probs=np.zeros((4, 2), f4),
        status=np.zeros(4, np.int64),
    )
    unpermute = dict(
        grad_hidden=np.zeros((4, 8), np.uint8),
        grad_probs=np.zeros((4, 2), f4),
        rows=np.zeros((6, 8), np.uint8),
        rowmap=ROWMAP,
        routemap=ROUTEMAP,
        probs=np.zeros(6, f4),
        out_rows=np.zeros((6, 8), np.uint8),
        out_probs=np.zeros(6, f4),
        status=np.zeros(7, np.int64),
        data_type=0,
        weighted=True,
        num_rows=6,
    )
    return permute, unpermute


KERNEL_ERRORS = [
    ("permute", dict(routemap=ROUTEMAP[:3]), "routemap must have as many rows as rowmap"),
    ("permute", dict(status=np.zeros(3, np.int64)), "status is too short"),
    ("permute", dict(out_probs=np.zeros((4, 1), np.float32)), r"out_probs must be \[T, K\]"),
    ("unpermute", dict(data_type=-1), "data_type must be"),
    ("unpermute", dict(routemap=ROUTEMAP[:3]), "routemap must have as many rows as rowmap"),
    ("unpermute", dict(status=np.zeros(4, np.int64)), "status is too short"),
    ("unpermute", dict(out_rows=None), "grad_hidden and out_rows go together"),
    ("unpermute", dict(grad_hidden=np.zeros((3, 8), np.uint8)), "grad_hidden must be"),
    ("unpermute", dict(out_rows=np.zeros((5, 8), np.uint8)), "out_rows must have num_rows"),
    ("unpermute", dict(probs=None), "probs must have num_rows entries when weighted"),
    ("unpermute", dict(rows=np.zeros((5, 8), np.uint8)), "rows must have the shape of out_rows"),
    ("unpermute", dict(out_probs=None), "grad_probs needs out_probs"),
    ("unpermute", dict(grad_probs=np.zeros((4, 3), np.float32)), r"grad_probs must be \[T, K\]"),
    ("unpermute", dict(out_probs=np.zeros(5, np.float32)), "out_probs must have num_rows"),
]


@pytest.mark.parametrize("op, changes, message", KERNEL_ERRORS)
def test_kernel_checks(op, changes, message):
    permute, unpermute = kernel_args()
    args = permute if op == "permute" else unpermute
    args.update(changes)
    kernel = _backward.permute_backward_probs if op == "permute" else _backward.unpermute_backward
    positional = [args.pop(k) for k in list(args)[: -3 if op == "unpermute" else None]]
    with pytest.raises(ValueError, match=message):
        kernel(*positional, **args)
