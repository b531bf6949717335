"""``torch.library.opcheck`` on every custom op: schema, autograd registration, fake tensors and
AOT dispatch with dynamic shapes, on each device, with and without override_buffer_size,
weighted and unweighted."""

import ml_dtypes
import numpy as np
import pytest

from _torch_cases import DEVICES, bits, routing, rows_needed, to_torch, torch
from moe_numba import moe_permute

ALL_TESTS = (
    "test_schema",
    "test_autograd_registration",
    "test_faketensor",
    "test_aot_dispatch_dynamic",
)
ops = torch.ops.moe_numba


def _opcheck(op, args):
    results = torch.library.opcheck(op, args, test_utils=ALL_TESTS)
    assert set(results) == set(ALL_TESTS)
    assert all(v == "SUCCESS" for v in results.values()), results


def _permute_args(device, dtype, override, indices, scale=None):
    """The op's arguments; ``indices``: both optional outputs asked for."""
    case = routing(11, dtype=dtype, num_tokens=9)
    x = to_torch(case["hidden_states"], device).requires_grad_()
    p = to_torch(case["expert_prob_topk"], device).requires_grad_()
    routemap = to_torch(case["expert_routemap_topk"], device)
    tokens = None if override else case["tokens_per_expert"]
    rows = rows_needed(case) + 5 if override else -1
    e = case["num_experts"]
    # (the schema: the arrays, the scalars, tokens_per_expert last)
    return (x, scale, routemap, p, e, 2, True, False, indices, rows, True, indices, tokens)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("override", [False, True])
@pytest.mark.parametrize("indices", [False, True])
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32])
def test_permute(device, override, indices, dtype):
    _opcheck(ops.permute.default, _permute_args(device, dtype, override, indices))


@pytest.mark.parametrize("device", DEVICES)
def test_permute_float8_with_scale(device):
    case = routing(12, num_tokens=6)
    x = to_torch(case["hidden_states"].astype(ml_dtypes.float8_e4m3fn), device)
    scale = torch.rand(6, 2, device=device, requires_grad=True)
    p = to_torch(case["expert_prob_topk"], device).requires_grad_()
    routemap = to_torch(case["expert_routemap_topk"], device)
    counts = case["tokens_per_expert"]
    args = (x, scale, routemap, p, 4, 2, True, False, False, -1, True, True, counts)
    # test_schema compares inputs with torch.allclose and test_aot_dispatch_dynamic sums the
    # outputs, neither of which has a float8 kernel on the CPU: the schema check (inputs
    # unchanged, outputs alias no input) is made here bit for bit, and test_torch_compile
    # traces float8 rows
    others = ("test_autograd_registration", "test_faketensor")
    results = torch.library.opcheck(ops.permute.default, args, test_utils=others)
    assert results == dict.fromkeys(others, "SUCCESS"), results
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    before = [bits(t).clone() for t in tensors]
    outputs = ops.permute(*args)
    assert all(torch.equal(bits(t), b) for t, b in zip(tensors, before, strict=True))
    inputs = {t.untyped_storage().data_ptr() for t in tensors}
    assert not any(o.numel() and o.untyped_storage().data_ptr() in inputs for o in outputs)


def _unpermute_args(device, dtype, override, weighted, prob_column=False):
    case = routing(13, dtype=dtype, num_tokens=8)
    extra = dict(override_buffer_size=rows_needed(case) + 3) if override else {}
    rows, rowmap, probs, _ = moe_permute(**dict(case, scale=None), **extra)
    if prob_column:
        probs = probs.reshape(-1, 1)
    return (
        to_torch(rows, device).requires_grad_(),
        to_torch(rowmap, device),
        to_torch(case["expert_routemap_topk"], device),
        to_torch(probs, device).requires_grad_(),
        8,
        case["num_experts"],
        True,
        weighted,
        True,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("override", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32])
def test_unpermute(device, override, weighted, dtype):
    _opcheck(ops.unpermute.default, _unpermute_args(device, dtype, override, weighted))


@pytest.mark.parametrize("device", DEVICES)
def test_unpermute_column_probabilities(device):
    _opcheck(ops.unpermute.default, _unpermute_args(device, np.float32, False, True, True))


def _detached(args):
    return tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("override", [False, True])
@pytest.mark.parametrize("given", ["both", "rows", "probs"])
def test_permute_backward(device, override, given):
    x, _, routemap, p, *_ = _permute_args(device, ml_dtypes.bfloat16, override, False)
    out = ops.permute(*_permute_args(device, ml_dtypes.bfloat16, override, False))
    grad_rows = torch.randn_like(out[0]) if given != "probs" else None
    grad_probs = torch.rand_like(out[2]) if given != "rows" else None
    _opcheck(ops.permute_backward.default, (grad_rows, grad_probs, out[1], routemap, True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("override", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("given", ["both", "rows", "slots"])
def test_unpermute_backward(device, override, weighted, given):
    rows, rowmap, routemap, probs, tokens, _, _, _, _ = _detached(
        _unpermute_args(device, np.float32, override, weighted)
    )
    grad_out = torch.randn(tokens, rows.shape[1], device=device) if given != "slots" else None
    grad_slots = torch.rand(routemap.shape, device=device) if given != "rows" else None
    args = (
        grad_out,
        grad_slots,
        rows if weighted and grad_out is not None else None,
        rowmap,
        routemap,
        probs if weighted else None,
        weighted,
        rows.shape[0],
        True,
    )
    _opcheck(ops.unpermute_backward.default, args)
