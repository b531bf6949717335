"""Where the benchmarks run (the demo's targets, :mod:`moe_numba._target`), each with the copy
that serves as its roofline.

Every choice that depends on the array library is made in this module or in the one it
extends, nowhere else in the benchmarks.
"""

from __future__ import annotations

import numpy as np

from moe_numba import _target
from moe_numba._target import NoGPUError

__all__ = ["CpuTarget", "CudaTarget", "NoGPUError", "choose"]


def _half(nbytes):
    """Bytes a copy reads (and writes) to move ``nbytes`` in all."""
    return -(-nbytes // 2)


class CpuTarget(_target.CpuTarget):
    """NumPy arrays on the Cython/OpenMP backend, with moe_cpu's parallel copy."""

    @staticmethod
    def copier(nbytes):
        """A call that moves ``nbytes`` bytes (reads half of them, writes the other half)
        with moe_cpu's parallel copy: the CPU roofline."""
        from moe_cpu._parallel import copy_rows

        source = np.ones(_half(nbytes), np.uint8)
        target = np.empty_like(source)
        return lambda: copy_rows(source, target)


class CudaTarget(_target.CudaTarget):
    """CUDA arrays of one library on the current GPU, with a device copy.

    Parameters
    ----------
    library : str
        ``"torch"``, ``"cupy"`` or ``"numba"``.
    """

    def copier(self, nbytes):
        """A call that moves ``nbytes`` bytes (reads half of them from one GPU array, writes
        the other half to another) on the library's current stream: the GPU roofline."""
        source = self.upload(np.ones(_half(nbytes), np.uint8))
        if self.library == "torch":
            target = source.clone()
            return lambda: target.copy_(source)
        if self.library == "cupy":
            import cupy

            target = cupy.empty_like(source)
            return lambda: cupy.copyto(target, source)
        target = self.upload(np.empty(_half(nbytes), np.uint8))
        return lambda: target.copy_to_device(source)


def choose(backend):
    """The target of ``--backend`` (``"cpu"``, ``"cuda"`` or ``"auto"``), as the demo
    chooses it, with its copy.

    Raises
    ------
    NoGPUError
        If ``backend`` is ``"cuda"`` and no library sees a usable GPU.
    """
    found = _target.choose(backend)
    return CudaTarget(found.library) if found.device == "cuda" else CpuTarget()
