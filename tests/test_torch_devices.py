"""Tensors of one call on two devices (docs/contract.rst, issue 43 item 1).

torch sends a call with a meta tensor among its inputs to the custom op's fake (meta) kernel,
whatever device the other tensors are on. A meta tensor beside a CPU or CUDA tensor must be
refused, on every op and every route, with a ``TypeError`` naming the arguments and both
devices (the outputs would otherwise be allocated on the data's device and never written);
tensors all on the meta device give meta outputs of the right shapes. A CPU tensor beside a
CUDA tensor keeps its ``TypeError``.

The CUDA cases run where torch finds a GPU (``-m gpu``) and skip here with the reason.
"""

import re

import pytest

from _torch_cases import DEVICES, routing, to_torch, torch
from moe_numba import (
    moe_permute,
    moe_permute_backward,
    moe_sort_chunks,
    moe_unpermute,
    moe_unpermute_backward,
)

NUM_TOKENS, NUM_EXPERTS = 7, 4
# each op's tensor arguments, in the order of its custom op's schema
TENSORS = {
    "moe_permute": "hidden_states scale expert_routemap_topk expert_prob_topk",
    "moe_unpermute": "hidden_states_unzipped zipped_expertwise_rowmap expert_routemap_topk "
    "token_prob_unzipped",
    "moe_permute_backward": "grad_hidden_states_unzipped grad_token_prob_unzipped "
    "zipped_expertwise_rowmap expert_routemap_topk",
    "moe_unpermute_backward": "grad_hidden_states grad_expert_prob_topk hidden_states_unzipped "
    "zipped_expertwise_rowmap expert_routemap_topk token_prob_unzipped",
    "moe_sort_chunks": "x probs",
}
FUNCTIONS = {
    f.__name__: f
    for f in (moe_permute, moe_unpermute, moe_permute_backward, moe_unpermute_backward)
} | {"moe_sort_chunks": moe_sort_chunks}


def _case():
    """Every op's valid CPU arguments, from one routing case: name -> (function, tensors,
    other keyword arguments, ``call(tensors, validate)`` of its custom op)."""
    case = routing(3, num_tokens=NUM_TOKENS, num_experts=NUM_EXPERTS)
    x, routes, probs = (
        to_torch(case[k], "cpu")
        for k in ("hidden_states", "expert_routemap_topk", "expert_prob_topk")
    )
    scale = torch.ones((NUM_TOKENS, 1))
    counts, alignment = case["tokens_per_expert"], case["padding_alignment"]
    rows, rowmap, row_probs, _ = moe_permute(
        x, scale, routes, probs, NUM_EXPERTS, counts, alignment
    )
    num_rows = rows.shape[0]
    values = dict(
        hidden_states=x, scale=scale, expert_routemap_topk=routes, expert_prob_topk=probs,
        hidden_states_unzipped=rows, zipped_expertwise_rowmap=rowmap,
        token_prob_unzipped=row_probs, grad_hidden_states_unzipped=rows,
        grad_token_prob_unzipped=row_probs, grad_hidden_states=x, grad_expert_prob_topk=probs,
        x=x, probs=probs[:, 0].contiguous(),
    )  # fmt: skip
    ops = torch.ops.moe_numba
    # do_gather, using_ue8m0_scale, return_expert_indices, override_buffer_size
    flags = (True, False, False, -1)
    scalars_and_ops = {
        "moe_permute": (
            dict(num_experts=NUM_EXPERTS, tokens_per_expert=counts, padding_alignment=alignment),
            lambda t, v: ops.permute(*t.values(), NUM_EXPERTS, alignment, *flags, v, False, counts),
        ),
        "moe_unpermute": (
            dict(total_zipped_tokens=NUM_TOKENS, num_experts=NUM_EXPERTS),
            lambda t, v: ops.unpermute(*t.values(), NUM_TOKENS, NUM_EXPERTS, True, True, v),
        ),
        "moe_permute_backward": ({}, lambda t, v: ops.permute_backward(*t.values(), v)),
        "moe_unpermute_backward": (
            dict(using_weighted_combine=True, num_rows=num_rows),
            lambda t, v: ops.unpermute_backward(*t.values(), True, num_rows, v),
        ),
        "moe_sort_chunks": (
            dict(split_sizes=[3, 4], order=[1, 0]),
            lambda t, v: ops.sort_chunks(t["x"], t["probs"], None, [1, 0], [3, 4], v),
        ),
    }
    return {
        op: (FUNCTIONS[op], {n: values[n] for n in TENSORS[op].split()}, scalars, call)
        for op, (scalars, call) in scalars_and_ops.items()
    }


CASE_NAMES = list(_case())
ARGUMENTS = [(op, name) for op, (_, tensors, _, _) in _case().items() for name in tensors]


