"""Array kinds under test: how to move a NumPy array there and back."""

from __future__ import annotations

import importlib.util
import os

import ml_dtypes
import numpy as np

_BITS = {1: np.uint8, 2: np.uint16}
_ML_DTYPES = {
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e5m2),
}


class Backend:
    """A kind of array a user may pass; ``small`` caps shapes for slow backends."""

    name = "?"
    small = False  # the CUDA simulator runs ~0.4 ms per thread: keep its shapes tiny
    exact_fma = True  # the simulator's cuda.fma rounds twice
    supports_float8 = True

    def to_device(self, x):
        raise NotImplementedError

    def to_host(self, x):
        raise NotImplementedError

    def __repr__(self):
        return self.name


class CPU(Backend):
    name = "cpu"

    def to_device(self, x):
        return x

    def to_host(self, x):
        return x


class NumbaDevice(Backend):
    name = "numba"

    def to_device(self, x):
        from numba import cuda

        if x.dtype in _ML_DTYPES:
            return cuda.to_device(x.view(_BITS[x.itemsize])).view(x.dtype)
        return cuda.to_device(x)

    def to_host(self, x):
        dtype = np.dtype(x.dtype)
        if dtype in _ML_DTYPES:
            return x.view(_BITS[dtype.itemsize]).copy_to_host().view(dtype)
        return x.copy_to_host()


class Simulator(NumbaDevice):
    name = "cudasim"
    small = True
    exact_fma = False

    def to_device(self, x):
        from numba import cuda

        return cuda.to_device(x)

    def to_host(self, x):
        return x.copy_to_host()


class Torch(Backend):
    name = "torch"

    def _torch(self):
        import torch

        return torch

    def to_device(self, x):
        torch = self._torch()
        if x.dtype in _ML_DTYPES:
            bits = torch.from_numpy(x.view(np.int16 if x.itemsize == 2 else np.uint8).copy())
            return bits.view(getattr(torch, x.dtype.name)).cuda()
        return torch.from_numpy(x.copy()).cuda()

    def to_host(self, x):
        torch = self._torch()
        name = str(x.dtype).removeprefix("torch.")
        if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            bits = torch.int16 if x.element_size() == 2 else torch.uint8
            return x.view(bits).cpu().numpy().view(getattr(ml_dtypes, name))
        return x.cpu().numpy()


class Cupy(Backend):
    name = "cupy"
    supports_float8 = False  # CuPy has no float8 dtype

    def to_device(self, x):
        import cupy

        return cupy.asarray(x)

    def to_host(self, x):
        return x.get()


BACKENDS = {b.name: b for b in (CPU(), Simulator(), NumbaDevice(), Torch(), Cupy())}


def available_backends():
    """``cpu``, plus the simulator, or every GPU kind whose library imports."""
    names = ["cpu"]
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return names + ["cudasim"]
    from numba import cuda

    if cuda.is_available():
        names.append("numba")
        names += [lib for lib in ("torch", "cupy") if importlib.util.find_spec(lib)]
    return names
