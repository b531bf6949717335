"""Forward and backward captured in one CUDA graph and replayed with new inputs (docs/training.rst:
``override_buffer_size`` with ``validate=False`` needs no host traffic)."""

import ml_dtypes
import numpy as np
import pytest

from _torch_cases import CUDA, assert_same_bits, routing, rows_needed, to_torch, torch
from moe_numba import moe_permute, moe_unpermute

NUM_TOKENS, HIDDEN, TOPK, NUM_EXPERTS, ALIGNMENT = 64, 96, 4, 8, 16


def _step(x, p, routemap, grad_out, grad_slots, num_rows, weighted):
    rows, rowmap, row_probs, _ = moe_permute(
        x,
        None,
        routemap,
        p,
        NUM_EXPERTS,
        None,
        ALIGNMENT,
        override_buffer_size=num_rows,
        validate=False,
    )
    expert = rows * 1.5 if weighted else rows * row_probs[:, None].to(rows.dtype)
    out, slot_probs = moe_unpermute(
        expert,
        rowmap,
        routemap,
        row_probs,
        NUM_TOKENS,
        NUM_EXPERTS,
        using_weighted_combine=weighted,
        validate=False,
    )
    grad_x, grad_p = torch.autograd.grad((out, slot_probs), (x, p), (grad_out, grad_slots))
    return out, slot_probs, grad_x, grad_p


def _inputs(seed, device):
    case = routing(
        seed,
        dtype=ml_dtypes.bfloat16,
        num_tokens=NUM_TOKENS,
        topk=TOPK,
        num_experts=NUM_EXPERTS,
        alignment=ALIGNMENT,
        hidden=HIDDEN,
    )
    rng = np.random.default_rng(seed + 100)
    grads = (
        rng.standard_normal((NUM_TOKENS, HIDDEN)).astype(ml_dtypes.bfloat16),
        rng.random((NUM_TOKENS, TOPK), dtype=np.float32),
    )
    names = ("hidden_states", "expert_prob_topk", "expert_routemap_topk")
    return [to_torch(case[n], device) for n in names] + [to_torch(g, device) for g in grads], case


@pytest.mark.parametrize("device", [CUDA])
@pytest.mark.parametrize("weighted", [False, True])
def test_forward_and_backward_replay_in_one_cuda_graph(device, weighted):
    static, case = _inputs(0, device)
    # rows for the largest routing replayed below, plus slack: rows past the needed ones are
    # padding
    num_rows = max(rows_needed(_inputs(seed, "cpu")[1]) for seed in range(4)) + ALIGNMENT
    # the warm-up has leaves of its own: a leaf's gradient accumulator keeps the stream it was
    # made on, and one made on the warm-up's stream would not match the capture's
    warm = [t.clone() for t in static]
    for leaves in (static, warm):
        leaves[0].requires_grad_()
        leaves[1].requires_grad_()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: kernels compiled, allocator pools filled
        for _ in range(3):
            _step(*warm, num_rows, weighted)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _step(*static, num_rows, weighted)

    for seed in (1, 2, 3):
        fresh, _ = _inputs(seed, device)
        with torch.no_grad():
            for target, source in zip(static, fresh, strict=True):
                target.copy_(source)
        graph.replay()
        fresh[0].requires_grad_()
        fresh[1].requires_grad_()
        eager = _step(*fresh, num_rows, weighted)
        torch.cuda.synchronize()
        for replayed, expected in zip(captured, eager, strict=True):
            assert_same_bits(replayed, expected)
