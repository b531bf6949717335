"""Calls that nothing traces and autograd need not record skip the custom ops' dispatcher.

The public functions run the custom op's own implementation directly in that case; with a
differentiable input that requires a gradient, or under ``torch.compile``, they go through the
op. Both ways give the same bits.
"""

from __future__ import annotations

import pytest

from _torch_cases import DEVICES, assert_same_bits, routing, to_torch, torch  # noqa: F401
from moe_numba import moe_permute, moe_unpermute
from moe_numba.torch import _ops


class _Counting:
    """A stand-in for a custom op that counts its calls and runs the real one."""

    def __init__(self, op):
        self.op, self.calls = op, 0

    def __call__(self, *args):
        self.calls += 1
        return self.op(*args)


@pytest.mark.parametrize("device", DEVICES)
def test_untraced_calls_skip_the_custom_op(device, monkeypatch):
    case = routing(3)
    x = to_torch(case.pop("hidden_states"), device)
    routes = to_torch(case.pop("expert_routemap_topk"), device)
    probs = to_torch(case.pop("expert_prob_topk"), device)
    counts, num_experts = case["tokens_per_expert"], case["num_experts"]
    permute, unpermute = _Counting(_ops.permute), _Counting(_ops.unpermute)
    monkeypatch.setattr(_ops, "permute", permute)
    monkeypatch.setattr(_ops, "unpermute", unpermute)

    plain = moe_permute(x, None, routes, probs, num_experts, counts, case["padding_alignment"])
    y_plain, _ = moe_unpermute(plain[0], plain[1], routes, plain[2], x.shape[0], num_experts)
    assert (permute.calls, unpermute.calls) == (0, 0)

    xg = x.clone().requires_grad_(True)
    traced = moe_permute(xg, None, routes, probs, num_experts, counts, case["padding_alignment"])
    y_traced, _ = moe_unpermute(traced[0], traced[1], routes, traced[2], x.shape[0], num_experts)
    assert (permute.calls, unpermute.calls) == (1, 1)
    assert traced[0].grad_fn is not None and y_traced.grad_fn is not None
    for a, b in zip(plain, traced, strict=True):
        assert_same_bits(b.detach(), a)
    assert_same_bits(y_traced.detach(), y_plain)

    with torch.no_grad():
        moe_permute(xg, None, routes, probs, num_experts, counts, case["padding_alignment"])
    assert permute.calls == 1  # no gradient recorded: the op is skipped again
