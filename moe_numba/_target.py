"""Where the demo runs: the CPU with NumPy arrays, or a GPU with the arrays of one library
(torch, else CuPy, else numba).

Every choice that depends on the array library is made here: finding a usable library,
moving NumPy arrays there and back, waiting for the GPU. The benchmarks of the repository
(``benchmarks/target.py``) add the copy that serves as their roofline.
"""

from __future__ import annotations

import numpy as np


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
        from ._transfer import to_device

        return None if x is None else to_device(x, self.library)

    @staticmethod
    def to_host(x):
        """A NumPy copy of GPU array ``x``."""
        from ._transfer import to_host

        return to_host(x)

    @staticmethod
    def synchronize():
        """Wait for all work on the GPU."""
        from numba import cuda

        cuda.synchronize()


def choose(backend):
    """The target of ``--backend`` (``"cpu"``, ``"cuda"`` or ``"auto"``).

    Raises
    ------
    NoGPUError
        If ``backend`` is ``"cuda"`` and no library sees a usable GPU.
    """
    if backend != "cpu":
        from ._transfer import gpu_library

        library = gpu_library()
        if library is not None:
            return CudaTarget(library)
        if backend == "cuda":
            raise NoGPUError("no usable GPU: none of torch, CuPy, numba.cuda sees one")
    return CpuTarget()
