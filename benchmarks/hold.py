"""A kernel that holds a stream until the host lets it go (for timing GPU work).

Timing a batch of calls between two CUDA events measures host time too when the GPU runs
dry: the host needs tens of microseconds to enqueue a call, and the first call of a batch
starts only once the host has enqueued its first kernel. Launched before the start event,
:class:`Hold` keeps the stream busy until the host has enqueued the whole batch and calls
:meth:`Hold.release`, so the events time the GPU work alone (the "blocking kernel" of
NVIDIA's nvbench). Host time per call is measured on its own (``bench``'s ``host us``).

Only the benchmark uses it; it is no part of the library's kernels.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int32, int64

from moe_numba.kernels._family import INT, KernelFamily, NoKey, ptr
from moe_numba.kernels._intrinsics import pause, read_volatile
from moe_numba.runtime._launch import Launcher


def _hold_params(key):
    """The hold kernel's parameters."""
    return [
        ("flag", ptr(int32)),  # mapped host words: [go, timed out]
        ("spins", INT),  # pauses before it gives up
    ]


def hold(flag, spins):
    """Spin until ``flag[0] != 0``; after ``spins`` pauses of about 1 us, give up and set
    ``flag[1] = 1``."""
    if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
        n = int64(0)
        while read_volatile(flag) == 0:
            if n == spins:
                flag[1] = 1
                return
            n += 1
            pause()


HOLD = KernelFamily("hold", _hold_params, lambda key: hold, lambda: [NoKey()])


class Hold:
    """Hold the legacy default stream from :meth:`start` until :meth:`release`.

    Parameters
    ----------
    timeout_s : float
        The kernel lets the stream go by itself after about this long.

    Attributes
    ----------
    timed_out : int
        How many holds ended by timing out (the host took longer than ``timeout_s`` to
        enqueue a batch: its timing then includes host time).
    """

    def __init__(self, timeout_s=2.0):
        self._spins = int(timeout_s * 1e6)
        # host memory the kernel reads: [go, timed out]
        self._flag = cuda.mapped_array(2, np.int32)
        self._arg = self._flag.device_ctypes_pointer.value
        self.timed_out = 0

    def start(self):
        """Launch the holding kernel on the legacy default stream."""
        self._flag[:] = 0
        Launcher(0)(HOLD.get(NoKey()), 1, 32, HOLD.args({"flag": self._arg, "spins": self._spins}))

    def release(self):
        """Let the held stream go (the kernel sees the flag within a microsecond or so)."""
        self._flag[0] = 1

    def finished(self):
        """Call after the stream has passed the hold: counts a timeout, if there was one."""
        if self._flag[1]:
            self.timed_out += 1
