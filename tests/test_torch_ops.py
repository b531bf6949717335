"""moe_permute / moe_unpermute on torch tensors: the same bits as on NumPy arrays, the same
errors, CPU tensors through views (no copies), outputs of the caller's kind."""

import tracemalloc

import ml_dtypes
import numpy as np
import pytest

from _torch_cases import (
    DEVICES,
    assert_same_bits,
    custom_ops,
    routing,
    to_numpy,
    to_torch,
    torch,
    torch_ops,
)
from moe_numba import moe_permute, moe_unpermute
from test_errors import PERMUTE_ERRORS, UNPERMUTE_ERRORS, permute_defaults, unpermute_defaults

# value errors come from the run itself (status words); every other case is metadata
VALUE_CASES = {
    "bad expert id",
    "negative expert id",
    "repeated expert",
    "count mismatch",
    "override too small",
    "row out of range",
    "row below -1",
}


def _numpy_and_torch(case, device):
    numpy_args = dict(case, scale=None)
    torch_args = {k: to_torch(v, device) for k, v in numpy_args.items()}
    return numpy_args, torch_args


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "dtype",
    [ml_dtypes.bfloat16, np.float16, np.float32, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2],
)
@pytest.mark.parametrize("override", [False, True])
@pytest.mark.parametrize("do_gather", [True, False])
def test_permute_is_the_numpy_result(device, dtype, override, do_gather):
    case = routing(1, dtype=np.float32, num_tokens=9)
    case["hidden_states"] = case["hidden_states"].astype(dtype)
    numpy_args, torch_args = _numpy_and_torch(case, device)
    if np.dtype(dtype).itemsize == 1 or dtype is np.float32:  # a scale: float32 rows of it
        scale = np.arange(18, dtype=np.float32).reshape(9, 2)
        numpy_args["scale"], torch_args["scale"] = scale, to_torch(scale, device)
    flags = dict(
        do_gather=do_gather,
        return_expert_indices=True,
        override_buffer_size=40 if override else -1,
    )
    expected = moe_permute(**numpy_args, **flags)
    actual = moe_permute(**torch_args, **flags)
    assert len(actual) == 5
    for a, e in zip(actual, expected, strict=True):
        assert isinstance(a, torch.Tensor) and a.device.type == device
        assert_same_bits(a, e)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, np.float32])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("mix_precision", [True, False])
@pytest.mark.parametrize("prob_column", [False, True])
def test_unpermute_is_the_numpy_result(device, dtype, weighted, mix_precision, prob_column):
    case = routing(2, dtype=dtype, num_tokens=8)
    rows, rowmap, row_probs, _ = moe_permute(**dict(case, scale=None))
    if prob_column:
        row_probs = row_probs.reshape(-1, 1)
    numpy_args = (rows, rowmap, case["expert_routemap_topk"], row_probs, 8, case["num_experts"])
    flags = dict(using_mix_precision=mix_precision, using_weighted_combine=weighted)
    expected = moe_unpermute(*numpy_args, **flags)
    actual = moe_unpermute(*(to_torch(a, device) for a in numpy_args), **flags)
    for a, e in zip(actual, expected, strict=True):
        assert isinstance(a, torch.Tensor) and a.device.type == device
        assert_same_bits(a, e)


def test_three_outputs_without_expert_indices_and_name_is_ignored():
    _, args = _numpy_and_torch(routing(3), "cpu")
    assert len(moe_permute(**args, name="ignored")) == 4
    rows, rowmap, probs, _ = moe_permute(**args)
    out = moe_unpermute(rows, rowmap, args["expert_routemap_topk"], probs, 7, 4, name="x")
    assert len(out) == 2


@pytest.mark.parametrize(
    "kind", [tuple, np.array, torch.tensor], ids=["tuple", "numpy", "cpu tensor"]
)
def test_tokens_per_expert_of_any_host_kind(kind):
    _, args = _numpy_and_torch(routing(4), "cpu")
    expected = moe_permute(**args)
    args["tokens_per_expert"] = kind(args["tokens_per_expert"])
    for a, e in zip(moe_permute(**args), expected, strict=True):
        assert_same_bits(a, e)


# ops that copy a tensor (``aten::to`` copies through ``aten::_to_copy`` only)
COPIES = {"aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy"}


