"""Explicit host <-> device copies for the demo, the benchmark and the tests.

The API itself never copies between host and device; these helpers are for code that wants
to, with every dtype the contract supports (bfloat16 and float8 included).
"""

from __future__ import annotations

import importlib.util

import numpy as np

from ._arrays import ML_DTYPE_BITS, array_library

GPU_LIBRARIES = ("torch", "cupy", "numba")


def to_device(x, library):
    """Copy NumPy array ``x`` to the current GPU as a ``library`` array.

    ``library`` is ``"torch"``, ``"cupy"`` or ``"numba"`` (numba device arrays; also the
    CUDA simulator's arrays when it is enabled).
    """
    x = np.ascontiguousarray(x)
    if library == "torch":
        import torch

        if x.dtype in ML_DTYPE_BITS:
            bits = torch.from_numpy(x.view(np.int16 if x.itemsize == 2 else np.uint8))
            return bits.view(getattr(torch, x.dtype.name)).cuda()
        return torch.from_numpy(x).cuda()
    if library == "cupy":
        import cupy

        return cupy.asarray(x)
    from numba import config, cuda

    if x.dtype in ML_DTYPE_BITS and not config.ENABLE_CUDASIM:
        return cuda.to_device(x.view(ML_DTYPE_BITS[x.dtype])).view(x.dtype)
    return cuda.to_device(x)


def to_host(x):
    """Copy a NumPy, torch, CuPy or numba array to a NumPy array of the same dtype."""
    return array_library(x).to_host(x)


def gpu_library():
    """The first of torch, CuPy, numba that is installed and sees a GPU, else None."""
    for library in GPU_LIBRARIES:
        if importlib.util.find_spec(library) is None:
            continue
        try:
            if library == "torch":
                import torch

                usable = torch.cuda.is_available()
            elif library == "cupy":
                import cupy

                usable = cupy.cuda.runtime.getDeviceCount() > 0
            else:
                from numba import cuda

                usable = cuda.is_available()
        except Exception:
            usable = False
        if usable:
            return library
    return None
