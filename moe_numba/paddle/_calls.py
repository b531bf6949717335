"""The front of Paddle tensors: :mod:`moe_numba._fronts` sends a call of any op here when a
Paddle tensor is among its arrays.

A call that autograd records (grad mode on, a differentiable input with
``stop_gradient=False``) runs through the op's ``PyLayer`` (:mod:`._autograd`); any other goes
to the core through :func:`._front.outputs`. Both give the same outputs.

``paddle.jit.to_static``: :func:`call` is marked to run eagerly
(``paddle.jit.marker.force_dynamic``), so that the default translator (SOT) breaks its graph
at the call and runs it on eager tensors, as it does for any Python it cannot trace. A static
graph's tensors (``full_graph=True``, ``paddle.static``) are refused by name
(:func:`._bridge.check_eager`): the ops run on the host, between kernels, and cannot join a
static graph.
"""

import paddle

from . import _autograd, _front
from ._bridge import check_eager


def _recorded(op, arrays):
    """Whether autograd records a call: grad mode on and an input the op is differentiable
    in requires a gradient."""
    if not paddle.is_grad_enabled():
        return False
    return any(
        getattr(arrays[i], "stop_gradient", True) is False for i in op.differentiable_indices
    )


@paddle.jit.marker.force_dynamic
def call(op, arrays, scalars, capacities=None):
    """The public result of a call of ``op`` on Paddle tensors (``arrays`` and ``scalars``:
    the op's NamedTuples; ``capacities``: a permute's ``tokens_per_expert``)."""
    check_eager(arrays)
    if op.host_values is not None:
        arrays, scalars = op.host_values(arrays, scalars)
    layer = _autograd.LAYERS.get(op)
    if layer is not None and _recorded(op, arrays):
        return layer(arrays, scalars, capacities)
    return _front.outputs(op, arrays, scalars, capacities).result()
