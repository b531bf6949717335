"""The expert-parallel layer's local checks, in one process (tests/test_expert_parallel.py
checks that every rank raises them together): each names the argument, what was expected and
what was given."""

import pytest

torch = pytest.importorskip("torch", reason="the expert-parallel layer needs torch")
pytest.importorskip("torch.distributed", reason="needs torch.distributed")

from moe_numba.torch.distributed import _check_inputs, single_process_moe  # noqa: E402


def _call(**changes):
    call = dict(
        x=torch.ones(3, 4, dtype=torch.bfloat16),
        routemap=torch.tensor([[0, 1], [1, -1], [1, 0]]),
        probs=torch.ones(3, 2),
        expert_fn=lambda rows, counts, probs: rows,
    )
    call.update(changes)
    return call


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        (dict(x=[[1.0]]), TypeError, "x must be a torch.Tensor; got list"),
        (dict(probs=None), TypeError, "probs must be a torch.Tensor; got NoneType"),
        (dict(x=torch.ones(3)), ValueError, r"x must be 2-D \[num_tokens, hidden\]; got shape"),
        (dict(x=torch.ones(3, 4, dtype=torch.float64)), TypeError, "x must have dtype .*float64"),
        (
            dict(routemap=torch.zeros(3, 2)),
            TypeError,
            "routemap must have dtype torch.int32, torch.int64; got torch.float32",
        ),
        (
            dict(routemap=torch.zeros(2, 2, dtype=torch.int32)),
            ValueError,
            r"routemap must have shape \[num_tokens, topk\] = \(3, 2\); got \(2, 2\)",
        ),
        (dict(probs=torch.ones(3, 2, dtype=torch.bfloat16)), TypeError, "probs must have dtype"),
        (
            dict(probs=torch.ones(3, 1)),
            ValueError,
            r"probs must have shape \[num_tokens, topk\] = \(3, 2\); got \(3, 1\)",
        ),
        (
            dict(probs=torch.ones(3, 2, device="meta")),
            ValueError,
            r"probs must be on x's device \(cpu\); got meta",
        ),
        (dict(expert_fn=3), TypeError, "expert_fn must be callable; got int"),
    ],
)
def test_bad_inputs(changes, error, message):
    with pytest.raises(error, match=message):
        _check_inputs(**_call(**changes))


@pytest.mark.parametrize(
    ("expert_fn", "error", "message"),
    [
        (lambda r, c, p: r.tolist(), TypeError, "expert_fn must return a torch.Tensor; got list"),
        (lambda r, c, p: r[1:], ValueError, r"expert_fn must return a \[\d+, hidden\] tensor"),
        (lambda r, c, p: r.double(), TypeError, "float32 rows; got torch.float64"),
        (lambda r, c, p: r.to_sparse(), TypeError, "dense \\(strided\\) tensor; got torch.sparse"),
        (lambda r, c, p: r.to("meta"), ValueError, "expert_fn must return rows on cpu; got meta"),
    ],
)
def test_bad_expert_outputs(expert_fn, error, message):
    call = _call(expert_fn=expert_fn)
    with pytest.raises(error, match=message):
        single_process_moe(**call, num_experts=2)


def test_a_non_contiguous_expert_output_is_accepted():
    call = _call()
    expected = single_process_moe(**call, num_experts=2)
    call["expert_fn"] = lambda rows, counts, probs: rows.t().contiguous().t()
    assert torch.equal(single_process_moe(**call, num_experts=2), expected)
