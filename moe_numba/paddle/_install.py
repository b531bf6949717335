"""``install()`` / ``uninstall()``: ``paddle.nn.functional.moe_permute`` and
``moe_unpermute`` served by moe-numba where Paddle has no kernel for them.

Paddle registers these ops for GPUs only (its CPU wheels have no kernel at all). Installed,
each of the two names of ``paddle.nn.functional`` becomes a function that looks at its first
argument: an eager tensor on the CPU goes to this package's function of the same signature;
anything else (GPU tensors, other places, a static graph's values) goes to Paddle's own.
"""

import functools

import paddle
import paddle.nn.functional as F

from ._functional import moe_permute, moe_unpermute

_OURS = {"moe_permute": moe_permute, "moe_unpermute": moe_unpermute}
_PADDLES = {}  # name -> Paddle's function, while installed


def _serving(ours, paddles):
    """Paddle's function ``paddles``, with calls on CPU tensors served by ``ours``."""
    first = ours.__code__.co_varnames[0]

    @functools.wraps(paddles)
    def serve(*args, **kwargs):
        x = args[0] if args else kwargs.get(first)
        if isinstance(x, paddle.Tensor) and x.place.is_cpu_place():
            return ours(*args, **kwargs)
        return paddles(*args, **kwargs)

    serve.moe_numba_serves = ours
    return serve


def install():
    """Make ``paddle.nn.functional.moe_permute`` and ``moe_unpermute`` run on CPU tensors.

    Calls whose first tensor is on the CPU (where Paddle has no kernel) go to
    :func:`moe_numba.paddle.moe_permute` / :func:`moe_numba.paddle.moe_unpermute` (same
    signature, differentiable); every other call goes to Paddle's own kernel, unchanged.
    Calling it again changes nothing; :func:`uninstall` undoes it. Code that took the
    functions before (``from paddle.nn.functional import moe_permute``) keeps Paddle's.

    Examples
    --------
    >>> import paddle
    >>> import paddle.nn.functional as F
    >>> import moe_numba.paddle
    >>> moe_numba.paddle.install()
    >>> routes = paddle.to_tensor([[0], [1]], dtype="int32")
    >>> rows, rowmap, _, _ = F.moe_permute(
    ...     paddle.ones([2, 4], dtype="bfloat16"), None, routes, paddle.ones([2, 1]), 2, [1, 1], 1
    ... )
    >>> rowmap.tolist()
    [[0, -1], [-1, 1]]
    >>> moe_numba.paddle.uninstall()
    """
    for name, ours in _OURS.items():
        if name not in _PADDLES:
            _PADDLES[name] = getattr(F, name)
            setattr(F, name, _serving(ours, _PADDLES[name]))


def uninstall():
    """Give ``paddle.nn.functional`` its own ``moe_permute`` and ``moe_unpermute`` back (no
    effect when not installed)."""
    for name, paddles in list(_PADDLES.items()):
        setattr(F, name, paddles)
        del _PADDLES[name]
