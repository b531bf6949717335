"""Explicit host <-> device copies for the demo, the benchmark and the tests.

The API itself never copies between host and device; these helpers are for code that wants
to, with every dtype the contract supports (bfloat16 and float8 included). What each library
does is its adapter's business (:mod:`moe_numba._libraries`).
"""

from __future__ import annotations

from ._libraries import GPU_LIBRARIES, array_library, library_named


def to_device(x, library):
    """Copy NumPy array ``x`` to the current GPU as a ``library`` array.

    Parameters
    ----------
    x : numpy.ndarray
        Any array of a dtype the contract supports.
    library : str
        ``"torch"``, ``"cupy"``, ``"numba"`` (numba device arrays; the simulator's arrays when
        the CUDA simulator is on) or ``"cudasim"``.

    Returns
    -------
    array
        A C-contiguous copy of ``x`` of that library.
    """
    return library_named(library).from_numpy(x)


def to_host(x):
    """Copy a NumPy, torch, CuPy or numba array to a NumPy array of the same dtype."""
    return array_library(x).to_host(x)


def gpu_library():
    """The name of the first of torch, CuPy, numba (or the CUDA simulator) that is installed
    and sees a GPU, else None."""
    for library in GPU_LIBRARIES:
        if library.usable():
            return library.name
    return None
