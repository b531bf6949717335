"""Whether numba runs CUDA code in its simulator (``NUMBA_ENABLE_CUDASIM``, read once at numba's
import): the runtime launches through numba's dispatcher there, and the kernels use the
simulator's stand-ins for the intrinsics it lacks."""

from numba import config

SIM = bool(config.ENABLE_CUDASIM)
