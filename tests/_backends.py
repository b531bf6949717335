"""Array kinds under test: how to move a NumPy array there and back."""

from __future__ import annotations

import importlib.util
import os

from moe_numba._transfer import to_device, to_host


class Backend:
    """A kind of array a user may pass (``library`` as understood by ``to_device``)."""

    name = library = "?"
    small = False  # the CUDA simulator runs ~0.4 ms per thread: keep its shapes tiny
    exact_fma = True  # the simulator's cuda.fma rounds twice
    supports_float8 = True
    simulated = False  # runs only where NUMBA_ENABLE_CUDASIM=1
    needs_gpu = False  # runs only on a real CUDA GPU

    def to_device(self, x):
        return to_device(x, self.library)

    def to_host(self, x):
        return to_host(x)

    def __repr__(self):
        return self.name


class CPU(Backend):
    name = library = "cpu"

    def to_device(self, x):
        return x


class Simulator(Backend):
    name, library = "cudasim", "numba"
    small = True
    exact_fma = False
    simulated = True


class NumbaDevice(Backend):
    name = library = "numba"
    needs_gpu = True


class Torch(Backend):
    name = library = "torch"
    needs_gpu = True


class Cupy(Backend):
    name = library = "cupy"
    needs_gpu = True
    supports_float8 = False  # CuPy has no float8 dtype


BACKENDS = {b.name: b for b in (CPU(), Simulator(), NumbaDevice(), Torch(), Cupy())}


def simulator_on():
    """Whether this process runs numba's CUDA simulator (numba reads the variable at import)."""
    return os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def examples(n, parts=1):
    """Hypothesis examples for a random test that draws ``n`` on the CPU and on a GPU: a
    third in the simulator's process, whose kernels run every thread in Python (its draws
    are tiny shapes; the GPU runs draw all ``n`` at real sizes). ``parts``: the test is
    parametrized into that many, which share the draws (so that pytest-xdist can spread
    them, and with them the GPU kernels each part compiles, over its workers)."""
    total = max(10, n // 3) if simulator_on() else n
    return max(1, -(-total // parts))


def available_backends():
    """``cpu``, plus the simulator where it is on, or every GPU kind whose library imports
    where a GPU is usable."""
    names = ["cpu"]
    if simulator_on():
        return names + ["cudasim"]
    if importlib.util.find_spec("numba") is None:
        return names
    from numba import cuda

    if cuda.is_available():
        names.append("numba")
        names += [lib for lib in ("torch", "cupy") if importlib.util.find_spec(lib)]
    return names
