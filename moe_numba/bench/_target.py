"""Where the bench and the demo run: the CPU with NumPy arrays, or a GPU with the arrays of
one library (torch, else CuPy, else numba).

Every choice that depends on the array library is made in this module, nowhere else in the
bench or the demo: finding a usable library, moving NumPy arrays there and back, waiting
for the GPU and the copy that serves as the roofline.
"""

from __future__ import annotations

import numpy as np


def _half(nbytes):
    """Bytes a copy reads (and writes) to move ``nbytes`` in all."""
    return -(-nbytes // 2)


class NoGPUError(LookupError):
    """``--backend cuda`` was asked for and no array library sees a GPU."""


class CpuTarget:
    """NumPy arrays on the Cython/OpenMP backend."""

    device = "cpu"

    def __init__(self):
        import moe_cpu

        threads = moe_cpu.get_num_threads()
        self.description = (
            f"cpu (NumPy arrays, Cython/OpenMP, {threads} thread{'' if threads == 1 else 's'}, "
            f"OpenMP {'on' if moe_cpu.openmp_enabled() else 'off'})"
        )

    @staticmethod
    def upload(x):
        """``x`` itself: the CPU backend takes NumPy arrays."""
        return x

    @staticmethod
    def to_host(x):
        """``x`` as a NumPy array."""
        return np.asarray(x)

    @staticmethod
    def synchronize():
        """Nothing to wait for: CPU calls return when they are done."""

    @staticmethod
    def copier(nbytes):
        """A call that moves ``nbytes`` bytes (reads half of them, writes the other half)
        with moe_cpu's parallel copy: the CPU roofline."""
        from moe_cpu._parallel import copy_rows

        source = np.ones(_half(nbytes), np.uint8)
        target = np.empty_like(source)
        return lambda: copy_rows(source, target)


class CudaTarget:
    """CUDA arrays of one library on the current GPU.

    Parameters
    ----------
    library : str
        ``"torch"``, ``"cupy"`` or ``"numba"``.
    """

    device = "cuda"

    def __init__(self, library):
        self.library = library
        self.description = f"cuda ({library} arrays, numba.cuda kernels)"

    def upload(self, x):
        """A copy of NumPy array ``x`` on the GPU (None stays None)."""
        from .._transfer import to_device

        return None if x is None else to_device(x, self.library)

    @staticmethod
    def to_host(x):
        """A NumPy copy of GPU array ``x``."""
        from .._transfer import to_host

        return to_host(x)

    @staticmethod
    def synchronize():
        """Wait for all work on the GPU."""
        from numba import cuda

        cuda.synchronize()

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
    """The target of ``--backend`` (``"cpu"``, ``"cuda"`` or ``"auto"``).

    Raises
    ------
    NoGPUError
        If ``backend`` is ``"cuda"`` and no library sees a usable GPU.
    """
    if backend != "cpu":
        from .._transfer import gpu_library

        library = gpu_library()
        if library is not None:
            return CudaTarget(library)
        if backend == "cuda":
            raise NoGPUError("no usable GPU: none of torch, CuPy, numba.cuda sees one")
    return CpuTarget()
