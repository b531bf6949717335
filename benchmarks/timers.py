"""Timers: a call's time in each mode of :mod:`.records`, after warm-up, as the min, median
and max of the timed samples (:class:`.records.Figure`)."""

from __future__ import annotations

import statistics
import time

from .records import CPU_MODES, CUDA_MODES, Figure


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
        """``{"wall": microseconds per call of fn()}``, a :class:`.records.Figure`
        (``synchronizes`` is unused: every CPU call is synchronous)."""
        for _ in range(self.warmup):
            fn()
        samples = []
        for _ in range(self.repeat):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
        return {"wall": Figure.of(samples, 1e6)}


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
        """Microseconds per call of ``fn()`` in every mode, a :class:`.records.Figure` each.

        ``synchronizes``: the call waits for the GPU itself (``validate=True``), so it
        cannot be enqueued behind a held stream (see :meth:`gpu_us`).
        """
        for _ in range(self.warmup):
            fn()
        return {
            "gpu": Figure.of(self.gpu_samples(fn, synchronizes)),
            "one_call": Figure.of(self.one_call_samples(fn)),
            "host": Figure.of(self.host_samples(fn)),
            "host_busy": Figure.of(self.host_busy_samples(fn, synchronizes)),
        }

    def gpu_us(self, fn, synchronizes=False):
        """The median of :meth:`gpu_samples`."""
        return statistics.median(self.gpu_samples(fn, synchronizes))

    def one_call_us(self, fn):
        """The median of :meth:`one_call_samples`."""
        return statistics.median(self.one_call_samples(fn))

    def host_us(self, fn):
        """The median of :meth:`host_samples`."""
        return statistics.median(self.host_samples(fn))

    def host_busy_us(self, fn, synchronizes=False):
        """The median of :meth:`host_busy_samples`."""
        return statistics.median(self.host_busy_samples(fn, synchronizes))

    def gpu_samples(self, fn, synchronizes=False):
        """GPU time per call, microseconds, per batch: events around ``batch`` back-to-back
        calls, divided by it; ``repeat`` batches.

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
        return samples

    def one_call_samples(self, fn):
        """Latency of one call right after a host sync (event, call, event, sync),
        microseconds, ``repeat * batch`` times."""
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
        return samples

    def host_samples(self, fn):
        """Host time for one call to return, the GPU idle when it starts, microseconds,
        ``repeat * batch`` times."""
        samples = []
        for _ in range(self.repeat * self.batch):
            self.cuda.synchronize()
            start = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - start) * 1e6)
        self.cuda.synchronize()
        return samples

    def host_busy_samples(self, fn, synchronizes=False):
        """Host time per call with the GPU busy, microseconds, per batch: ``batch``
        back-to-back calls enqueued behind a held stream, their host time divided by it (a
        training step's calls find the GPU working on what came before them); ``repeat``
        batches.

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
            samples.append((time.perf_counter() - start) * 1e6 / self.batch)
            if not synchronizes:
                self.hold.release()
            self.cuda.synchronize()
            if not synchronizes:
                self.hold.finished()
        return samples
