"""Which front serves a call: the core, or the integration of a library with transforms of
its own.

The core (:mod:`._core`) serves NumPy arrays and CUDA arrays as arrays: it reads them and
writes outputs of their kind. A library whose tensors carry more than memory (torch's and
Paddle's autograd, tracing and compilation) has a front of its own, a subpackage with a ``call(op,
arrays, scalars, capacities=None)`` like :func:`._core.call`, which does what that library
needs around the core. This module is the table of those fronts; the public functions ask it
once per call, and it imports nothing a caller has not: a library's front is looked for only
when the library is in ``sys.modules``, and loaded on its first tensor.
"""

from __future__ import annotations

import sys

from . import _core


def _torch_tensors(torch):
    return torch.Tensor


def _torch_front(torch):
    # a dict lookup once imported; an import statement while dynamo traces (it would guard
    # on the lookup, which the import then changes; it traces the statement itself)
    front = None if torch.compiler.is_compiling() else sys.modules.get("moe_numba.torch._front")
    if front is None:
        from .torch import _front as front
    return front


def _paddle_tensors(paddle):
    # (a static graph's tensors too: its front refuses them by name)
    return (paddle.Tensor, paddle.pir.Value)


def _paddle_front(paddle):
    front = sys.modules.get("moe_numba.paddle._calls")
    if front is None:
        from .paddle import _calls as front
    return front


# (module of the library, the classes of its tensors, the loader of its front; both given
# the library), in the order they are asked
FRONTS = (
    ("torch", _torch_tensors, _torch_front),
    ("paddle", _paddle_tensors, _paddle_front),
)


def front_of(arrays):
    """The front that serves a call on ``arrays`` (an op's arrays NamedTuple): a library's
    own where one of the arrays is its tensor, else the core."""
    for module, tensors, load in FRONTS:
        library = sys.modules.get(module)
        if library is None:
            continue
        kind = tensors(library)
        for x in arrays:
            if isinstance(x, kind):
                return load(library)
    return _core
