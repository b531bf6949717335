"""Autograd through moe_permute / moe_unpermute on torch tensors.

- the gradients are the docs/gradients.rst backward ops called directly, bit for bit;
- on float32 data they equal finite differences of a reference made of plain torch ops;
- only what the backward needs is saved;
- float8 rows, the row map, the scale and the expert indices carry no gradient.
"""

import ml_dtypes
import numpy as np
import pytest

from _torch_cases import (
    DEVICES,
    assert_same_bits,
    routing,
    rows_needed,
    to_numpy,
    to_torch,
    torch,
)
from moe_numba import moe_permute, moe_permute_backward, moe_unpermute, moe_unpermute_backward

DTYPES = [ml_dtypes.bfloat16, np.float16, np.float32]


def _inputs(device, dtype=np.float32, seed=21, num_tokens=10, override=False, **routing_args):
    case = routing(seed, dtype=dtype, num_tokens=num_tokens, **routing_args)
    x = to_torch(case["hidden_states"], device).requires_grad_()
    p = to_torch(case["expert_prob_topk"], device).requires_grad_()
    routemap = to_torch(case["expert_routemap_topk"], device)
    extra = dict(override_buffer_size=rows_needed(case) + 3) if override else {}
    rest = (case["num_experts"], case["tokens_per_expert"], case["padding_alignment"])
    return x, p, routemap, rest, extra


def _direct(function, tensors, **keywords):
    """A gradient op called directly: NumPy copies for CPU tensors, CUDA tensors as they are."""
    if tensors[-1].device.type == "cpu":
        tensors = [None if t is None else to_numpy(t) for t in tensors]
    return function(*tensors, **keywords)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("override", [False, True])
