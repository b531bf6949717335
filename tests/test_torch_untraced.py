"""Calls that nothing traces skip the custom ops' dispatcher.

The public functions run the custom op's own implementation directly in that case, through a
``torch.autograd.Function`` when a differentiable input requires a gradient; under
``torch.compile`` they go through the op. Every way gives the same bits, gradients included.
"""

from __future__ import annotations

import pytest

import moe_numba.torch  # noqa: F401  (registers the custom ops)
from _torch_cases import (  # noqa: F401
    DEVICES,
    assert_same_bits,
    custom_ops,
    routing,
    to_torch,
    torch,
    torch_ops,
)
from moe_numba import moe_permute, moe_unpermute


def _tensors(seed, device):
    """A routing case: its other fields, and its rows, routing map and probabilities as
    tensors on ``device``."""
    case = routing(seed)
    names = ("hidden_states", "expert_routemap_topk", "expert_prob_topk")
    return (case, *(to_torch(case.pop(name), device) for name in names))


@pytest.mark.parametrize("device", DEVICES)
def test_untraced_calls_skip_the_custom_op(device):
    """Plain calls, calls that autograd records and calls under ``no_grad`` run no custom op
    (torch's profiler sees every op its dispatcher runs)."""
    case, x, routes, probs = _tensors(3, device)
    counts, num_experts = case["tokens_per_expert"], case["num_experts"]
    alignment = case["padding_alignment"]

    def forward(rows):
        permuted = moe_permute(rows, None, routes, probs, num_experts, counts, alignment)
        combined, _ = moe_unpermute(
            permuted[0], permuted[1], routes, permuted[2], x.shape[0], num_experts
        )
        return permuted, combined

    with torch_ops() as ops:
        plain, y_plain = forward(x)
    assert custom_ops(ops) == []
    assert plain[0].grad_fn is None

    xg = x.clone().requires_grad_(True)
    with torch_ops() as ops:
        recorded, y_recorded = forward(xg)
    assert custom_ops(ops) == []
    assert type(recorded[0].grad_fn).__name__ == "DirectPermuteBackward"
    assert type(y_recorded.grad_fn).__name__ == "DirectUnpermuteBackward"
    for a, b in zip(plain, recorded, strict=True):
        assert_same_bits(b.detach(), a)
    assert_same_bits(y_recorded.detach(), y_plain)

    with torch.no_grad(), torch_ops() as ops:
        forward(xg)
    assert custom_ops(ops) == []


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_untraced_gradients_equal_the_custom_ops(device, weighted):
    """The same step through the custom ops (as torch.compile runs them) and without them:
    the outputs and the gradients of the rows and the probabilities are the same bits."""
    case, x, routes, probs = _tensors(3, device)
    counts, num_experts = case["tokens_per_expert"], case["num_experts"]
    scalars = (num_experts, case["padding_alignment"], True, False, False, -1, True, False, counts)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(5)).to(x.dtype).to(device)

    def step(through_op):
        xg = x.clone().requires_grad_(True)
        pg = probs.clone().requires_grad_(True)
        if through_op:
            ops = torch.ops.moe_numba  # (registered by moe_numba.torch)
            rows, rowmap, row_probs, _, _, _ = ops.permute(xg, None, routes, pg, *scalars)
            flags = (x.shape[0], num_experts, True, weighted, True)
            y, _ = ops.unpermute(rows, rowmap, routes, row_probs, *flags)
        else:
            rows, rowmap, row_probs, _ = moe_permute(
                xg, None, routes, pg, num_experts, counts, case["padding_alignment"]
            )
            y, _ = moe_unpermute(
                rows,
                rowmap,
                routes,
                row_probs,
                x.shape[0],
                num_experts,
                using_weighted_combine=weighted,
            )
        (y * dy).float().sum().backward()
        return y.detach(), xg.grad, pg.grad

    for a, b in zip(step(True), step(False), strict=True):
        assert_same_bits(b, a)


@pytest.mark.parametrize("device", DEVICES)
def test_tensor_subclasses_go_through_the_custom_op(device):
    """A tensor subclass (a Parameter) may carry its own dispatch: such calls run the op."""
    case, x, routes, probs = _tensors(4, device)
    counts, num_experts = case["tokens_per_expert"], case["num_experts"]
    alignment = case["padding_alignment"]
    with torch_ops() as ops:
        plain = moe_permute(x, None, routes, probs, num_experts, counts, alignment)
    assert custom_ops(ops) == []
    parameter = torch.nn.Parameter(x.clone(), requires_grad=False)
    with torch_ops() as ops:
        through_op = moe_permute(parameter, None, routes, probs, num_experts, counts, alignment)
    assert custom_ops(ops) == ["moe_numba::permute"]
    for a, b in zip(plain, through_op, strict=True):
        assert_same_bits(b, a)


@pytest.mark.parametrize("device", DEVICES)
def test_routes_counts_the_route_of_each_call(device):
    """``moe_numba.torch.routes`` counts each call on the route it took: direct calls, and
    the custom op where a tensor subclass carries its own dispatch; reset starts from 0."""
    from moe_numba.torch import routes

    case, x, routes_map, probs = _tensors(4, device)
    args = (routes_map, probs, case["num_experts"], case["tokens_per_expert"])
    routes.reset()
    moe_permute(x, None, *args, case["padding_alignment"])
    moe_permute(torch.nn.Parameter(x.clone(), requires_grad=False), None, *args, 2)
    assert routes["permute", "direct"] == 1 and routes["permute", "custom op"] == 1
    assert routes["unpermute", "direct"] == 0
    routes.reset()
    assert routes["permute", "direct"] == 0
    with pytest.raises(KeyError, match="route must be one of replay, direct, custom op"):
        routes["permute", "traced"]
