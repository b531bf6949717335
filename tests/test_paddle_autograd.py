"""Autograd on Paddle tensors (docs/paddle.rst): ``PyLayer``s whose backward is this
project's gradient ops, checked against the ops themselves, against a float64 reference of
plain Paddle ops, and in a small MoE layer against a pure-Paddle one; ``paddle.jit.to_static``.
"""

import ml_dtypes
import numpy as np
import pytest

from _cases import assert_same_bits, counts_of, random_probs, random_values
from _torch_cases import routing  # (NumPy cases; torch is in the test extra)
from moe_numba import (
    moe_permute,
    moe_permute_backward,
    moe_sort_chunks,
    moe_unpermute_backward,
)
from test_paddle import as_numpy, installed, mp, paddle, to_paddle  # noqa: F401 (a fixture)

F = paddle.nn.functional


def _case(seed, dtype=np.float32):
    """A routing case of the torch tests: 11 tokens, H = 6, K = 3, E = 4, A = 2."""
    return routing(seed, num_tokens=11, dtype=dtype, hidden=6)


def _leaf(array):
    tensor = to_paddle(array)
    tensor.stop_gradient = False
    return tensor


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, np.float32], ids=str)
def test_permute_gradients_are_the_backward_op(dtype):
    case = _case(1, dtype)
    x, probs = _leaf(case["hidden_states"]), _leaf(case["expert_prob_topk"])
    routes = to_paddle(case["expert_routemap_topk"])
    counts, experts = case["tokens_per_expert"], case["num_experts"]
    rows, rowmap, row_probs, _ = mp.moe_permute(x, None, routes, probs, experts, counts, 2)
    assert not rows.stop_gradient and not row_probs.stop_gradient and rowmap.stop_gradient
    rng = np.random.default_rng(2)
    grad_rows = random_values(rng, tuple(rows.shape), dtype, special=0.0)
    grad_probs = random_probs(rng, tuple(row_probs.shape))
    dx, dprobs = paddle.grad(
        [rows, row_probs], [x, probs], [to_paddle(grad_rows), to_paddle(grad_probs)]
    )
    expected = moe_permute_backward(
        grad_rows, grad_probs, as_numpy(rowmap), case["expert_routemap_topk"]
    )
    assert_same_bits(as_numpy(dx), expected[0])
    assert_same_bits(as_numpy(dprobs), expected[1])


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float32], ids=str)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("prob_column", [False, True], ids=["probs [R]", "probs [R, 1]"])
def test_unpermute_gradients_are_the_backward_op(dtype, weighted, prob_column):
    case = _case(3, dtype)
    _, rowmap, row_probs, _ = moe_permute(scale=None, **case)
    rng = np.random.default_rng(4)
    rows_np = random_values(rng, (row_probs.shape[0], 6), dtype, special=0.0)
    probs_np = row_probs[:, None] if prob_column else row_probs
    rows, probs = _leaf(rows_np), _leaf(probs_np)
    routes = case["expert_routemap_topk"]
    out, slots = mp.moe_unpermute(
        rows, to_paddle(rowmap), to_paddle(routes), probs, 11, 4, True, weighted
    )
    grad_out = random_values(rng, (11, 6), dtype, special=0.0)
    grad_slots = random_probs(rng, (11, 3))
    drows, dprobs = paddle.grad(
        [out, slots], [rows, probs], list(map(to_paddle, (grad_out, grad_slots)))
    )
    expected = moe_unpermute_backward(
        grad_out,
        grad_slots,
        rows_np,
        rowmap,
        routes,
        probs_np,
        using_weighted_combine=weighted,
        num_rows=rows_np.shape[0],
    )
    assert_same_bits(as_numpy(drows), expected[0])
    assert_same_bits(as_numpy(dprobs), expected[1].reshape(probs_np.shape))


def _float64_reference(x, probs, routes, weight):
    """``sum_k probs[t, k] * (x[t] @ weight)`` over the routed slots of each token, in float64
    plain Paddle ops (the permute, a matmul per row and a weighted unpermute, combined)."""
    routed = (routes >= 0).astype("float64")
    return (probs * routed).sum(axis=1, keepdim=True) * (x @ weight)


def test_gradients_of_hidden_states_and_probabilities_match_float64():
    case = _case(5)
    x, probs = _leaf(case["hidden_states"]), _leaf(case["expert_prob_topk"])
    routes = to_paddle(case["expert_routemap_topk"])
    weight = paddle.to_tensor(np.random.default_rng(6).standard_normal((6, 6)), dtype="float32")
    rows, rowmap, row_probs, _ = mp.moe_permute(
        x, None, routes, probs, 4, case["tokens_per_expert"], 2
    )
    out, _ = mp.moe_unpermute(rows @ weight, rowmap, routes, row_probs, 11, 4, True, True)
    loss = (out * out).sum()
    loss.backward()
    x64 = paddle.to_tensor(case["hidden_states"].astype(np.float64), stop_gradient=False)
    probs64 = paddle.to_tensor(case["expert_prob_topk"].astype(np.float64), stop_gradient=False)
    reference = _float64_reference(x64, probs64, routes, weight.astype("float64"))
    loss64 = (reference * reference).sum()
    loss64.backward()
    np.testing.assert_allclose(float(loss), float(loss64), rtol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), x64.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(probs.grad.numpy(), probs64.grad.numpy(), rtol=1e-4, atol=1e-5)