def _device_name(device):
    device = torch.device(device)
    return f"cuda:{device.index or 0}" if device.type == "cuda" else device.type


def _on(tensors, device, argument, its_device):
    """``tensors`` on ``device``, ``argument`` on ``its_device``."""
    return {name: t.to(its_device if name == argument else device) for name, t in tensors.items()}


def assert_names_both(error, argument, devices):
    """The message names ``argument`` and both ``devices`` ("a is on X but b is on Y")."""
    message = str(error.value)
    said = re.match(r"(\w+) is on (\S+) but (\w+) is on ([\w:]+)", message)
    assert said is not None, message
    first, device_a, second, device_b = said.groups()
    assert argument in (first, second), message
    assert {device_a, device_b} == set(devices), message


def _route(route, function, tensors, scalars, op_call, validate):
    """Call through ``route``: the public function (grad mode off or on, a differentiable
    input requiring a gradient), or the custom op itself."""
    if route == "torch.ops":
        return op_call(tensors, validate)
    if route == "autograd":
        tensors = dict(tensors)
        name = next(n for n, t in tensors.items() if t.is_floating_point())
        tensors[name] = tensors[name].detach().requires_grad_()
    return function(**tensors, **scalars, validate=validate)


ROUTES = ["public", "autograd", "torch.ops"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("meta_is", ["the argument", "the others"])
@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("op, argument", ARGUMENTS)
def test_meta_beside_data_is_refused(device, meta_is, route, validate, op, argument):
    function, data, scalars, op_call = _case()[op]
    if meta_is == "the argument":
        tensors = _on(data, device, argument, "meta")
    else:
        tensors = _on(data, "meta", argument, device)
    if device == "cuda" and not validate:
        # a recorded call of the same shapes on the device (the replay route) first
        _route("public", function, _on(data, device, None, None), scalars, op_call, False)
    with pytest.raises(TypeError) as error:
        _route(route, function, tensors, scalars, op_call, validate)
    assert_names_both(error, argument, [_device_name(device), "meta"])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", ["an expert id past num_experts", "a negative expert id"])
def test_bad_expert_id_in_meta_routing_is_not_validated_silently(device, bad):
    """The values of a meta routing map cannot be read: a validating call on data tensors
    refuses the map by its device instead of passing it unread."""
    function, tensors, scalars, _ = _case()["moe_permute"]
    routes = tensors["expert_routemap_topk"].clone()
    routes[2, 0] = NUM_EXPERTS + 3 if bad.startswith("an expert id past") else -5
    tensors = _on(
        dict(tensors, expert_routemap_topk=routes), device, "expert_routemap_topk", "meta"
    )
    with pytest.raises(TypeError) as error:
        function(**tensors, **scalars, validate=True)
    assert_names_both(error, "expert_routemap_topk", [_device_name(device), "meta"])
    # the same map on the data's device is refused for its value
    tensors["expert_routemap_topk"] = routes.to(device)
    with pytest.raises(ValueError, match="expert"):
        function(**tensors, **scalars, validate=True)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("op", CASE_NAMES)
def test_all_meta_gives_meta_outputs_of_the_data_shapes(route, op):
    function, tensors, scalars, op_call = _case()[op]
    want = _route(route, function, tensors, scalars, op_call, True)
    got = _route(route, function, _on(tensors, "meta", None, None), scalars, op_call, True)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert (g is None) == (w is None)
        if g is not None:
            assert g.device.type == "meta" and g.shape == w.shape and g.dtype == w.dtype


@pytest.mark.parametrize("device", [DEVICES[1]])
@pytest.mark.parametrize("route", ["public", "torch.ops"])
@pytest.mark.parametrize("op, argument", ARGUMENTS)
def test_cpu_beside_cuda_is_refused(device, route, op, argument):
    """The TypeError of mixed host and device arrays, on every op."""
    function, tensors, scalars, op_call = _case()[op]
    tensors = _on(tensors, device, argument, "cpu")
    with pytest.raises(
        TypeError,
        match=rf"^{argument} is a torch.Tensor \(host array\) but \w+ is a torch.Tensor "
        r"\(CUDA array\)",
    ):
        _route(route, function, tensors, scalars, op_call, True)


@pytest.mark.parametrize("device", [DEVICES[1]])
@pytest.mark.parametrize("sizes_on", ["meta", "cuda"])
def test_device_split_sizes_beside_meta(device, sizes_on):
    """``moe_sort_chunks`` with its sizes in a tensor: meta sizes beside CUDA rows, or CUDA
    sizes beside meta rows, are refused by name."""
    _, tensors, _, _ = _case()["moe_sort_chunks"]
    x = tensors["x"].to("meta" if sizes_on == "cuda" else device)
    sizes = torch.tensor([3, 4], device=sizes_on)
    with pytest.raises(TypeError, match="split_sizes"):
        moe_sort_chunks(x, sizes, [1, 0])
