"""The public functions on Paddle tensors: :mod:`moe_numba._api` sends a call here when a
Paddle tensor is among its arrays (the same interface as :mod:`moe_numba.torch._calls`).

A call that autograd records (grad mode on, a differentiable input with
``stop_gradient=False``) runs through a ``PyLayer`` of :mod:`._autograd`; any other goes to
the core through :func:`._front.call`. Both give the same outputs.

``paddle.jit.to_static``: each function here is marked to run eagerly
(``paddle.jit.marker.force_dynamic``), so that the default translator (SOT) breaks its graph
at the call and runs it on eager tensors, as it does for any Python it cannot trace. A static
graph's tensors (``full_graph=True``, ``paddle.static``) are refused by name
(:func:`._bridge.check_eager`): the ops run on the host, between kernels, and cannot join a
static graph.
"""

import paddle

from .. import _core
from . import _autograd, _front
from ._bridge import check_eager

_eager = paddle.jit.marker.force_dynamic


def _recorded(arrays, differentiable):
    """Whether autograd records a call: grad mode on and an input of ``differentiable``
    (indices into ``arrays``) requires a gradient."""
    if not paddle.is_grad_enabled():
        return False
    return any(getattr(arrays[i], "stop_gradient", True) is False for i in differentiable)


@_eager
def permute(arrays, values, tokens_per_expert):
    """:func:`moe_numba.moe_permute` on Paddle tensors (``arrays``: its PermuteArrays;
    ``values``: its scalar arguments, in the order of ``_core.PERMUTE_SCALARS``)."""
    check_eager(arrays)
    scalars = _core.permute_scalars(*values)
    if _recorded(arrays, (0, 3)):
        return _autograd.permute(arrays, scalars, tokens_per_expert)
    return _front.call("permute", arrays, scalars, tokens_per_expert)


@_eager
def unpermute(arrays, values):
    """:func:`moe_numba.moe_unpermute` on Paddle tensors (``values`` in the order of
    ``_core.UNPERMUTE_SCALARS``)."""
    check_eager(arrays)
    scalars = _core.unpermute_scalars(*values)
    if _recorded(arrays, (0, 3)):
        return _autograd.unpermute(arrays, scalars)
    return _front.call("unpermute", arrays, scalars)


@_eager
def permute_backward(arrays, values):
    """:func:`moe_numba.moe_permute_backward` on Paddle tensors (not differentiable)."""
    scalars = dict(zip(_core.PERMUTE_BACKWARD_SCALARS, values, strict=True))
    return _front.call("permute_backward", arrays, scalars)


@_eager
def unpermute_backward(arrays, values):
    """:func:`moe_numba.moe_unpermute_backward` on Paddle tensors (not differentiable)."""
    scalars = dict(zip(_core.UNPERMUTE_BACKWARD_SCALARS, values, strict=True))
    return _front.call("unpermute_backward", arrays, scalars)


@_eager
def sort_chunks(x, split_sizes, order, probs, *, validate):
    """:func:`moe_numba.moe_sort_chunks` on Paddle tensors; sizes in a CPU tensor are a host
    sequence, sizes in a GPU tensor are read on the device."""
    arrays, host_sizes = _front.sort_arrays(x, split_sizes, probs)
    check_eager(arrays)
    scalars = {"split_sizes": host_sizes, "order": order, "validate": validate}
    if _recorded(arrays, (0, 1)):
        return _autograd.sort_chunks(arrays, scalars)
    return _front.call("sort_chunks", arrays, scalars)[:2]
