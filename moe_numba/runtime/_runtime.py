"""The runtime's state: one :class:`Runtime` per process holds what launches keep between calls.

================  ===============================================================  ==========
attribute         what it holds                                                    reset()
================  ===============================================================  ==========
``driver``        the launcher over libcuda (:class:`._driver.DriverLauncher`)     kept
                  with its launch configurations, or None (``cuda.core``)          (configs
                                                                                   forgotten)
``griddep``       per device: may its launches overlap (:mod:`._launch`)           forgotten
``streams``,      ``cuda.core`` streams and launch configurations (the launches    forgotten
``configs``       without the driver)
``staged_pools``  pinned blocks of staged values, per device and size              freed
                  (:mod:`._staged`)
``status_pools``  pinned blocks of status words, per device (:mod:`._status`)      freed
``kept``          pinned blocks of values that a CUDA graph reads at every         kept
                  replay (:func:`._staged.kept_words`)
================  ===============================================================  ==========

The runtime's modules read these attributes on every call: attributes of the one instance,
which is never replaced (its state is reset in place), so a launch calls no function for
them. Nothing else writes them. :meth:`Runtime.reset` is one of the clears of
``moe_numba.clear``, and :meth:`Runtime.use_driver` swaps the driver for a test's stand-in.
Models: CuPy's memory pools (``free_all_blocks``, ``set_pinned_memory_allocator``) and
numba-cuda's context.
"""

from __future__ import annotations

from contextlib import contextmanager

from .._cache import BoundedCache, clear, on_clear
from ._driver import DriverLauncher, c_launcher, driver_launcher
from ._sim import SIM

# the attributes that reset() forgets and use_driver() sets aside: (name, its empty value)
_STATE = (
    ("griddep", dict),
    ("streams", dict),
    ("configs", lambda: BoundedCache(4096)),  # (grids vary with the token count)
    ("staged_pools", dict),
    ("status_pools", dict),
    ("kept", dict),
)


class Runtime:
    """The CUDA runtime's state in this process: its driver, launch configurations, pinned
    pools and status words (the table of :mod:`moe_numba.runtime._runtime`).

    Get the one instance with :func:`moe_numba.runtime.get_runtime`.

    Attributes
    ----------
    driver : DriverLauncher or None
        What launches the kernels: the CUDA driver's ``cuLaunchKernelEx`` (through ctypes, or
        the package's C extension), or None where libcuda cannot be opened that way
        (``cuda.core.launch`` then). None in the CUDA simulator.
    status_reads : int
        How many times a call has waited for its status words (a host sync each, with
        ``validate=True``) since the process started: a figure for tests and tools (two
        threads that read at the same moment may count once).
    """

    __slots__ = ("driver", "status_reads", *(name for name, _ in _STATE))

    def __init__(self, driver):
        self.driver = driver
        self.status_reads = 0
        self._empty()

    def _empty(self):
        for name, empty in _STATE:
            setattr(self, name, empty())

    def reset(self):
        """Forget the launch configurations and the devices' capabilities, and free the
        pooled pinned blocks (the next calls make them again).

        A pooled block of staged values is freed once the launches that read it have passed
        (this waits for them); a pooled block of status words has been read already. Kept:
        the driver, and the pinned blocks of values kept for CUDA graphs: a graph captured
        earlier may replay at any later time and read them at every replay, and nothing
        tells the runtime when the graph is destroyed. They are neither freed nor forgotten
        (a later capture of the same values reads the same block).

        ``moe_numba.clear()`` calls this. Call it between calls: a block that a call in
        another thread holds meanwhile is given back to a pool that is no longer kept, and
        is then never freed.
        """
        blocks = [*self.staged_pools.values(), *self.status_pools.values()]
        kept = self.kept
        self._empty()
        self.kept = kept
        if self.driver is not None:
            self.driver.forget_configs()
        for pool in blocks:
            while pool:
                pool.pop().free()

    @contextmanager
    def use_driver(self, libcuda, c_launch=None):
        """Launch through ``libcuda`` inside the ``with`` block: a test's stand-in for the
        CUDA driver, or None for ``cuda.core``.

        Parameters
        ----------
        libcuda : object or None
            The driver library as ctypes opens it (``ctypes.CDLL("libcuda.so.1")``), or an
            object with the same functions (``cuLaunchKernelEx``, ``cuGetErrorString``,
            ``cuCtxGetDevice``, ``cuDeviceGetAttribute``, ``cuEventQuery``,
            ``cuEventRecord``: ctypes function pointers or callbacks); None launches
            through ``cuda.core``.
        c_launch : bool or None
            Whether the package's C extension packs and calls the launches (True), ctypes
            (False), or as by default (None: the extension where it is built, unless
            ``MOE_NUMBA_C_LAUNCH=0``).

        Yields
        ------
        Runtime
            This runtime, its :attr:`driver` the new one.

        Raises
        ------
        TypeError
            For a ``c_launch`` that is not a bool or None.

        Notes
        -----
        The block starts with nothing that the runtime kept for the other driver (its
        state is set aside and comes back after the block), and the library's caches
        are cleared on the way in and out (``moe_numba.clear()``): launch plans and
        recorded calls hold the driver's function addresses. The runtime is the process's:
        swap its driver between calls, not while another thread launches. The simulator
        launches through numba, whatever the driver.
        """
        if c_launch is not None and type(c_launch) is not bool:
            raise TypeError(f"c_launch must be a bool or None; got {c_launch!r}")
        if c_launch is None:
            extension = c_launcher()
        elif c_launch:
            from . import _driver_c as extension
        else:
            extension = None
        driver = None if libcuda is None else DriverLauncher(libcuda, extension)
        saved = (self.driver, *(getattr(self, name) for name, _ in _STATE))
        self._empty()
        self.driver = driver
        clear()
        try:
            yield self
        finally:
            try:
                clear()  # (this runtime's reset too: the blocks made in the block are freed)
            finally:
                self.driver = saved[0]
                for (name, _), value in zip(_STATE, saved[1:], strict=True):
                    setattr(self, name, value)


RUNTIME = Runtime(None if SIM else driver_launcher())
on_clear(RUNTIME.reset)