def _python_bytes(fn):
    """The most bytes that Python's allocators (NumPy's arrays among them) held at once
    during ``fn()``, beyond what they held before (torch allocates outside them)."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_cpu_tensors_cross_as_views_and_outputs_come_from_torch():
    """The Cython backend reads the tensors' own memory and writes into tensors that torch
    allocates: no call copies a tensor (torch's profiler sees no copy op), NumPy holds far
    less memory meanwhile than the rows take (their copies would be there), and the outputs
    are allocated with torch (``aten::empty``)."""
    case = routing(5, num_tokens=256, hidden=2048, dtype=ml_dtypes.bfloat16)
    _, args = _numpy_and_torch(case, "cpu")
    rows_bytes = args["hidden_states"].nbytes  # (1 MiB: the permute's outputs take more)

    def permute():
        return moe_permute(**args, return_expert_indices=True)

    def unpermute(rows, rowmap, probs):
        return moe_unpermute(rows, rowmap, args["expert_routemap_topk"], probs, 256, 4)

    outputs = permute()  # (what the calls remember of a shape is made in its first call)
    unpermute(*outputs[:3])
    with torch_ops() as ops:
        outputs = permute()
        combined = unpermute(*outputs[:3])
    assert not COPIES & set(ops), sorted(COPIES & set(ops))
    assert ops.count("aten::empty") >= len(outputs) + len(combined)
    assert _python_bytes(permute) < rows_bytes / 16
    assert _python_bytes(lambda: unpermute(*outputs[:3])) < rows_bytes / 16


def _as_tensors(args, device):
    return {k: to_torch(v, device) for k, v in args.items()}


ERROR_CASES = [
    pytest.param(moe_permute, permute_defaults, *case, id=f"permute {case[0]}")
    for case in PERMUTE_ERRORS
] + [
    pytest.param(moe_unpermute, unpermute_defaults, *case, id=f"unpermute {case[0]}")
    for case in UNPERMUTE_ERRORS
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("function, defaults, name, change, error, message", ERROR_CASES)
def test_errors_as_for_numpy(device, function, defaults, name, change, error, message):
    """Every case of test_errors, on tensors: the same exception and message; a metadata
    error comes before any work (no custom op runs, nothing is allocated)."""
    args = defaults()
    change(args)
    args = _as_tensors(args, device)
    if name in VALUE_CASES:
        with pytest.raises(error, match=message):
            function(**args)
    else:
        _refused_before_any_work(lambda: function(**args), error, message)


def test_error_cases_are_named_as_in_the_tables():
    """VALUE_CASES names cases of the shared tables (a renamed case must not turn a value
    check into an unchecked metadata one)."""
    names = {case[0] for case in PERMUTE_ERRORS + UNPERMUTE_ERRORS}
    assert VALUE_CASES <= names


def _refused_before_any_work(call, error, message):
    """``call()`` raises ``error`` matching ``message`` before any work: no custom op runs,
    nothing is allocated."""
    with torch_ops() as ops, pytest.raises(error, match=message):
        call()
    assert custom_ops(ops) == [] and "aten::empty" not in ops


def test_numpy_arrays_among_torch_tensors_are_refused():
    args = _as_tensors(permute_defaults(), "cpu")
    args["expert_prob_topk"] = args["expert_prob_topk"].numpy()
    _refused_before_any_work(
        lambda: moe_permute(**args),
        TypeError,
        r"hidden_states is a torch.Tensor but expert_prob_topk is a numpy.ndarray: pass "
        r"every array as a torch tensor \(on one device\), or none",
    )
    args = _as_tensors(unpermute_defaults(), "cpu")
    args["hidden_states_unzipped"] = to_numpy(args["hidden_states_unzipped"])
    _refused_before_any_work(
        lambda: moe_unpermute(**args),
        TypeError,
        "zipped_expertwise_rowmap is a torch.Tensor but hidden_states_unzipped is a numpy.ndarray",
    )


@pytest.mark.parametrize("device", [DEVICES[1]])
def test_cpu_and_cuda_tensors_mixed_are_refused(device):
    args = _as_tensors(permute_defaults(), device)
    args["expert_prob_topk"] = args["expert_prob_topk"].cpu()
    _refused_before_any_work(
        lambda: moe_permute(**args),
        TypeError,
        r"expert_prob_topk is a torch.Tensor \(host array\) but hidden_states is a "
        r"torch.Tensor \(CUDA array\)",
    )


def test_compiled_op_names():
    """The ops are registered under the moe_numba namespace with fixed schemas."""
    for name in ("permute", "unpermute", "permute_backward", "unpermute_backward", "sort_chunks"):
        assert getattr(torch.ops.moe_numba, name).default.name() == f"moe_numba::{name}"


@pytest.mark.parametrize("dtype", ["complex64", "uint32"])
def test_a_torch_dtype_outside_the_contract_is_named(dtype):
    """The TypeError names the tensor's dtype as NumPy spells it (not None)."""
    case = routing(3)
    x = torch.zeros(case["hidden_states"].shape, dtype=getattr(torch, dtype))
    routes = to_torch(case["expert_routemap_topk"], "cpu")
    probs = to_torch(case["expert_prob_topk"], "cpu")
    flags = case["num_experts"], case["tokens_per_expert"], case["padding_alignment"]
    with pytest.raises(TypeError, match=f"hidden_states must have dtype .*; got {dtype}$"):
        moe_permute(x, None, routes, probs, *flags)