def test_permute_gradients_are_the_backward_op(device, dtype, override):
    x, p, routemap, rest, extra = _inputs(device, dtype, override=override)
    rows, rowmap, row_probs, _ = moe_permute(x, None, routemap, p, *rest, **extra)
    grad_rows = torch.randn(rows.shape, device=device).to(rows.dtype)
    grad_probs = torch.rand(row_probs.shape, device=device)
    grad_x, grad_p = torch.autograd.grad((rows, row_probs), (x, p), (grad_rows, grad_probs))
    expected = _direct(
        moe_permute_backward, (grad_rows, grad_probs, rowmap, routemap), validate=True
    )
    assert_same_bits(grad_x, expected[0])
    assert_same_bits(grad_p, expected[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("mix_precision", [True, False])
@pytest.mark.parametrize("prob_column", [False, True])
def test_unpermute_gradients_are_the_backward_op(
    device, dtype, weighted, mix_precision, prob_column
):
    x, p, routemap, rest, _ = _inputs(device, dtype)
    rows, rowmap, row_probs, _ = moe_permute(x.detach(), None, routemap, p.detach(), *rest)
    rows.requires_grad_()
    row_probs = (row_probs.reshape(-1, 1) if prob_column else row_probs).requires_grad_()
    out, slot_probs = moe_unpermute(
        rows,
        rowmap,
        routemap,
        row_probs,
        x.shape[0],
        rest[0],
        using_mix_precision=mix_precision,
        using_weighted_combine=weighted,
    )
    grad_out = torch.randn(out.shape, device=device).to(out.dtype)
    grad_slots = torch.rand(slot_probs.shape, device=device)
    grad_rows, grad_row_probs = torch.autograd.grad(
        (out, slot_probs), (rows, row_probs), (grad_out, grad_slots)
    )
    expected = _direct(
        moe_unpermute_backward,
        (grad_out, grad_slots, rows, rowmap, routemap, row_probs.reshape(-1)),
        using_weighted_combine=weighted,
        num_rows=rows.shape[0],
        validate=True,
    )
    assert_same_bits(grad_rows, expected[0])
    assert_same_bits(grad_row_probs, expected[1].reshape(row_probs.shape))


# ---------------------------------------------------------------------------------------------
# float32: finite differences of a reference made of plain torch ops


def _pairs(rowmap, routemap):
    """Token, expert, row and counted slot of every mapped (token, expert) pair."""
    tokens, experts = (rowmap >= 0).nonzero(as_tuple=True)
    slots = (routemap.long()[tokens] == experts[:, None]).int().argmax(dim=1)
    return tokens, experts, rowmap[tokens, experts].long(), slots


def permute_reference(x, p, rowmap, routemap, num_rows):
    """Rows and row probabilities of ``rowmap`` by index_select / index_copy."""
    tokens, _, rows, slots = _pairs(rowmap, routemap)
    hidden = x.new_zeros((num_rows, x.shape[1])).index_copy(0, rows, x.index_select(0, tokens))
    probs = p.new_zeros(num_rows).index_copy(0, rows, p[tokens, slots])
    return hidden, probs


def unpermute_reference(hidden, rowmap, routemap, probs, weighted):
    """Combined rows by index_add, slot probabilities by gather."""
    tokens, _, rows, _ = _pairs(rowmap, routemap)
    contributions = hidden[rows] * probs[rows, None] if weighted else hidden[rows]
    out = hidden.new_zeros((rowmap.shape[0], hidden.shape[1])).index_add(0, tokens, contributions)
    ids = routemap.long()
    slot_rows = rowmap.long().gather(1, ids.clamp(min=0))
    mapped = (ids >= 0) & (slot_rows >= 0)
    return out, torch.where(mapped, probs[slot_rows.clamp(min=0)], 0.0)


def _finite_differences(loss, tensors, eps=1e-2):
    """Central differences of ``loss()`` in every element of every tensor (float32)."""
    grads = []
    with torch.no_grad():
        for t in tensors:
            grad = torch.zeros_like(t)
            flat, flat_grad = t.view(-1), grad.view(-1)
            for i in range(flat.numel()):
                kept = flat[i].clone()
                flat[i] = kept + eps
                up = loss()
                flat[i] = kept - eps
                down = loss()
                flat[i] = kept
                flat_grad[i] = (up - down) / (2 * eps)
            grads.append(grad)
    return grads


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("inside_expert", [False, True])
def test_float32_layer_gradients_equal_finite_differences(device, weighted, inside_expert):
    """permute -> expert (x 1.5, times the row probability when ``inside_expert``) ->
    unpermute; the loss weighs both outputs of the unpermute and of the permute."""
    x, p, routemap, rest, _ = _inputs(device, num_tokens=6, hidden=3, num_experts=4)
    generator = torch.Generator().manual_seed(5)
    weights = [torch.randn(s, generator=generator).to(device) for s in ((6, 3), (6, 3))]

    def layer(permute, unpermute):
        rows, rowmap, row_probs = permute()
        expert = rows * 1.5
        if inside_expert:
            expert = expert * row_probs[:, None]
        out, slot_probs = unpermute(expert, rowmap, row_probs)
        return (out * weights[0]).sum() + (slot_probs * weights[1]).sum()

    def ours():
        rows, rowmap, row_probs, _ = moe_permute(x, None, routemap, p, *rest)
        return rows, rowmap, row_probs

    def our_unpermute(expert, rowmap, row_probs):
        return moe_unpermute(
            expert, rowmap, routemap, row_probs, 6, rest[0], using_weighted_combine=weighted
        )

    rowmap = moe_permute(x.detach(), None, routemap, p.detach(), *rest)[1]
    num_rows = sum(-(-n // rest[2]) * rest[2] for n in rest[1])

    def reference():
        rows, row_probs = permute_reference(x, p, rowmap, routemap, num_rows)
        return rows, rowmap, row_probs

    def reference_unpermute(expert, rowmap, row_probs):
        return unpermute_reference(expert, rowmap, routemap, row_probs, weighted)

    grads = torch.autograd.grad(layer(ours, our_unpermute), (x, p))
    reference_grads = torch.autograd.grad(layer(reference, reference_unpermute), (x, p))
    numeric = _finite_differences(lambda: layer(reference, reference_unpermute), (x, p))
    for ours_grad, reference_grad, numeric_grad in zip(
        grads, reference_grads, numeric, strict=True
    ):
        torch.testing.assert_close(ours_grad, reference_grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(ours_grad, numeric_grad, rtol=1e-3, atol=2e-3)


# ---------------------------------------------------------------------------------------------
# what is saved, what has no gradient


def _saved(run):
    """Shapes and dtypes of every tensor autograd saves while ``run()`` builds its graph."""
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return saved


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows_grad", [False, True])
@pytest.mark.parametrize("probs_grad", [False, True])
def test_permute_saves_the_maps_only(device, rows_grad, probs_grad):
    x, p, routemap, rest, _ = _inputs(device, ml_dtypes.bfloat16)
    x.requires_grad_(rows_grad)
    p.requires_grad_(probs_grad)
    saved = _saved(lambda: moe_permute(x, None, routemap, p, *rest))
    if rows_grad or probs_grad:
        assert saved == [((10, 4), torch.int32), ((10, 3), torch.int32)]  # rowmap, routemap
    else:
        assert saved == []


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("rows_grad", [False, True])
@pytest.mark.parametrize("probs_grad", [False, True])
def test_unpermute_saves_rows_only_for_a_weighted_probability_gradient(
    device, weighted, rows_grad, probs_grad
):
    x, p, routemap, rest, _ = _inputs(device, ml_dtypes.bfloat16)
    rows, rowmap, row_probs, _ = moe_permute(x.detach(), None, routemap, p.detach(), *rest)
    rows.requires_grad_(rows_grad)
    row_probs.requires_grad_(probs_grad)
    saved = _saved(
        lambda: moe_unpermute(
            rows, rowmap, routemap, row_probs, 10, 4, using_weighted_combine=weighted
        )
    )
    num_rows = rows.shape[0]
    expected = [((10, 4), torch.int32), ((10, 3), torch.int32)]  # rowmap, routemap
    if weighted:
        expected.append(((num_rows,), torch.float32))  # the row probabilities
    if weighted and probs_grad:
        expected.append(((num_rows, 5), torch.bfloat16))  # the rows, for the dot products
    assert saved == (expected if rows_grad or probs_grad else [])


@pytest.mark.parametrize("device", DEVICES)
def test_float8_rows_and_the_maps_have_no_gradient(device):
    case = routing(22, num_tokens=6)
    x = to_torch(case["hidden_states"].astype(ml_dtypes.float8_e4m3fn), device)
    x.requires_grad_()
    scale = torch.rand(6, 2, device=device, requires_grad=True)
    p = to_torch(case["expert_prob_topk"], device).requires_grad_()
    routemap = to_torch(case["expert_routemap_topk"], device)
    rows, rowmap, row_probs, scale_rows, indices = moe_permute(
        x, scale, routemap, p, 4, case["tokens_per_expert"], 2, return_expert_indices=True
    )
    assert not any(t.requires_grad for t in (rows, rowmap, scale_rows, indices))
    assert row_probs.requires_grad
    (grad_p,) = torch.autograd.grad(row_probs.sum(), p)
    expected = _direct(moe_permute_backward, (None, torch.ones_like(row_probs), rowmap, routemap))
    assert expected[0] is None
    assert_same_bits(grad_p, expected[1])


@pytest.mark.parametrize("device", DEVICES)
def test_unused_outputs_cost_no_gradient(device):
    """Only the row probabilities reach the loss: the rows' gradient is never formed and the
    hidden states get none; do_gather=False gives the same."""
    x, p, routemap, rest, _ = _inputs(device)
    for do_gather in (True, False):
        x.grad = p.grad = None
        rows, _, row_probs, _ = moe_permute(x, None, routemap, p, *rest, do_gather=do_gather)
        assert do_gather or rows.shape[0] == 0
        (row_probs * 2).sum().backward()
        assert x.grad is None
        assert p.grad is not None and p.grad.shape == p.shape
