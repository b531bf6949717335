"""The public functions under every torch transform: the eager result bit for bit, or an
error that names the transform and the function; never a silent wrong result.

Each transform is checked against a plain eager call of the same inputs. The custom ops'
presence in a traced program is checked too: a trace that recorded only allocations would
return uninitialised memory.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from torch.fx.experimental.proxy_tensor import make_fx  # noqa: E402

from _torch_cases import DEVICES, assert_same_bits, routing, to_torch, torch  # noqa: F401
from moe_numba import moe_permute, moe_permute_backward, moe_sort_chunks, moe_unpermute


def _case(device, dtype=np.float32, seed=3):
    case = routing(seed, dtype=dtype)
    x, routes, probs = (
        to_torch(case.pop(name), device)
        for name in ("hidden_states", "expert_routemap_topk", "expert_prob_topk")
    )
    return case, x, routes, probs


def _layer(case):
    """permute -> a scale of the rows -> weighted unpermute, as a function of the rows, the
    routing map and the probabilities."""
    counts, num_experts = case["tokens_per_expert"], case["num_experts"]
    alignment = case["padding_alignment"]

    def layer(x, routes, probs):
        rows, rowmap, row_probs, _ = moe_permute(
            x, None, routes, probs, num_experts, counts, alignment
        )
        y, slot_probs = moe_unpermute(
            rows * 3, rowmap, routes, row_probs, x.shape[0], num_experts,
            using_weighted_combine=True,
        )  # fmt: skip
        return y, slot_probs, rows

    return layer


def _assert_outputs_equal(actual, expected):
    for a, e in zip(actual, expected, strict=True):
        assert_same_bits(a, e)


def _op_names(code):
    return [name for name in ("moe_numba.permute", "moe_numba.unpermute") if name in code]


@pytest.mark.filterwarnings("ignore:`torch.jit.(trace|script)` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_jit_trace(device, requires_grad):
    case, x, routes, probs = _case(device)
    layer = _layer(case)
    expected = layer(x, routes, probs)
    x = x.clone().requires_grad_(requires_grad)
    traced = torch.jit.trace(layer, (x, routes, probs), check_trace=False)
    assert "moe_numba::permute" in str(traced.graph)
    assert "moe_numba::unpermute" in str(traced.graph)
    other = x.detach() * 2
    _assert_outputs_equal(traced(other, routes, probs), layer(other, routes, probs))
    _assert_outputs_equal([t.detach() for t in traced(x, routes, probs)], expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["real", "fake", "symbolic"])
def test_make_fx(device, mode):
    case, x, routes, probs = _case(device)
    layer = _layer(case)
    graph = make_fx(layer, tracing_mode=mode)(x, routes, probs)
    assert _op_names(graph.code) == ["moe_numba.permute", "moe_numba.unpermute"]
    _assert_outputs_equal(graph(x, routes, probs), layer(x, routes, probs))


@pytest.mark.parametrize("device", DEVICES)
def test_export(device):
    case, x, routes, probs = _case(device)
    layer = _layer(case)

    class Layer(torch.nn.Module):
        def forward(self, x, routes, probs):
            return layer(x, routes, probs)

    exported = torch.export.export(Layer(), (x, routes, probs))
    assert _op_names(str(exported.graph)) == ["moe_numba.permute", "moe_numba.unpermute"]
    other = x * 2
    _assert_outputs_equal(exported.module()(other, routes, probs), layer(other, routes, probs))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_dynamic(device):
    case, x, routes, probs = _case(device)
    layer = _layer(case)
    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend="aot_eager")
    _assert_outputs_equal(compiled(x, routes, probs), layer(x, routes, probs))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_first_call_of_a_fresh_process(device):
    """The first call of a compiled function, before any eager call in the process: importing
    the torch integration while dynamo traces changes nothing that dynamo guards on."""
    if device != "cpu" and not torch.cuda.is_available():
        pytest.skip("torch finds no CUDA GPU")
    script = textwrap.dedent(
        f"""
        import torch
        from moe_numba import moe_permute, moe_unpermute

        def layer(x, routes, probs):
            rows, rowmap, row_probs, _ = moe_permute(x, None, routes, probs, 3, [2, 1, 1], 2)
            return moe_unpermute(rows, rowmap, routes, row_probs, 3, 3, True, True)[0]

        x = torch.arange(6.0, device="{device}").reshape(3, 2)
        routes = torch.tensor([[0, 1], [0, -1], [2, -1]], dtype=torch.int32, device="{device}")
        probs = torch.full((3, 2), 0.5, device="{device}")
        compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
        got = compiled(x, routes, probs)
        assert torch.equal(got, layer(x, routes, probs)), got
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