class _Experts(paddle.nn.Layer):
    """A top-k MoE layer: a gate, then per expert ``silu(x @ w1[e]) @ w2[e]``, combined with
    the routing probabilities. ``moe`` True: through moe_permute / moe_unpermute (the rows of
    each expert one slice of the permuted buffer); False: plain Paddle ops only."""

    def __init__(self, hidden, inner, num_experts, topk, moe):
        super().__init__()
        self.num_experts, self.topk, self.moe = num_experts, topk, moe
        self.gate = paddle.nn.Linear(hidden, num_experts, bias_attr=False)
        self.w1 = self.create_parameter([num_experts, hidden, inner])
        self.w2 = self.create_parameter([num_experts, inner, hidden])

    def _expert(self, e, rows):
        return F.silu(rows @ self.w1[e]) @ self.w2[e]

    def forward(self, x):
        probs, experts = paddle.topk(F.softmax(self.gate(x), axis=-1), self.topk)
        experts = experts.astype("int32")
        if not self.moe:
            out = paddle.zeros_like(x)
            for e in range(self.num_experts):
                weight = (probs * (experts == e).astype(probs.dtype)).sum(axis=1, keepdim=True)
                out = out + weight * self._expert(e, x)
            return out
        counts = counts_of(as_numpy(experts), self.num_experts).tolist()
        rows, rowmap, row_probs, _ = mp.moe_permute(
            x, None, experts, probs, self.num_experts, counts, 1
        )
        starts = np.cumsum([0, *counts])
        outputs = paddle.concat(
            [self._expert(e, rows[starts[e] : starts[e + 1]]) for e in range(self.num_experts)]
        )
        out, _ = mp.moe_unpermute(
            outputs, rowmap, experts, row_probs, x.shape[0], self.num_experts, True, True
        )
        return out


def test_a_moe_layer_matches_a_pure_paddle_layer():
    """Loss and every gradient (input, gate, both expert weights) of a layer built on the
    ops equal those of the same layer in plain Paddle ops."""
    paddle.seed(7)
    layers = [_Experts(8, 16, 4, 2, moe) for moe in (True, False)]
    layers[1].set_state_dict(layers[0].state_dict())
    x = paddle.to_tensor(np.random.default_rng(8).standard_normal((24, 8)), dtype="float32")
    results = []
    for layer in layers:
        inputs = x.clone()
        inputs.stop_gradient = False
        loss = (layer(inputs) ** 2).mean()
        loss.backward()
        grads = [inputs.grad] + [p.grad for p in (layer.gate.weight, layer.w1, layer.w2)]
        results.append((float(loss), [g.numpy() for g in grads]))
    (loss, grads), (ref_loss, ref_grads) = results
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for grad, ref in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(grad, ref, rtol=1e-4, atol=1e-6)


def test_only_inputs_that_require_a_gradient_get_one():
    case = _case(9, ml_dtypes.bfloat16)
    x = _leaf(case["hidden_states"])
    probs = to_paddle(case["expert_prob_topk"])  # (stop_gradient: no gradient wanted)
    routes = to_paddle(case["expert_routemap_topk"])
    rows, _, row_probs, _ = mp.moe_permute(x, None, routes, probs, 4, case["tokens_per_expert"], 2)
    rows.astype("float32").sum().backward()
    assert x.grad is not None and probs.grad is None
    with paddle.no_grad():
        rows, *_ = mp.moe_permute(x, None, routes, probs, 4, case["tokens_per_expert"], 2)
    assert rows.stop_gradient
    rows, *_ = mp.moe_permute(x, None, routes, probs, 4, case["tokens_per_expert"], 2, False)
    assert rows.stop_gradient  # (do_gather=False: no rows, no gradient)


def test_float8_rows_have_no_gradient_but_probabilities_do():
    """float8 rows requiring a gradient get zeros (Paddle's backward needs a tensor), their
    permuted rows none; the probabilities get theirs."""
    case = _case(10)
    x = to_paddle(case["hidden_states"].astype(ml_dtypes.float8_e4m3fn))
    x.stop_gradient = False
    probs = _leaf(case["expert_prob_topk"])
    scale = to_paddle(np.ones((11, 1), np.float32))
    routes = to_paddle(case["expert_routemap_topk"])
    rows, _, row_probs, _ = mp.moe_permute(x, scale, routes, probs, 4, case["tokens_per_expert"], 2)
    assert rows.stop_gradient and not row_probs.stop_gradient
    (row_probs * 2).sum().backward()
    assert not as_numpy(x.grad).astype(np.float32).any()
    assert_same_bits(
        as_numpy(probs.grad),
        np.where(case["expert_routemap_topk"] >= 0, 2.0, 0.0).astype(np.float32),
    )


