"""moe_cpu: the Cython/OpenMP CPU backend of moe-numba.

The public API (``moe_numba.moe_permute`` / ``moe_unpermute``) validates the metadata,
allocates the outputs and calls :func:`permute` / :func:`unpermute` on NumPy arrays. Every
parallel loop uses :func:`get_num_threads` threads and gives the same bits with any count.
"""

from moe_cpu._backward import permute_backward_probs, unpermute_backward
from moe_cpu._memory import cache_info, empty, empty_cache
from moe_cpu._parallel import copy_rows, get_num_threads, openmp_enabled, set_num_threads
from moe_cpu._permute import permute
from moe_cpu._unpermute import unpermute

__all__ = [
    "cache_info",
    "empty",
    "empty_cache",
    "copy_rows",
    "get_num_threads",
    "openmp_enabled",
    "permute",
    "permute_backward_probs",
    "set_num_threads",
    "unpermute",
    "unpermute_backward",
]
