"""Word-wide row copies: pick the widest word for a row, and the per-width load/store helpers.

A row of ``row_bytes`` bytes is moved as ``row_bytes // W`` words of ``W`` bytes, where ``W``
is the widest of 16, 8, 4, 2, 1 that divides the row size and every base address involved.
Kernels that copy rows are built per width by a factory that closes over the helpers below
(numba freezes closure variables, so each width compiles to its own straight-line code).
"""

from __future__ import annotations

import numpy as np
from numba.cuda import types

from ._intrinsics import device, ld16, st16, st16_streaming

WIDTHS = (16, 8, 4, 2, 1)

# element type a kernel parameter carries for each word width (16-byte words travel as
# pairs of uint64)
WORD_TYPE = {16: types.uint64, 8: types.uint64, 4: types.uint32, 2: types.uint16, 1: types.uint8}
WORD_DTYPE = {16: np.uint64, 8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}


def word_width(row_bytes, *buffers, widths=WIDTHS):
    """The widest of ``widths`` (powers of two, falling) that divides ``row_bytes`` and the
    address of every given buffer (None entries are skipped); 1 if none does."""
    bits = row_bytes
    for b in buffers:
        if b is not None:
            bits |= b.ptr  # a power of two divides every value iff it divides their OR
    for width in widths:
        if bits % width == 0:
            return width
    return 1


def row_parts(T, words, target, least, unit=1):
    """(parts, words per part) of a row of ``words`` words when ``T`` rows share the work
    out among about ``target`` workers: one part for ``target`` rows or more, else as many as
    reach it with at least ``least`` words each. A part is a multiple of ``unit`` words (so
    that parts start on a whole worker's words); the last part holds what is left."""
    parts = max(1, min(words // least, -(-target // max(T, 1))))
    if parts == 1:
        return 1, words
    per = -(-words // parts)
    per = -(-per // unit) * unit
    return -(-words // per), per


@device
def _ld16(p, i):
    return ld16(p, i)


def _stores16(put):
    """(store, store_zero) of 16-byte words through ``put`` (a plain or streaming store)."""

    @device
    def store(p, i, v):
        put(p, i, v[0], v[1])

    @device
    def store_zero(p, i):
        put(p, i, np.uint64(0), np.uint64(0))

    return store, store_zero


_st16, _stz16 = _stores16(st16)
_st16s, _stz16s = _stores16(st16_streaming)


@device
def _ld(p, i):
    return p[i]


@device
def _st(p, i, v):
    p[i] = v


@device
def _stz(p, i):
    p[i] = 0


def word_ops(width, streaming=False):
    """(load, store, store_zero) device functions for words of ``width`` bytes; with
    ``streaming``, 16-byte words are stored with the streaming cache hint
    (:func:`._intrinsics.st16_streaming`; narrower words, from odd rows, are stored
    plainly)."""
    if width == 16:
        return (_ld16, _st16s, _stz16s) if streaming else (_ld16, _st16, _stz16)
    return _ld, _st, _stz


def batch_ops(width, n, streaming=False):
    """(load, store) device functions that move ``n`` words per thread at once.

    ``load(src, base, w, count, step, lo, hi)`` reads words ``w, w + step, ...`` of the
    ``count`` words at ``src[base:]`` into the thread's arrays ``lo`` (and ``hi``: the upper
    halves of 16-byte words; unused otherwise), clamping indices to the last word so that
    all ``n`` loads are in flight together; ``store(dst, base, w, count, step, lo, hi)``
    writes back those below ``count``. ``lo`` and ``hi`` are ``cuda.local.array(n, ...)``
    of :data:`WORD_TYPE` ``[width]`` and uint64 (the loops unroll, the arrays live in
    registers). ``streaming`` as for :func:`word_ops`.
    """
    if width == 16:
        put = st16_streaming if streaming else st16

        @device
        def load(src, base, w, count, step, lo, hi):
            last = base + count - 1
            for u in range(n):
                v = ld16(src, min(base + w + u * step, last))
                lo[u] = v[0]
                hi[u] = v[1]

        @device
        def store(dst, base, w, count, step, lo, hi):
            for u in range(n):
                if w + u * step < count:
                    put(dst, base + w + u * step, lo[u], hi[u])

    else:

        @device
        def load(src, base, w, count, step, lo, hi):
            last = base + count - 1
            for u in range(n):
                lo[u] = src[min(base + w + u * step, last)]

        @device
        def store(dst, base, w, count, step, lo, hi):
            for u in range(n):
                if w + u * step < count:
                    dst[base + w + u * step] = lo[u]

    return load, store
