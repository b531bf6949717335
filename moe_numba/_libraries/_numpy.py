"""The adapter of NumPy arrays: the CPU backend's arrays."""

from __future__ import annotations

import numpy as np


class NumpyLibrary:
    """NumPy arrays: the CPU backend's arrays."""

    name = "numpy"
    location = "cpu"

    @classmethod
    def serves(cls, x):
        return isinstance(x, np.ndarray)

    @classmethod
    def usable(cls):
        return True

    def shape(self, x):
        return tuple(x.shape)

    def dtype(self, x):
        return x.dtype

    def is_contiguous(self, x):
        return x.flags.c_contiguous

    def key(self, x):
        return type(x), x.shape, x.dtype, x.strides

    def device(self, x):
        return "cpu"

    def empty(self, shape, dtype, like=None):
        return np.empty(shape, dtype)

    def from_numpy(self, array, like_or_device=None):
        return np.array(array, order="C")

    def to_host(self, x):
        return x

    def copy(self, dst, src):
        np.copyto(dst, src)
