"""The CUDA runtime of the GPU backend: host plumbing between a planned call and the driver.

It knows neither the kernels' code (:mod:`moe_numba.kernels`) nor any array library: a
planner hands it compiled kernels, their geometry and parameter words, and device buffers.
What it keeps between calls (driver, launch configurations, pinned pools) belongs to one
:class:`Runtime` per process, :func:`get_runtime`'s, with a reset and a way to swap the
driver for tests.

==============  ==============================================================================
module          what it holds
==============  ==============================================================================
_runtime        ``Runtime``: the state of the modules below, its reset, the driver's swap
_launch         the raw launcher (``cuda.core.launch`` or the driver) and ``RawKernel``
_driver         kernel launches through the CUDA driver's C API (ctypes)
_driver_c       the launch sequences' C half (Cython, built with the package)
_sequence       a call's launches, planned once per call key and run by every call
_staged         values the host hands the kernels through pinned, device-mapped memory
_status         status words in mapped host memory, and the wait for them
_recording      a call's launches recorded once and replayed by later calls of its key
_buffer         ``DeviceBuffer``: what a kernel sees of an array (address and size)
_sim            whether numba runs CUDA code in its simulator
==============  ==============================================================================
"""

from __future__ import annotations

__all__ = ["Runtime", "get_runtime"]


def get_runtime():
    """The CUDA runtime of this process: one :class:`Runtime`, made on first use.

    Returns
    -------
    Runtime
        The same object for the life of the process (its state is reset in place).

    Notes
    -----
    The first call imports numba and opens the CUDA driver library, as a first call with
    CUDA arrays does; ``import moe_numba.runtime`` alone does neither.
    """
    from ._runtime import RUNTIME

    return RUNTIME


def __getattr__(name):
    if name == "Runtime":  # (its module imports numba: loaded when asked for)
        from ._runtime import Runtime

        return Runtime
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
