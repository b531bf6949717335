"""The SPEC 5 gradient ops that the backward custom ops run.

:func:`permute_backward` and :func:`unpermute_backward` take the arguments of
``moe_numba.moe_permute_backward`` / ``moe_unpermute_backward`` (NumPy arrays for CPU tensors,
CUDA tensors as they are) and return what those return. They are the one place that names
the implementation: until the library's own gradient ops exist for both backends, a plain
torch reference (:mod:`._reference`) stands in. Whatever they call must not send torch
tensors back to the custom ops (the CUDA tensors arrive here from inside one).
"""

from . import _reference


def permute_backward(*args, **kwargs):
    """``moe_permute_backward`` on NumPy arrays or CUDA tensors (SPEC 5)."""
    return _reference.permute_backward(*args, **kwargs)


def unpermute_backward(*args, **kwargs):
    """``moe_unpermute_backward`` on NumPy arrays or CUDA tensors (SPEC 5)."""
    return _reference.unpermute_backward(*args, **kwargs)
