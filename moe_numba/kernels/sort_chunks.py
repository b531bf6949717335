"""moe_sort_chunks on the GPU: plan -> copy.

``plan``  one block. Pass 1 over the chunks (tiles of the block, one block scan each): the
          first input row and length of every chunk, with the contract's rule for bad
          sizes (a negative size counts as 0; chunks are cut at row N); with ``validate``
          also the status words (first negative size, first chunk past the end), stored
          straight to the host (:mod:`._status`). Pass 2 over the output positions: the
          first output row and the length (an output of the op) of each. Table (int64,
          scratch)::

              [0, C)    src_first[i]   first row of x of the chunk at output position i
              [C, 2C)   out_first[i]   its first row in y (non-decreasing in i)
              [2C, 4C)  per chunk index: first row, length (pass 1's results)
              [4C]      covered: rows of y that come from chunks (<= N)

``copy``  ``tpr`` threads per row (a power of two up to 128, by the row's word count), rows
          grid-stride. A row below ``covered`` finds its output position by a binary search
          of ``out_first`` (the last i with ``out_first[i] <= r``: chunks of length 0 share
          the start of the next one) and copies its source row; rows from ``covered`` on
          copy the same row of x. Words are 16 bytes where the row size and both base
          addresses allow (:func:`._copy.word_width`), down to single bytes.

Both kernels are programmatic dependents (:mod:`._griddep`): plan waits for the caller's
kernels first thing, copy waits for plan's table.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int64
from numba.cuda import types

from .. import _abi
from . import _griddep as griddep
from ._buffer import carve
from ._copy import WIDTHS, WORD_DTYPE, WORD_TYPE, word_ops, word_width
from ._launch import SIM, Launcher, RawKernel, jit, optional_arg
from ._primitives import BIG, TMP_WORDS, block_exclusive_scan_i64, block_min_i64, device
from ._status import StatusWords

PLAN_BD = 32 if SIM else 1024  # threads of the plan block
COPY_BD = 32 if SIM else 128  # threads of a copy block
MAX_TPR = COPY_BD  # most threads per row
COPY_BLOCKS = 1 << 16  # most copy blocks (grid-stride beyond)

P = types.CPointer
_I = types.int64
_RT = {4: types.int32, 8: types.int64}


def _plan_body(sizes, order, table, lengths, status, C, N, validate):
    """One block: the chunk table (see the module docstring), the chunk length at every
    output position and, with ``validate``, the status words."""
    griddep.wait()  # (the caller's kernels)
    tmp = cuda.shared.array(TMP_WORDS, int64)
    tid = int64(cuda.threadIdx.x)
    bd = int64(cuda.blockDim.x)
    first = 2 * C
    count = 3 * C
    carry = int64(0)  # rows counted before this tile (sizes clamped to N + 1: no overflow)
    bad = BIG
    past = BIG
    base = int64(0)
    while base < C:  # pass 1: chunk index order
        c = base + tid
        v = int64(0)
        if c < C:
            v = int64(sizes[c])
        size = max(v, int64(0))
        counted = min(size, N + 1)
        start, total = block_exclusive_scan_i64(counted, tmp)
        start += carry
        if c < C:
            lo = min(start, N)
            table[first + c] = lo
            table[count + c] = min(start + counted, N) - lo
        mine_bad = c if c < C and v < 0 else BIG
        mine_past = c if c < C and size > N - start else BIG
        bad = min(bad, block_min_i64(mine_bad, tmp))
        past = min(past, block_min_i64(mine_past, tmp))
        carry += total
        base += bd
    cuda.syncthreads()  # pass 1's table entries are visible to the whole block
    carry = int64(0)
    base = int64(0)
    while base < C:  # pass 2: output position order
        i = base + tid
        n = int64(0)
        c = int64(0)
        if i < C:
            c = int64(order[i])
            n = table[count + c]
        at, total = block_exclusive_scan_i64(n, tmp)
        if i < C:
            table[i] = table[first + c]
            table[C + i] = carry + at
            lengths[i] = n
        carry += total
        base += bd
    if tid == 0:
        table[4 * C] = carry
        if validate != 0:
            if bad == BIG:
                status[_abi.SORT_BAD_SIZE] = -1
                status[_abi.SORT_BAD_SIZE_VALUE] = -1
            else:
                status[_abi.SORT_BAD_SIZE] = bad
                status[_abi.SORT_BAD_SIZE_VALUE] = int64(sizes[bad])
            if past == BIG:
                status[_abi.SORT_PAST_END] = -1
                status[_abi.SORT_PAST_END_SIZE] = -1
                status[_abi.SORT_PAST_END_START] = -1
            else:  # chunks before it end by row N, so its first row is exact
                status[_abi.SORT_PAST_END] = past
                status[_abi.SORT_PAST_END_SIZE] = int64(sizes[past])
                status[_abi.SORT_PAST_END_START] = table[first + past]


@device
def _position(table, C, r):
    """The last output position i with ``out_first[i] <= r`` (``out_first[0] = 0``)."""
    lo = int64(0)
    hi = C - 1
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if table[C + mid] <= r:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _make_copy(width):
    """The copy kernel body for words of ``width`` bytes."""
    ld, st = word_ops(width)[:2]

    def copy(x, y, probs, probs_y, table, N, C, nw, tpr, has_probs):
        griddep.wait()  # (plan's table)
        tid = int64(cuda.threadIdx.x)
        lane = tid % tpr
        rows_per_block = int64(cuda.blockDim.x) // tpr
        r = int64(cuda.blockIdx.x) * rows_per_block + tid // tpr
        stride = int64(cuda.gridDim.x) * rows_per_block
        covered = table[4 * C]
        while r < N:
            src = r
            if r < covered:
                i = _position(table, C, r)
                src = table[i] + r - table[C + i]
            w = lane
            while w < nw:
                st(y, r * nw + w, ld(x, src * nw + w))
                w += tpr
            if has_probs != 0 and lane == 0:
                probs_y[r] = probs[src]
            r += stride

    return copy


# ------------------------------------------------------------------------------------------
# kernels, compiled per signature on first use

_plan_jit = jit(_plan_body)
_copy_jit = {}
_KERNELS = {}
_I64P, _F32P = P(types.int64), P(types.float32)


def _plan_sig(ri):
    return types.void(P(_RT[ri]), _I64P, _I64P, _I64P, _I64P, _I, _I, _I)


def _copy_sig(width):
    wt = P(WORD_TYPE[width])
    return types.void(wt, wt, _F32P, _F32P, _I64P, *([_I] * 5))


def _kernel(name, key):
    k = _KERNELS.get((name, key))
    if k is None:
        if name == "plan":
            k = RawKernel(_plan_jit, _plan_sig(key), f"sort_plan_i{key * 8}")
        else:
            d = _copy_jit.get(key)
            if d is None:
                d = _copy_jit[key] = jit(_make_copy(key))
            k = RawKernel(d, _copy_sig(key), f"sort_copy_w{key}")
        _KERNELS[(name, key)] = k
    return k


def all_kernels():
    """Every (name, python function, signature) this module can launch (for the PTX test)."""
    out = [(f"sort_plan_i{ri * 8}", _plan_body, _plan_sig(ri)) for ri in (4, 8)]
    for width in WIDTHS:
        out.append((f"sort_copy_w{width}", _kernel("copy", width).py_func, _copy_sig(width)))
    return out


# ------------------------------------------------------------------------------------------
# host side


def _threads_per_row(words):
    tpr = 1
    while tpr < MAX_TPR and tpr < words:
        tpr *= 2
    return tpr


def sort_chunks(
    x,
    sizes,
    order,
    probs,
    *,
    num_rows,
    row_bytes,
    num_chunks,
    sizes_itemsize,
    out_y,
    out_probs,
    out_lengths,
    validate,
    alloc,
    stream,
):
    """Run moe_sort_chunks's kernels on ``stream``; see the module docstring and SPEC.md.

    ``sizes`` (int32 or int64 by ``sizes_itemsize``), ``order`` and ``out_lengths`` (int64)
    are device buffers of ``num_chunks`` entries; ``probs``/``out_probs`` may be None. Every output
    element is written; nothing is synchronised. With ``validate=True`` returns the call's
    :class:`StatusWords` (final once plan has run), else None.
    """
    N, C, rb = int(num_rows), int(num_chunks), int(row_bytes)
    launch = Launcher(stream)
    status = StatusWords(launch, _abi.SORT_STATUS_LEN) if validate else None
    (table,) = carve(alloc, ((4 * C + 1, np.dtype(np.int64)),))
    launch(
        _kernel("plan", int(sizes_itemsize)),
        1,
        PLAN_BD,
        (
            optional_arg(sizes if C else None, np.int32 if sizes_itemsize == 4 else np.int64),
            optional_arg(order if C else None, np.int64),
            table,
            optional_arg(out_lengths if C else None, np.int64),
            status.arg if validate else optional_arg(None, np.int64),
            C,
            N,
            1 if validate else 0,
        ),
        dependent=True,
    )
    if validate:
        status.written()
    if N > 0:
        width = word_width(rb, x, out_y)
        nw = rb // width  # 0 for rows of no bytes: only the probabilities move
        tpr = _threads_per_row(nw)
        rows_per_block = COPY_BD // tpr
        wd = WORD_DTYPE[width]
        launch(
            _kernel("copy", width),
            max(1, min(COPY_BLOCKS, -(-N // rows_per_block))),
            COPY_BD,
            (
                x.kernel_arg(wd),
                out_y.kernel_arg(wd),
                optional_arg(probs, np.float32),
                optional_arg(out_probs, np.float32),
                table,
                N,
                C,
                nw,
                tpr,
                0 if probs is None else 1,
            ),
            dependent=True,
        )
    return status
