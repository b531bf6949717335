"""The gradient ops (docs/gradients.rst) that the backward custom ops run.

:func:`permute_backward` and :func:`unpermute_backward` take the arguments of
``moe_numba.moe_permute_backward`` / ``moe_unpermute_backward`` (NumPy arrays for CPU tensors,
CUDA tensors as they are) and return what those return: the library's own gradient ops, the
Cython backend for the NumPy views, the numba.cuda kernels for CUDA tensors. Those functions
send no torch tensor back to the custom ops (the CUDA tensors arrive here from inside one).
"""

from .._api_backward import moe_permute_backward, moe_unpermute_backward


def permute_backward(*args, **kwargs):
    """``moe_permute_backward`` on NumPy arrays or CUDA tensors (docs/gradients.rst)."""
    return moe_permute_backward(*args, **kwargs)


def unpermute_backward(*args, **kwargs):
    """``moe_unpermute_backward`` on NumPy arrays or CUDA tensors (docs/gradients.rst).

    Autograd saves the forward's rows only when the probabilities need a gradient: without
    them (None) the probability gradient has no dot-product term, which is then not wanted.
    """
    return moe_unpermute_backward(*args, **kwargs)