def test_an_error_inside_autograd_is_the_ops_error():
    case = _case(11)
    case["expert_routemap_topk"][0, 0] = 9
    args = {k: to_paddle(v) for k, v in case.items()}
    args["hidden_states"].stop_gradient = False
    with pytest.raises(ValueError, match="expert_routemap_topk"):
        mp.moe_permute(scale=None, **args)


def test_installed_functions_are_differentiable(installed):  # noqa: F811 (the fixture)
    case = _case(12)
    x, probs = _leaf(case["hidden_states"]), _leaf(case["expert_prob_topk"])
    routes = to_paddle(case["expert_routemap_topk"])
    rows, rowmap, row_probs, _ = F.moe_permute(
        x, None, routes, probs, 4, case["tokens_per_expert"], 2
    )
    out, _ = F.moe_unpermute(rows, rowmap, routes, row_probs, 11, 4, using_weighted_combine=True)
    out.sum().backward()
    assert x.grad is not None and probs.grad is not None


def test_sort_chunks_gradient_is_the_inverse_sort():
    rng = np.random.default_rng(13)
    x, probs = _leaf(rng.standard_normal((9, 3)).astype(np.float32)), _leaf(random_probs(rng, (9,)))
    sizes, order = [2, 0, 4, 1], [3, 1, 0, 2]
    y, probs_y = moe_sort_chunks(x, sizes, order, probs)
    grad_y, grad_p = rng.standard_normal((9, 3)).astype(np.float32), random_probs(rng, (9,))
    dx, dprobs = paddle.grad([y, probs_y], [x, probs], [to_paddle(grad_y), to_paddle(grad_p)])
    inverse = [order.index(c) for c in range(4)]
    expected = moe_sort_chunks(grad_y, [sizes[c] for c in order], inverse, grad_p)
    assert_same_bits(as_numpy(dx), expected[0])
    assert_same_bits(as_numpy(dprobs), expected[1])
    y, _ = moe_sort_chunks(x, paddle.to_tensor(sizes), order)  # (sizes in a CPU tensor)
    (dx,) = paddle.grad([y], [x], [to_paddle(grad_y)])
    assert_same_bits(as_numpy(dx), moe_sort_chunks(grad_y, [sizes[c] for c in order], inverse)[0])


# ------------------------------------------------------------------------------------------
# paddle.jit.to_static


def _forward(function, counts):
    def run(x, probs, routes):
        rows, rowmap, row_probs, _ = function(x, None, routes, probs, 4, counts, 2)
        out, _ = mp.moe_unpermute(rows * 2, rowmap, routes, row_probs, 11, 4, True, True)
        return out

    return run


def _permute_of(name):
    """The permute called ``name``: this package's, the public one, or (installed) Paddle's
    own function name, looked up at the call."""
    return {
        "paddle's signature": mp.moe_permute,
        "public": moe_permute,
        "installed": lambda *args: F.moe_permute(*args),
    }[name]


@pytest.mark.parametrize("name", ["paddle's signature", "public", "installed"])
def test_to_static_runs_the_calls_eagerly(installed, name):  # noqa: F811 (the fixture)
    """to_static's default translator (SOT) breaks its graph at each call and runs it eagerly:
    the outputs and gradients of eager execution."""
    case = _case(14)
    routes = to_paddle(case["expert_routemap_topk"])
    results = []
    forward = _forward(_permute_of(name), case["tokens_per_expert"])
    for run in (forward, paddle.jit.to_static(forward)):
        x, probs = _leaf(case["hidden_states"]), _leaf(case["expert_prob_topk"])
        out = run(x, probs, routes)
        out.sum().backward()
        results.append([as_numpy(t) for t in (out, x.grad, probs.grad)])
    for eager, static in zip(*results, strict=True):
        assert_same_bits(static, eager)


@pytest.mark.parametrize("function", [mp.moe_permute, moe_permute], ids=["paddle's", "public"])
def test_a_static_graph_is_refused_by_name(function):
    """to_static(full_graph=True) hands the ops a static graph's tensors: refused, naming
    the argument and to_static."""
    case = _case(15)
    static = paddle.jit.to_static(_forward(function, case["tokens_per_expert"]), full_graph=True)
    with pytest.raises(
        TypeError,
        match=r"hidden_states is a tensor of a static graph \(paddle.base.libpaddle.pir.Value\), "
        r"as paddle.jit.to_static\(full_graph=True\)",
    ):
        static(
            *(
                to_paddle(case[k])
                for k in ("hidden_states", "expert_prob_topk", "expert_routemap_topk")
            )
        )
