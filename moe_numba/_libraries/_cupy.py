"""The adapter of CuPy arrays."""

from __future__ import annotations

import contextlib
import importlib.util

import numpy as np

from ..runtime._buffer import DeviceBuffer
from ._protocol import loaded_type


class CupyLibrary:
    """CuPy arrays: CuPy's memory pool, CuPy's current stream."""

    name = "cupy"
    location = "cuda"

    @classmethod
    def serves(cls, x):
        ndarray = loaded_type("cupy", "ndarray")
        return ndarray is not None and isinstance(x, ndarray)

    @classmethod
    def usable(cls):
        if importlib.util.find_spec("cupy") is None:
            return False
        import cupy

        try:
            return cupy.cuda.runtime.getDeviceCount() > 0
        except cupy.cuda.runtime.CUDARuntimeError:  # no driver, or no device
            return False

    def __init__(self):
        import cupy

        self.cupy = cupy

    def shape(self, x):
        return tuple(x.shape)

    def dtype(self, x):
        return x.dtype

    def is_contiguous(self, x):
        return x.flags.c_contiguous

    def key(self, x):
        return type(x), x.shape, x.dtype, x.strides, x.device.id

    def device(self, x):
        return ("cuda", x.device.id)

    def buffer(self, x):
        return DeviceBuffer(x.data.ptr, x.nbytes)

    def empty(self, shape, dtype, like):
        with like.device:
            return self.cupy.empty(shape, dtype=dtype)

    def upload(self, values, like):
        with like.device:
            return self.cupy.asarray(values)

    def _device_of(self, like_or_device):
        if like_or_device is None:
            return contextlib.nullcontext()
        if isinstance(like_or_device, int):
            return self.cupy.cuda.Device(like_or_device)
        return like_or_device.device

    def from_numpy(self, array, like_or_device=None):
        with self._device_of(like_or_device):
            return self.cupy.asarray(np.ascontiguousarray(array))

    def to_host(self, x):
        return x.get()

    def copy(self, dst, src):
        self.cupy.copyto(dst, src)

    def stream(self, like):
        return int(self.cupy.cuda.get_current_stream().ptr)
