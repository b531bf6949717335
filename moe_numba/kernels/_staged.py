"""Values the host hands a call's kernels through pinned, device-mapped memory.

A permute with host capacities (``tokens_per_expert``) needs them on the device. Values seen
before are read from a device copy made once (:mod:`moe_numba._gpu`); values seen for the
first time, a training step's counts, are written into a pinned host block that the kernels
load through its mapped address, with no copy and no allocation in the call. An event
recorded after the call's launches marks when the block may be written again; blocks are
pooled per device and size, and a block is taken from its pool only when that event has
passed (else a new one is made: a pool grows to the number of calls in flight).

A CUDA graph would keep reading a block after it went back to the pool, so a stream that is
being captured never gets one (:func:`capturing`): it gets a block of its own that is never
written again or freed (:func:`kept_words`), since the graph may outlive any cache. Under the
CUDA simulator the values are a NumPy array. A recorded call's block is a value of its
replays, which stage their own (:mod:`._replay`).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ._buffer import DeviceBuffer
from ._intrinsics import SIM
from ._replay import STAGED, Address, RecordingLauncher
from ._status import HostBlock, driver_call

if not SIM:
    from cuda.bindings import driver as _driver

_POOLS: dict[tuple[int, int], deque[HostBlock]] = {}
_LEAST = 64  # the fewest words of a block (blocks come in powers of two from here)
_KEPT: dict[tuple[int, bytes], DeviceBuffer] = {}  # (device, values) -> their words, for good


def capturing(stream):
    """Whether ``stream`` (a ``CUstream`` as an int, or the launcher of a call being
    recorded) is being captured into a CUDA graph."""
    if SIM:
        return False
    if isinstance(stream, RecordingLauncher):
        stream = stream.handle
    status = driver_call(_driver.cuStreamIsCapturing, _driver.CUstream(stream))
    return status != _driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def kept_words(device, values):
    """The buffer of pinned, mapped host words that hold ``values`` (int64) for good: what a
    kernel captured into a CUDA graph may read at every replay of the graph. One block per
    device and distinct values (graphs are captured a few times, not per step)."""
    values = np.asarray(values, dtype=np.int64)
    key = (device, values.tobytes())
    kept = _KEPT.get(key)
    if kept is None:
        if SIM:
            kept = DeviceBuffer(0, values.nbytes, values.copy())
        else:
            block = HostBlock(max(1, values.size))
            block.words[: values.size] = values
            kept = DeviceBuffer(block.ptr, values.nbytes)
        _KEPT[key] = kept
    return kept


class StagedWords:
    """``values`` (int64) in a pinned, device-mapped host block for one call's kernels.

    Parameters
    ----------
    launch : Launcher
        The call's launcher (its device and stream); the stream must not be capturing.
        Anything with the ``device`` and ``handle`` of a launcher will do.
    values : numpy.ndarray or list of int
        The int64 values.

    Notes
    -----
    Pass :attr:`arg` as the kernels' pointer, and call :meth:`release` once after the last
    launch that reads the values.
    """

    __slots__ = ("_block", "_pool", "_stream", "arg")

    def __init__(self, launch, values):
        if SIM:
            self._block = self._pool = self._stream = None
            self.arg = np.array(values, dtype=np.int64)
            return
        n = _LEAST
        while n < len(values):
            n *= 2
        pool = self._pool = _POOLS.setdefault((launch.device, n), deque())
        block = None
        if pool:
            done = _driver.cuEventQuery(pool[0].event)[0] == _driver.CUresult.CUDA_SUCCESS
            if done:
                block = pool.popleft()
        self._block = block = block or HostBlock(n)
        block.words[: len(values)] = values
        self._stream = launch.handle
        self.arg = Address(block.ptr, STAGED) if type(launch) is RecordingLauncher else block.ptr

    def release(self):
        """Mark the point on the stream after which the block may be written again."""
        if not SIM:
            driver_call(_driver.cuEventRecord, self._block.event, self._stream)
            self._pool.append(self._block)
