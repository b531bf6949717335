"""Timers: medians, after warm-up, of a call's time in each mode of :mod:`.records`."""

from __future__ import annotations

import statistics
import time

from .records import CPU_MODES, CUDA_MODES


def _hold():
    """A new stream hold: the one place that imports the bench's holding kernel."""
    from .hold import Hold

    return Hold()


class WallTimer:
    """Wall time per call on the host (the CPU backend's one figure).

    Parameters
    ----------
    repeat : int
        Timed calls; the median is reported.
    warmup : int
        Untimed calls first.
    """

    modes = CPU_MODES

    def __init__(self, repeat, warmup=2):
        self.repeat = repeat
        self.warmup = warmup

    def time(self, fn, synchronizes=False):
        """``{"wall": median microseconds per call of fn()}`` (``synchronizes`` is unused:
        every CPU call is synchronous)."""
        for _ in range(self.warmup):
            fn()
        samples = []
        for _ in range(self.repeat):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return {"wall": statistics.median(samples) * 1e6}


class CudaTimer:
    """The three figures of a GPU call, on the legacy default stream.

    Parameters
    ----------
    repeat : int
        Timed batches in the ``gpu`` mode; the single-call modes time ``repeat * batch``
        calls each, as many as the batches hold.
    batch : int
        Calls per batch in the ``gpu`` mode.
    warmup : int
        Untimed calls before the first mode.
    cuda : module, optional
        What provides ``synchronize()`` and ``event()``, whose events have ``record()``,
        ``synchronize()`` and ``elapsed_time(stop)`` (milliseconds); ``numba.cuda`` by
        default.
    hold : object, optional
        A stream hold with ``start()``, ``release()``, ``finished()`` and ``timed_out``
        (:class:`benchmarks.hold.Hold` by default).
    """

    modes = CUDA_MODES

    def __init__(self, repeat, batch=10, warmup=3, cuda=None, hold=None):
        if cuda is None:
            from numba import cuda
        self.cuda = cuda
        self.repeat = repeat
        self.batch = batch
        self.warmup = warmup
        self.hold = _hold() if hold is None else hold

    @property
    def hold_timeouts(self):
        """How many timed batches the stream hold let go before the host released it."""
        return self.hold.timed_out

    def time(self, fn, synchronizes=False):
        """Median microseconds per call of ``fn()`` in every mode, as a dict.

        ``synchronizes``: the call waits for the GPU itself (``validate=True``), so it
        cannot be enqueued behind a held stream (see :meth:`gpu_us`).
        """
        for _ in range(self.warmup):
            fn()
        return {
            "gpu": self.gpu_us(fn, synchronizes),
            "one_call": self.one_call_us(fn),
            "host": self.host_us(fn),
            "host_busy": self.host_busy_us(fn, synchronizes),
        }

    def gpu_us(self, fn, synchronizes=False):
        """GPU time per call: events around ``batch`` back-to-back calls, divided by it.

        The batch is enqueued behind a kernel that holds the stream until the host has
        enqueued all of it, so the events time the GPU's work, not the host's time to
        enqueue it (the "blocking kernel" of NVIDIA's nvbench). A call that synchronizes
        would wait for the held stream forever, so instead one call goes ahead of the start
        event and keeps the GPU busy while the host enqueues the batch; such calls pay for
        their host work wherever the GPU waits for it.
        """
        cuda = self.cuda
        samples = []
        for _ in range(self.repeat):
            start, stop = cuda.event(), cuda.event()
            if synchronizes:
                fn()
            else:
                self.hold.start()
            start.record()
            for _ in range(self.batch):
                fn()
            stop.record()
            if not synchronizes:
                self.hold.release()
            stop.synchronize()
            if not synchronizes:
                self.hold.finished()
            samples.append(start.elapsed_time(stop) * 1e3 / self.batch)
        return statistics.median(samples)

    def one_call_us(self, fn):
        """Latency of one call right after a host sync: event, call, event, sync."""
        cuda = self.cuda
        samples = []
        for _ in range(self.repeat * self.batch):
            start, stop = cuda.event(), cuda.event()
            cuda.synchronize()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop) * 1e3)
        return statistics.median(samples)

    def host_us(self, fn):
        """Host time for one call to return, the GPU idle when it starts."""
        samples = []
        for _ in range(self.repeat * self.batch):
            self.cuda.synchronize()
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        self.cuda.synchronize()
        return statistics.median(samples) * 1e6

    def host_busy_us(self, fn, synchronizes=False):
        """Host time per call with the GPU busy: ``batch`` back-to-back calls enqueued behind
        a held stream, their host time divided by it (a training step's calls find the GPU
        working on what came before them).

        A call that synchronizes would wait for the held stream, so its batch runs without
        the hold: each call then finds the previous call's copies still running.
        """
        samples = []
        for _ in range(self.repeat):
            if not synchronizes:
                self.hold.start()
            start = time.perf_counter()
            for _ in range(self.batch):
                fn()
            samples.append((time.perf_counter() - start) / self.batch)
            if not synchronizes:
                self.hold.release()
            self.cuda.synchronize()
            if not synchronizes:
                self.hold.finished()
        return statistics.median(samples) * 1e6
