"""``torch.compile(fullgraph=True)`` traces moe_permute / moe_unpermute forward and backward.

With ``override_buffer_size`` one graph serves every call; with a host ``tokens_per_expert``
list each count is a constant of the graph until it first changes (then dynamo traces it as a
symbolic int): the numbers of graphs below are the ones docs/training.rst quotes.
"""

import importlib

import ml_dtypes
import numpy as np
import pytest

from _torch_cases import DEVICES, assert_same_bits, routing, to_torch, torch  # skips without torch
from moe_numba import moe_permute, moe_unpermute


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """dynamo remembers the sizes that a function saw under earlier ``torch.compile`` calls
    (automatic dynamic shapes), so the graph counts below hold from a fresh state only."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# (imported only once _torch_cases has found torch)
_dynamo_testing = importlib.import_module("torch._dynamo.testing")
CompileCounterWithBackend = _dynamo_testing.CompileCounterWithBackend

NUM_EXPERTS, ALIGNMENT = 4, 2


def layer(x, p, routemap, tokens_per_expert, override_buffer_size, validate=False):
    """permute -> expert (x 1.5) -> weighted unpermute.

    (Its ops outside moe-numba have no reductions, so compiled and eager agree bit for bit.)
    """
    rows, rowmap, row_probs, _ = moe_permute(
        x,
        None,
        routemap,
        p,
        NUM_EXPERTS,
        tokens_per_expert,
        ALIGNMENT,
        override_buffer_size=override_buffer_size,
        validate=validate,
    )
    out, slot_probs = moe_unpermute(
        rows * 1.5,
        rowmap,
        routemap,
        row_probs,
        x.shape[0],
        NUM_EXPERTS,
        using_weighted_combine=True,
        validate=validate,
    )
    return out, slot_probs


def _step(function, case, device, *args, **kwargs):
    """Outputs and gradients of ``function`` on fresh leaves made from ``case``."""
    x = to_torch(case["hidden_states"], device).requires_grad_()
    p = to_torch(case["expert_prob_topk"], device).requires_grad_()
    routemap = to_torch(case["expert_routemap_topk"], device)
    out, slot_probs = function(x, p, routemap, *args, **kwargs)
    (out.float().sum() + (slot_probs * slot_probs).sum()).backward()
    return out, slot_probs, x.grad, p.grad


def _assert_step_equal(compiled, eager):
    for a, e in zip(compiled, eager, strict=True):
        assert_same_bits(a, e)


def _cases(count, num_tokens=9):
    return [routing(30 + i, dtype=np.float32, num_tokens=num_tokens) for i in range(count)]


@pytest.mark.parametrize("device", DEVICES)
def test_override_buffer_size_is_one_graph_forward_and_backward(device):
    """Three batches of new routing, one trace (inductor, the default backend), and the
    compiled forward and backward equal eager bit for bit."""
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(layer, backend=counter, fullgraph=True)
    for case in _cases(3):
        _assert_step_equal(
            _step(compiled, case, device, None, 40), _step(layer, case, device, None, 40)
        )
    assert counter.frame_count == 1


def _graphs_for(lists, device, dynamic=None):
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(layer, backend=counter, fullgraph=True, dynamic=dynamic)
    case = _cases(1)[0]
    graphs = []
    for tokens in lists:  # validate=False: the lists are capacities
        _assert_step_equal(
            _step(compiled, case, device, tokens, -1), _step(layer, case, device, tokens, -1)
        )
        graphs.append(counter.frame_count)
    return graphs


@pytest.mark.parametrize("device", DEVICES)
def test_changing_tokens_per_expert_costs_one_recompile_per_first_change(device):
    # every count changes between the first two lists: the second trace makes them all
    # symbolic, and it serves every later list
    assert _graphs_for([[4, 3, 3, 2], [5, 4, 2, 3], [3, 5, 4, 1]], device) == [1, 2, 2]
    torch._dynamo.reset()
    # counts that change one at a time: one more trace for each count's first change
    assert _graphs_for([[4, 3, 3, 2], [5, 3, 3, 2], [5, 4, 3, 2], [5, 4, 1, 0]], device) == [
        1,
        2,
        3,
        4,
    ]
    torch._dynamo.reset()
    # dynamic=True traces every count as symbolic from the start
    assert _graphs_for([[4, 3, 3, 2], [5, 3, 3, 2], [5, 4, 1, 0]], device, dynamic=True) == [
        1,
        1,
        1,
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_a_changing_batch_size_is_traced_symbolically(device):
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(layer, backend=counter, fullgraph=True)
    for num_tokens in (9, 12, 7):
        (case,) = _cases(1, num_tokens)
        _assert_step_equal(
            _step(compiled, case, device, None, 64), _step(layer, case, device, None, 64)
        )
    assert counter.frame_count == 2  # the second size makes the token count symbolic


@pytest.mark.parametrize("device", DEVICES)
def test_float8_rows_trace(device):
    """float8 rows with their scale, traced with symbolic shapes: the probabilities'
    gradient flows, the rows have none."""

    def permute(x, scale, p, routemap):
        rows, _, row_probs, scale_rows = moe_permute(
            x, scale, routemap, p, NUM_EXPERTS, None, ALIGNMENT, override_buffer_size=32
        )
        return rows, row_probs, scale_rows

    case = _cases(1)[0]
    x = to_torch(case["hidden_states"].astype(ml_dtypes.float8_e5m2), device)
    scale = torch.rand(9, 2, device=device)
    routemap = to_torch(case["expert_routemap_topk"], device)
    results = []
    for function in (torch.compile(permute, backend="aot_eager", dynamic=True), permute):
        p = to_torch(case["expert_prob_topk"], device).requires_grad_()
        rows, row_probs, scale_rows = function(x, scale, p, routemap)
        assert not rows.requires_grad
        (row_probs * row_probs).sum().backward()
        results.append((rows, row_probs, scale_rows, p.grad))
    _assert_step_equal(*results)


def test_a_bad_call_fails_while_tracing():
    """The fake kernels run the contract's checks: the message is the eager one."""
    case = _cases(1)[0]
    x = to_torch(case["hidden_states"], "cpu")
    p = to_torch(case["expert_prob_topk"], "cpu")
    routemap = to_torch(case["expert_routemap_topk"], "cpu")

    def permute(x, p, routemap):
        probs = p[:, :2].contiguous()
        return moe_permute(x, None, routemap, probs, NUM_EXPERTS, None, 1, override_buffer_size=8)

    message = r"expert_prob_topk must have shape \[num_tokens, topk\] = \(9, 3\); got \(9, 2\)"
    compiled = torch.compile(permute, backend="aot_eager", fullgraph=True)
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError, match=message):
        compiled(x, p, routemap)
    with pytest.raises(ValueError, match=message):
        permute(x, p, routemap)


@pytest.mark.parametrize("device", DEVICES)
def test_validate_raises_in_a_compiled_graph(device):
    """validate=True still checks the values when the compiled graph runs."""
    case = _cases(1)[0]
    wrong = [n + 1 for n in case["tokens_per_expert"]]
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    with pytest.raises(ValueError, match=r"tokens_per_expert\[0\] = .* but the routing map"):
        _step(compiled, case, device, wrong, -1, validate=True)
