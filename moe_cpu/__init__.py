"""moe_cpu: the Cython/OpenMP CPU backend of moe-numba.

The public API (``moe_numba.moe_permute`` / ``moe_unpermute``) validates the metadata,
allocates the outputs and calls :func:`permute` / :func:`unpermute` on NumPy arrays. Every
parallel loop uses :func:`get_num_threads` threads and gives the same bits with any count.

This package imports nothing of ``moe_numba``. What the two exchange besides arrays is in
:data:`STATUS_SLOTS` (the slot of each status word the backends fill) and :data:`DATA_TYPES`
(the codes of the element types ``unpermute`` combines); ``moe_numba`` checks at import that
they equal its own table.
"""

from moe_cpu import _backward, _permute, _unpermute
from moe_cpu._backward import permute_backward_probs, unpermute_backward
from moe_cpu._memory import cache_info, empty, empty_cache
from moe_cpu._parallel import get_num_threads, openmp_enabled, set_num_threads
from moe_cpu._permute import permute
from moe_cpu._unpermute import unpermute

STATUS_SLOTS = {**_permute.STATUS_SLOTS, **_unpermute.STATUS_SLOTS, **_backward.STATUS_SLOTS}
DATA_TYPES = dict(_unpermute.DATA_TYPES)

__all__ = [
    "DATA_TYPES",
    "STATUS_SLOTS",
    "cache_info",
    "empty",
    "empty_cache",
    "get_num_threads",
    "openmp_enabled",
    "permute",
    "permute_backward_probs",
    "set_num_threads",
    "unpermute",
    "unpermute_backward",
]
