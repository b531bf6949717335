"""The GPU backend: numba.cuda kernels for moe_permute / moe_unpermute / moe_sort_chunks and
the gradients.

==================  ==========================================================================
module              what it holds
==================  ==========================================================================
permute             moe_permute's host planner: geometry, scratch layout, launches (``run``)
count               stage 1 of permute: which slots count, per-chunk counts, slot ranks
scan                stage 2 of permute: chunk bases, expert offsets and padding, status words
gather              stage 3 of permute: place each slot's row, copy rows, zero padding
unpermute           moe_unpermute's host planner (``run``)
check               unpermute's value checks (``validate=True``): init and check
combine             unpermute's combine: each token's rows folded into its output row
permute_backward    moe_permute_backward's host planner: unpermute's, counted slots (``run``)
unpermute_backward  moe_unpermute_backward's host planner (``run``)
owner               unpermute_backward's stage 1: each row's (token, expert) pair, no atomics
scatter             unpermute_backward's stage 2: dY rows to their rows, dot products, zeros
sort_chunks         moe_sort_chunks: its plan and copy kernels and its host planner (``run``)
_family             ``KernelFamily``: each kernel's parameters, body and variants, declared once
_settings           ``Settings``: the tunables the planners read, and the launch plans' caches
_intrinsics         every device function that differs between a GPU and the simulator
_primitives         device helpers built on the intrinsics (status words, a warp's search)
_copy               word widths of row copies and their load/store helpers
_convert            float32 <-> bfloat16 / float16 bit conversions
==================  ==========================================================================

The host planners take the call's plan and a NamedTuple of
:class:`~moe_numba.runtime._buffer.DeviceBuffer` (addresses and sizes, never library
objects), an ``alloc(nbytes)`` callable for stream-ordered scratch memory and a raw
``CUstream`` handle; they enqueue the kernels through the CUDA runtime package
(:mod:`moe_numba.runtime`: launchers, launch sequences, staged values, status words) and
return without synchronising. Kernels compile lazily, once per variant. Importing this
package compiles nothing.

The tunables (block sizes, split thresholds) are one frozen :class:`Settings`, read with
:func:`settings` and changed for a ``with`` block by :func:`use_settings` (tests shrink the
blocks for the simulator; tools sweep a threshold): the launch plans follow it.
"""

from ._settings import Settings, settings, use_settings

__all__ = ["Settings", "families", "settings", "use_settings"]


def families():
    """Every :class:`~._family.KernelFamily` the library launches (permute's, unpermute's,
    then sort_chunks's, then those of the gradients)."""
    from . import permute, permute_backward, sort_chunks, unpermute, unpermute_backward

    return (
        permute.FAMILIES
        + unpermute.FAMILIES
        + sort_chunks.FAMILIES
        + permute_backward.FAMILIES
        + unpermute_backward.FAMILIES
    )
