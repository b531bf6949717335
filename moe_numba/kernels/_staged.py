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
replays, which stage their own (:class:`ReplayStager`, through the C helpers of
:mod:`._driver_c`: each replay of a training step pays for it).
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
            block = _relaxed(lambda: HostBlock(max(1, values.size)))
            block.words[: values.size] = values
            kept = DeviceBuffer(block.ptr, values.nbytes)
        _KEPT[key] = kept
    return kept


def _relaxed(make):
    """``make()`` in the relaxed capture mode: a stream capture of this thread (in CUDA's
    global or thread-local mode, torch's default) would be invalidated by the pinned
    allocation otherwise."""
    relaxed = _driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    mode = driver_call(_driver.cuThreadExchangeStreamCaptureMode, relaxed)
    try:
        return make()
    finally:
        driver_call(_driver.cuThreadExchangeStreamCaptureMode, mode)


def _pool(device, n):
    """The pool of blocks of at least ``n`` words on ``device``."""
    size = _LEAST
    while size < n:
        size *= 2
    return size, _POOLS.setdefault((device, size), deque())


def _take(pool, passed):
    """A block of ``pool`` that ``passed(block)`` finds free, or None. The block is popped
    before it is tested, so two threads never take the same one."""
    try:
        block = pool.popleft()
    except IndexError:
        return None
    if passed(block):
        return block
    pool.appendleft(block)
    return None


def _passed(block):
    """Whether ``block``'s event has passed (no launch in flight reads the block)."""
    return _driver.cuEventQuery(block.event)[0] == _driver.CUresult.CUDA_SUCCESS


class ReplayStager:
    """The staged capacities of the replays of one recording on ``device``: :meth:`stage`
    writes a call's counts into a free block of its pool, :meth:`release` marks the block's
    reuse after the call's launches (as :class:`StagedWords` does, with C helpers)."""

    __slots__ = ("_c", "_pools", "_query", "_record", "device")

    def __init__(self, device):
        from ._launch import _DRIVER  # (only replays, which need the C launcher, stage here)

        self.device = device
        self._c = _DRIVER.c
        self._query = _DRIVER.event_query_address
        self._record = _DRIVER.event_record_address
        self._pools = {}  # counts -> (block size, pool)

    def _passed(self, block):
        return self._c.event_query(self._query, block.event_handle) == 0

    def stage(self, counts):
        """``(block, pool)``: a block that holds ``counts`` (a tuple of ints in the int64
        range) and that no launch in flight reads, and the pool it goes back to."""
        n = len(counts)
        entry = self._pools.get(n)
        if entry is None:
            entry = self._pools[n] = _pool(self.device, n)
        size, pool = entry
        block = _take(pool, self._passed) or HostBlock(size)
        self._c.write_words(block.host, counts)
        return block, pool

    def release(self, block, pool, stream):
        """Mark the point on ``stream`` (a ``CUstream`` as an int) after the launches that
        read ``block``, from which it may be written again, and give it back to ``pool``."""
        err = self._c.event_record(self._record, block.event_handle, stream)
        if err:  # (the block is dropped: a launch in flight may read it)
            raise RuntimeError(f"cuEventRecord failed: CUDA error {err}")
        pool.append(block)


class StagedWords:
    """``values`` (int64) in a pinned, device-mapped host block for one call's kernels.

    Parameters
    ----------
    launch : Launcher
        The call's launcher (its device and stream); the stream must not be capturing.
    values : numpy.ndarray
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
        n, pool = _pool(launch.device, len(values))
        self._pool = pool
        block = _take(pool, _passed)
        self._block = block = block or HostBlock(n)
        block.words[: len(values)] = values
        self._stream = launch.handle
        self.arg = Address(block.ptr, STAGED) if type(launch) is RecordingLauncher else block.ptr

    def release(self):
        """Mark the point on the stream after which the block may be written again."""
        if not SIM:
            driver_call(_driver.cuEventRecord, self._block.event, self._stream)
            self._pool.append(self._block)