class _Reference:
    """The layer of :func:`_layer` in plain torch ops (gathers, products and sums by the row
    map), differentiable to any order: the gradients of gradients to compare with."""

    def __init__(self, rowmap, routes):
        self.rows = rowmap.long()
        self.routes = routes.long()

    def __call__(self, x, probs):
        num_tokens, num_experts = self.rows.shape
        mapped = self.rows >= 0
        # each (token, expert) pair's slot: the first k naming the expert
        slot = torch.zeros_like(self.rows)
        for k in reversed(range(self.routes.shape[1])):
            e = self.routes[:, k]
            ok = (e >= 0) & (e < num_experts)
            slot[ok.nonzero()[:, 0], e[ok]] = k
        p = torch.gather(probs, 1, slot) * mapped
        y = torch.einsum("te,th->th", p * 3, x)
        return y


@pytest.mark.parametrize("device", DEVICES)
def test_create_graph_and_double_backward(device):
    """A gradient penalty: ``create_graph=True`` first-order gradients are the plain ones,
    and their own gradients match a plain-torch reference of the same layer."""
    case, x, routes, probs = _case(device, seed=5)
    layer = _layer(case)
    x = x.clone().requires_grad_(True)
    probs = probs.clone().requires_grad_(True)

    def loss_of(y, slot_probs, rows):
        return (y * y).sum() + (slot_probs * slot_probs).sum()

    plain = torch.autograd.grad(loss_of(*layer(x, routes, probs)), (x, probs))
    graph = torch.autograd.grad(loss_of(*layer(x, routes, probs)), (x, probs), create_graph=True)
    for a, b in zip(graph, plain, strict=True):
        assert a.requires_grad
        assert_same_bits(a.detach(), b)
    penalty = sum((g * g).sum() for g in graph)
    second = torch.autograd.grad(penalty, (x, probs))

    _, rowmap, _, _ = layer(x, routes, probs)[2], *moe_permute(
        x.detach(), None, routes, probs.detach(), case["num_experts"],
        case["tokens_per_expert"], case["padding_alignment"],
    )[1:]  # fmt: skip
    reference = _Reference(rowmap, routes)
    xr = x.detach().double().requires_grad_(True)
    pr = probs.detach().double().requires_grad_(True)
    y_ref = reference(xr, pr)
    slot_ref = _slot_probs(rowmap, routes, pr)
    first_ref = torch.autograd.grad(
        (y_ref * y_ref).sum() + (slot_ref * slot_ref).sum(), (xr, pr), create_graph=True
    )
    second_ref = torch.autograd.grad(sum((g * g).sum() for g in first_ref), (xr, pr))
    for got, want in zip(second, second_ref, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def _slot_probs(rowmap, routes, probs):
    """moe_unpermute's second output (every slot naming an expert with a row gets that row's
    probability, which is the counted slot's) in plain torch ops."""
    rows, ids = rowmap.long(), routes.long()
    num_experts = rows.shape[1]
    named = (ids >= 0) & (ids < num_experts)
    row = torch.gather(rows, 1, ids.clamp(0, num_experts - 1))
    first = torch.zeros_like(rows)
    for k in reversed(range(ids.shape[1])):
        e = ids[:, k]
        ok = (e >= 0) & (e < num_experts)
        first[ok.nonzero()[:, 0], e[ok]] = k
    counted_prob = torch.gather(probs, 1, torch.gather(first, 1, ids.clamp(0, num_experts - 1)))
    return torch.where(named & (row >= 0), counted_prob, torch.zeros_like(counted_prob))


@pytest.mark.filterwarnings("ignore:`torch.jit.(trace|script)` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("device", DEVICES)
def test_forward_ad_and_func_transforms_are_refused_by_name(device):
    case, x, routes, probs = _case(device)
    layer = _layer(case)
    fwd = torch.autograd.forward_ad
    with fwd.dual_level():
        dual = fwd.make_dual(x, torch.ones_like(x))
        with pytest.raises(NotImplementedError, match="moe_permute does not support forward"):
            layer(dual, routes, probs)
    with pytest.raises(NotImplementedError, match=r"moe_permute does not support torch\.func\.jvp"):
        torch.func.jvp(lambda x: layer(x, routes, probs)[0], (x,), (torch.ones_like(x),))
    with pytest.raises(NotImplementedError, match=r"does not support torch\.func\.grad"):
        torch.func.grad(lambda x: layer(x, routes, probs)[0].sum())(x)
    rowmap = layer(x, routes, probs)[2]
    with pytest.raises(NotImplementedError, match="moe_permute_backward does not support"):
        torch.func.grad(_permute_backward_sum(case, x, routes, probs))(rowmap)
    with pytest.raises(NotImplementedError, match="moe_sort_chunks does not support"):
        torch.func.grad(lambda v: moe_sort_chunks(v, [1, 6], [1, 0])[0].sum())(x)


def _permute_backward_sum(case, x, routes, probs):
    maps = _maps(case, x, routes, probs)
    return lambda g: moe_permute_backward(g, None, *maps)[0].sum()


def _maps(case, x, routes, probs):
    _, rowmap, _, _ = moe_permute(
        x, None, routes, probs, case["num_experts"], case["tokens_per_expert"],
        case["padding_alignment"],
    )  # fmt: skip
    return rowmap, routes


@pytest.mark.parametrize("device", DEVICES)
def test_vmap(device):
    case, x, routes, probs = _case(device)
    layer = _layer(case)
    batch = torch.stack([x, x * 2])
    got = torch.func.vmap(lambda v: layer(v, routes, probs)[0])(batch)
    for i in range(2):
        assert_same_bits(got[i], layer(batch[i].contiguous(), routes, probs)[0])


@pytest.mark.parametrize("device", DEVICES)
def test_meta_tensors_give_shapes(device):
    case, x, routes, probs = _case(device)
    meta = [t.to("meta") for t in (x, routes, probs)]
    shapes = [t.shape for t in _layer(case)(*meta)]
    assert all(t.device.type == "meta" for t in _layer(case)(*meta))
    assert shapes == [t.shape for t in _layer(case)(x, routes, probs)]


@pytest.mark.parametrize("default", ["meta", "cpu"])
def test_default_device_does_not_move_cpu_outputs(default):
    case, x, routes, probs = _case("cpu")
    layer = _layer(case)
    expected = layer(x, routes, probs)
    torch.set_default_device(default)
    try:
        got = layer(x, routes, probs)
        y, _ = moe_sort_chunks(x, [3, 4], [1, 0])
    finally:
        torch.set_default_device(None)
    _assert_outputs_equal(got, expected)
    assert y.device.type == "cpu"


@pytest.mark.parametrize(
    "dtype", ["float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2"]
)
def test_dtypes_torch_has_and_numpy_lacks_are_refused_by_name(dtype):
    if not hasattr(torch, dtype):
        pytest.skip(f"this torch has no {dtype}")
    x = torch.zeros((4, 2), dtype=torch.uint8).view(getattr(torch, dtype))
    with pytest.raises(TypeError, match=f"x has dtype torch.{dtype}, which moe-numba does not"):
        moe_sort_chunks(x, [2, 2], [1, 0])
    routes = torch.zeros((4, 1), dtype=torch.int32)
    probs = torch.ones((4, 1))
    with pytest.raises(TypeError, match=f"hidden_states has dtype torch.{dtype}"):
        moe_permute(x, None, routes, probs, 1, [4], 1)
