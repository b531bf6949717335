"""Status words the host reads back, and the wait for them.

With ``validate=True`` a call reads its status words (:mod:`moe_numba.abi`) once. The
kernel that finishes them stores them straight into pinned, device-mapped host memory, and
an event is recorded on the call's stream right after that kernel. The host waits for that
event only, so the rest of the call's work (the row copies) keeps running after the call
returns, exactly as with ``validate=False``; if the words report an error the call raises
and its outputs are dropped (stream-ordered allocators reuse them only after the kernels).

Host blocks and their events are pooled per device (:class:`._runtime.Runtime` holds the
pools); a block goes back to its pool when its words have been read, so concurrent calls
(other threads, other streams) never share one.
Under the CUDA simulator the words are a NumPy array (simulated kernels run at launch).
"""

from __future__ import annotations

import ctypes

import numpy as np

from ._launch import optional_arg
from ._runtime import RUNTIME
from ._sim import SIM

if not SIM:
    from cuda.bindings import driver as _driver

_WORDS = 8  # int64 words per block: the longest status of abi


def driver_call(call, *args):
    """Call a cuda-bindings driver function; raise on an error, return its value."""
    err, *value = call(*args)
    if err != _driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{call.__name__} failed: {err}")
    return value[0] if value else None


class HostBlock:
    """``n`` pinned host words (default: a status's) that the device can load and store
    through its mapped address ``ptr``, and an event (one device's)."""

    __slots__ = ("event", "event_handle", "host", "ptr", "words")

    def __init__(self, n=_WORDS):
        flags = _driver.CU_MEMHOSTALLOC_PORTABLE | _driver.CU_MEMHOSTALLOC_DEVICEMAP
        host = driver_call(_driver.cuMemHostAlloc, n * 8, flags)
        self.host = int(host)
        self.ptr = int(driver_call(_driver.cuMemHostGetDevicePointer, host, 0))
        self.words = np.ctypeslib.as_array((ctypes.c_int64 * n).from_address(self.host))
        self.event = driver_call(
            _driver.cuEventCreate, _driver.CUevent_flags.CU_EVENT_DISABLE_TIMING
        )
        self.event_handle = int(self.event)

    def free(self):
        """Give the words and the event back to the driver, once the event has passed (the
        launches recorded before it may still read or write the words)."""
        driver_call(_driver.cuEventSynchronize, self.event)
        driver_call(_driver.cuEventDestroy, self.event)
        driver_call(_driver.cuMemFreeHost, self.host)


class StatusWords:
    """Where one call's kernels write ``n`` status words, and how the host gets them.

    Parameters
    ----------
    launch : Launcher
        The call's launcher (its device and stream).
    n : int
        Number of int64 words.

    Notes
    -----
    Pass :attr:`arg` as the kernels' status pointer, call :meth:`written` right after
    launching the last kernel that writes a word, then :meth:`read` once.
    """

    __slots__ = ("_block", "_n", "_pool", "_stream", "arg")

    def __init__(self, launch, n):
        self._n = n
        if SIM:
            self._block = self._pool = self._stream = None
            self.arg = np.full(n, -2, np.int64)
            return
        self._pool = RUNTIME.status_pools.setdefault(launch.device, [])
        self._block = self._pool.pop() if self._pool else HostBlock()
        self._stream = launch.handle
        self.arg = self._block.ptr

    def written(self):
        """Mark the point on the stream after which the words are final."""
        if not SIM:
            driver_call(_driver.cuEventRecord, self._block.event, self._stream)

    def read(self):
        """Wait until the words are final; return a copy of them."""
        RUNTIME.status_reads += 1
        if SIM:
            return self.arg.copy()
        block = self._block
        driver_call(_driver.cuEventSynchronize, block.event)
        words = block.words[: self._n].copy()
        self._pool.append(block)
        return words


def status_arg(status):
    """The argument for a kernel's status pointer: the words of ``status`` (a
    :class:`StatusWords`), or a null pointer for a call without them."""
    return optional_arg(None, np.int64) if status is None else status.arg
