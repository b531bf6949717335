"""Values the host hands a call's kernels through pinned, device-mapped memory.

A permute with host capacities (``tokens_per_expert``) needs them on the device. Values seen
before are read from a device copy made once (:mod:`moe_numba._gpu`); values seen for the
first time, a training step's counts, are written into a pinned host block that the kernels
load through its mapped address, with no copy and no allocation in the call. An event
recorded after the call's launches marks when the block may be written again; blocks are
pooled per device and size (:class:`._runtime.Runtime` holds the pools), and a block is
taken from its pool only when that event has passed (else a new one is made: a pool grows to
the number of calls in flight).

A CUDA graph would keep reading a block after it went back to the pool, so a stream that is
being captured never gets one (:func:`capturing`): it gets a block of its own that is never
written again or freed (:func:`kept_words`), since the graph may outlive any cache. Under the
CUDA simulator the values are a NumPy array. A recorded call's block is a value of its
replays, which stage their own (:func:`stage`, :func:`release`). Where the C launcher is
built, the block's event is queried and recorded, and a tuple written, through the C
helpers of :mod:`._driver_c` (each call of a training step pays for these).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ._buffer import DeviceBuffer
from ._recording import STAGED, Address, RecordingLauncher
from ._runtime import RUNTIME
from ._sim import SIM
from ._status import HostBlock, driver_call

if not SIM:
    from cuda.bindings import driver as _driver

_LEAST = 64  # the fewest words of a block (blocks come in powers of two from here)


def capturing(stream):
    """Whether ``stream`` (a ``CUstream`` as an int, or the launcher of a call being
    recorded) is being captured into a CUDA graph."""
    if SIM:
        return False
    if isinstance(stream, RecordingLauncher):
        stream = stream.handle
    err, status = _driver.cuStreamIsCapturing(_driver.CUstream(stream))
    if err == _driver.CUresult.CUDA_ERROR_INVALID_CONTEXT:
        # a thread without a current context (autograd's device thread before any CUDA
        # runtime call there, with the dispatcher's device guard skipped): made current as
        # the launch path makes it
        from ._launch import current_device

        current_device()
        status = driver_call(_driver.cuStreamIsCapturing, _driver.CUstream(stream))
    elif err != _driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuStreamIsCapturing failed: {err}")
    return status != _driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def kept_words(device, values):
    """The buffer of pinned, mapped host words that hold ``values`` (int64) for good: what a
    kernel captured into a CUDA graph may read at every replay of the graph. One block per
    device and distinct values (graphs are captured a few times, not per step)."""
    values = np.asarray(values, dtype=np.int64)
    key = (device, values.tobytes())
    kept = RUNTIME.kept.get(key)  # (device, values) -> their words, for good
    if kept is None:
        if SIM:
            kept = DeviceBuffer(0, values.nbytes, values.copy())
        else:
            block = _relaxed(lambda: HostBlock(max(1, values.size)))
            block.words[: values.size] = values
            kept = DeviceBuffer(block.ptr, values.nbytes)
        RUNTIME.kept[key] = kept
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
    return size, RUNTIME.staged_pools.setdefault((device, size), deque())


def _take(pool):
    """A block of ``pool`` whose event has passed, or None. The block is popped before it is
    tested, so two threads never take the same one."""
    try:
        block = pool.popleft()
    except IndexError:
        return None
    if _passed(block):
        return block
    pool.appendleft(block)
    return None


def _c_driver():
    """The driver launcher when its C helpers are built, else None (cuda-bindings then)."""
    driver = RUNTIME.driver
    return None if driver is None or driver.c is None else driver


def _passed(block):
    """Whether ``block``'s event has passed (no launch in flight reads the block)."""
    driver = _c_driver()
    if driver is not None:
        return driver.c.event_query(driver.event_query_address, block.event_handle) == 0
    return _driver.cuEventQuery(block.event)[0] == _driver.CUresult.CUDA_SUCCESS


def stage(device, values):
    """``(block, pool)``: a block of ``device`` that no launch in flight reads, holding
    ``values`` (int64: a tuple of ints, written from C where the helpers are built, or an
    array), and the pool it goes back to (:func:`release`)."""
    size, pool = _pool(device, len(values))
    block = _take(pool) or HostBlock(size)
    driver = _c_driver()
    if driver is not None and type(values) is tuple:
        driver.c.write_words(block.host, values)
    else:
        block.words[: len(values)] = values
    return block, pool


def release(block, pool, stream):
    """Mark the point on ``stream`` (a ``CUstream`` as an int) after the launches that read
    ``block``, from which it may be written again, and give it back to ``pool``."""
    driver = _c_driver()
    if driver is None:
        driver_call(_driver.cuEventRecord, block.event, stream)
    else:
        err = driver.c.event_record(driver.event_record_address, block.event_handle, stream)
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
        block, self._pool = stage(launch.device, values)
        self._block = block
        self._stream = launch.handle
        self.arg = Address(block.ptr, STAGED) if type(launch) is RecordingLauncher else block.ptr

    def release(self):
        """Mark the point on the stream after which the block may be written again."""
        if not SIM:
            release(self._block, self._pool, self._stream)
