"""The gradient ops (docs/gradients.rst) that the backward custom ops run.

:func:`permute_backward` and :func:`unpermute_backward` take the arguments of
``moe_numba.moe_permute_backward`` / ``moe_unpermute_backward`` (NumPy arrays for CPU tensors,
CUDA tensors as they are) and return what those return. They are the one place that names
the implementation: NumPy arrays go to the library's own gradient ops (the Cython backend);
CUDA tensors, until the GPU backend has those ops, to a plain torch reference
(:mod:`._reference`). Whatever they call must not send torch tensors back to the custom ops
(the CUDA tensors arrive here from inside one).
"""

import numpy as np

from .._api_backward import moe_permute_backward, moe_unpermute_backward
from . import _reference


def _on_host(arrays):
    return all(a is None or isinstance(a, np.ndarray) for a in arrays)


def permute_backward(*args, **kwargs):
    """``moe_permute_backward`` on NumPy arrays or CUDA tensors (docs/gradients.rst)."""
    if _on_host(args):
        return moe_permute_backward(*args, **kwargs)
    return _reference.permute_backward(*args, **kwargs)


def unpermute_backward(*args, **kwargs):
    """``moe_unpermute_backward`` on NumPy arrays or CUDA tensors (docs/gradients.rst).

    Autograd saves the forward's rows only when the probabilities need a gradient: without
    them (None) the probability gradient has no dot-product term, which is then not wanted.
    """
    if _on_host(args):
        return moe_unpermute_backward(*args, **kwargs)
    return _reference.unpermute_backward(*args, **kwargs)
