"""A kernel that holds a stream until the host lets it go (for timing GPU work).

Timing a batch of calls between two CUDA events measures host time too when the GPU runs
dry: the host needs tens of microseconds to enqueue a call, and the first call of a batch
starts only once the host has enqueued its first kernel. Launched before the start event,
:class:`Hold` keeps the stream busy until the host has enqueued the whole batch and calls
:meth:`Hold.release`, so the events time the GPU work alone (the "blocking kernel" of
NVIDIA's nvbench). Host time per call is measured on its own (``bench``'s ``host us``).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64
from numba.cuda import types

from ._launch import SIM, Launcher, RawKernel, jit
from ._primitives import device

if not SIM:
    from llvmlite import ir
    from numba.cuda.extending import intrinsic

    @intrinsic
    def _read_volatile(typingctx, ptr):
        """``ld.volatile.global.u32`` of ``ptr[0]``: an asm statement with side effects, so
        the compiler neither caches the value nor hoists the load out of a loop (a plain or
        ``ld.cv`` load was hoisted, and the spin never saw the host's write)."""
        sig = types.int32(ptr)

        def codegen(context, builder, sig, args):
            i64 = ir.IntType(64)
            fnty = ir.FunctionType(ir.IntType(32), [i64])
            asm = ir.InlineAsm(fnty, "ld.volatile.global.u32 $0, [$1];", "=r,l", side_effect=True)
            return builder.call(asm, [builder.ptrtoint(args[0], i64)])

        return sig, codegen

    @device
    def _pause():
        cuda.nanosleep(1000)

else:

    @device
    def _read_volatile(flag):
        return flag[0]

    @device
    def _pause():
        pass


def _hold_body(flag, spins):
    """Spin until ``flag[0] != 0``; after ``spins`` pauses of about 1 us, give up and set
    ``flag[1] = 1``."""
    if cuda.threadIdx.x == 0 and cuda.blockIdx.x == 0:
        n = int64(0)
        while _read_volatile(flag) == 0:
            if n == spins:
                flag[1] = 1
                return
            n += 1
            _pause()


_SIGNATURE = types.void(types.CPointer(types.int32), types.int64)
_KERNEL = RawKernel(jit(_hold_body), _SIGNATURE, "hold")


def kernels():
    """(name, python function, signature) of this module's kernel (for the PTX test)."""
    return [("hold", _hold_body, _SIGNATURE)]


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
        Launcher(0)(_KERNEL, 1, 32, (self._arg, self._spins))

    def release(self):
        """Let the held stream go (the kernel sees the flag within a microsecond or so)."""
        self._flag[0] = 1

    def finished(self):
        """Call after the stream has passed the hold: counts a timeout, if there was one."""
        if self._flag[1]:
            self.timed_out += 1
