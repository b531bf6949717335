"""The SPEC 5 gradient ops that the backward custom ops run.

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
    """``moe_permute_backward`` on NumPy arrays or CUDA tensors (SPEC 5)."""
    if _on_host(args):
        return moe_permute_backward(*args, **kwargs)
    return _reference.permute_backward(*args, **kwargs)


def unpermute_backward(*args, using_weighted_combine, num_rows, **kwargs):
    """``moe_unpermute_backward`` on NumPy arrays or CUDA tensors (SPEC 5).

    Autograd saves the forward's rows only when the probabilities need a gradient, so a
    weighted row gradient may come without them; ``moe_unpermute_backward`` requires them
    there (for the dot-product term, which the caller then ignores), and zeros stand in.
    """
    keywords = dict(using_weighted_combine=using_weighted_combine, num_rows=num_rows, **kwargs)
    if not _on_host(args):
        return _reference.unpermute_backward(*args, **keywords)
    grad_out, grad_slots, rows, *maps = args
    if using_weighted_combine and grad_out is not None and rows is None:
        rows = np.zeros((num_rows, grad_out.shape[1]), grad_out.dtype)
    return moe_unpermute_backward(grad_out, grad_slots, rows, *maps, **keywords)
