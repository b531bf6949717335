"""Settings of the test process for numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``).

The simulator runs every GPU thread of a block as a Python thread. Two things here make it
run the suite faster and as a GPU would:

- :func:`share_arrays_safely`: the simulator gives the threads of a block one array per
  ``cuda.shared.array`` call site, made by the first thread that gets there; its check
  ("made yet?") and its make are two steps, so two threads that interleave between them each
  make an array of their own, and the block's threads then no longer share it (counts lost,
  rows placed twice). The replacement makes and records it in one step under a lock.
- :func:`switch_threads_often`: Python hands the interpreter from thread to thread every
  5 ms by default; the simulated threads mostly wait for each other at barriers, so a
  shorter interval wastes less of that time.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

SWITCH_INTERVAL = 1e-4  # seconds


def share_arrays_safely():
    """Replace the simulator's ``cuda.shared.array`` with one whose first call per call site
    and block makes the array atomically (the others wait, then get the same array)."""
    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    unchanged = kernelapi.FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic shared memory, or refused
            return unchanged(self, shape, dtype, alignment)
        caller = sys._getframe(1)  # (the kernel's line identifies its array)
        site = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            made = self._allocations.get(site)
            if made is None:
                if isinstance(dtype, types.Type):
                    dtype = numpy_support.as_dtype(dtype)
                made = self._allocations[site] = np.empty(shape, dtype)
        return made

    kernelapi.FakeCUDAShared.array = array


def switch_threads_often():
    """Let Python switch threads every :data:`SWITCH_INTERVAL` seconds."""
    sys.setswitchinterval(SWITCH_INTERVAL)
