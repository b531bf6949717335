"""Explicit host <-> device copies for the demo, the benchmark and the tests.

The API itself never copies between host and device; these helpers are for code that wants
to, with every dtype the contract supports (bfloat16 and float8 included).
"""

from __future__ import annotations

import importlib.util

import ml_dtypes
import numpy as np

_ML_DTYPES = {
    np.dtype(ml_dtypes.bfloat16),
    np.dtype(ml_dtypes.float8_e4m3fn),
    np.dtype(ml_dtypes.float8_e5m2),
}
_BITS = {1: np.uint8, 2: np.uint16}
GPU_LIBRARIES = ("torch", "cupy", "numba")


def to_device(x, library):
    """Copy NumPy array ``x`` to the current GPU as a ``library`` array.

    ``library`` is ``"torch"``, ``"cupy"`` or ``"numba"`` (numba device arrays; also the
    CUDA simulator's arrays when it is enabled).
    """
    x = np.ascontiguousarray(x)
    if library == "torch":
        import torch

        if x.dtype in _ML_DTYPES:
            bits = torch.from_numpy(x.view(np.int16 if x.itemsize == 2 else np.uint8))
            return bits.view(getattr(torch, x.dtype.name)).cuda()
        return torch.from_numpy(x).cuda()
    if library == "cupy":
        import cupy

        return cupy.asarray(x)
    from numba import config, cuda

    if x.dtype in _ML_DTYPES and not config.ENABLE_CUDASIM:
        return cuda.to_device(x.view(_BITS[x.itemsize])).view(x.dtype)
    return cuda.to_device(x)


def to_host(x):
    """Copy a NumPy, torch, CuPy or numba array to a NumPy array of the same dtype."""
    if isinstance(x, np.ndarray):
        return x
    module = type(x).__module__.partition(".")[0]
    if module == "torch":
        import torch

        name = str(x.dtype).removeprefix("torch.")
        if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
            bits = torch.int16 if x.element_size() == 2 else torch.uint8
            return x.view(bits).cpu().numpy().view(getattr(ml_dtypes, name))
        return x.cpu().numpy()
    if module == "cupy":
        return x.get()
    dtype = np.dtype(x.dtype)
    if dtype in _ML_DTYPES and hasattr(x, "view") and not hasattr(x, "_ary"):
        return x.view(_BITS[dtype.itemsize]).copy_to_host().view(dtype)
    return x.copy_to_host()


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
