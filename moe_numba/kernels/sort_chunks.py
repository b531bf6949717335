"""moe_sort_chunks on the GPU: plan -> copy (both kernels, and the host planner ``run``).

::

    kernel   grid                          block                           launched when
    plan     1                             32 .. plan_bd, by the chunks    always
    copy     N / rows per block,           32 .. copy_bd, by the rows      N > 0
             at most copy_blocks

(the blocks in lower case are the settings', :class:`._settings.Settings`.)

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

``copy``  ``tpr`` threads per row (a power of two up to copy_bd, by the row's word count),
          rows grid-stride. A row below ``covered`` finds its output position by a binary
          search of ``out_first`` (the last i with ``out_first[i] <= r``: chunks of length 0
          share the start of the next one) and copies its source row; rows from ``covered``
          on copy the same row of x. Words are 16 bytes where the row size and both base
          addresses allow (:func:`._copy.word_width`), down to single bytes.

Both kernels are programmatic dependents (:func:`._intrinsics.griddep_wait`): plan waits for
the caller's kernels first thing, copy waits for plan's table.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import cuda, float32, int64

from .. import abi
from ..runtime._buffer import DeviceBuffer, carve
from ..runtime._launch import launcher_for, optional_arg
from ..runtime._status import StatusWords
from . import _settings
from ._copy import WIDTHS, WORD_DTYPE, WORD_TYPE, word_ops, word_width
from ._family import INDEX_TYPES, INT, KernelFamily, ptr
from ._intrinsics import TMP_WORDS, block_exclusive_scan_i64, block_min_i64, device, griddep_wait
from ._primitives import BIG, store_found

_SIZES_DTYPES = {4: np.int32, 8: np.int64}


class SizesKey(NamedTuple):
    """Variants of the plan kernel: the split sizes' integer type (int32 or int64)."""

    size_bits: int

    TAGS = ("i",)


class CopyKey(NamedTuple):
    """Variants of the copy kernel: the bytes of the words a row moves in."""

    word: int

    TAGS = ("w",)


def _plan_params(key):
    """The plan kernel's parameters (:class:`SizesKey`)."""
    return [
        ("sizes", ptr(INDEX_TYPES[key.size_bits])),  # [C] rows per chunk, any values
        ("order", ptr(int64)),  # [C] chunk at each output position
        ("table", ptr(int64)),  # out [4C + 1] scratch (the module docstring)
        ("lengths", ptr(int64)),  # out [C] rows of the chunk at each output position
        ("status", ptr(int64)),  # out: abi.SORT_* (only with validate)
        ("C", INT),
        ("N", INT),
        ("validate", INT),
    ]


def plan(sizes, order, table, lengths, status, C, N, validate):
    """One block: the chunk table (see the module docstring), the chunk length at every
    output position and, with ``validate``, the status words."""
    griddep_wait()  # (the caller's kernels)
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
            store_found(status, abi.SORT_BAD_SIZE, bad, sizes)
            store_found(status, abi.SORT_PAST_END, past, sizes)
            # chunks before the first one past the end end by row N: its first row is exact
            status[abi.SORT_PAST_END_START] = -1 if past == BIG else table[first + past]


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


def _copy_params(key):
    """The copy kernel's parameters (:class:`CopyKey`)."""
    word = ptr(WORD_TYPE[key.word])
    return [
        ("x", word),  # [N, nw] words
        ("y", word),  # out [N, nw]
        ("probs", ptr(float32)),  # [N] or null
        ("probs_y", ptr(float32)),  # out [N] or null
        ("table", ptr(int64)),  # plan's table
        ("N", INT),
        ("C", INT),
        ("nw", INT),  # words per row
        ("tpr", INT),  # threads per row
        ("has_probs", INT),
    ]


def _make_copy(key):
    """The copy kernel for words of ``key.word`` bytes."""
    ld, st = word_ops(key.word)[:2]

    def copy(x, y, probs, probs_y, table, N, C, nw, tpr, has_probs):
        griddep_wait()  # (plan's table)
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


PLAN = KernelFamily(
    "sort_plan", _plan_params, lambda key: plan, lambda: [SizesKey(b) for b in INDEX_TYPES]
)
COPY = KernelFamily("sort_copy", _copy_params, _make_copy, lambda: [CopyKey(w) for w in WIDTHS])
FAMILIES = (PLAN, COPY)


# ------------------------------------------------------------------------------------------
# host side


class SortBuffers(NamedTuple):
    """The device buffers of one ``moe_sort_chunks`` call (None where the plan has none)."""

    x: DeviceBuffer  # [N, H]
    sizes: DeviceBuffer  # [C] int32 or int64 (the plan's sizes_dtype)
    order: DeviceBuffer  # [C] int64
    probs: DeviceBuffer | None  # [N] float32
    out_y: DeviceBuffer  # [N, H]
    out_probs: DeviceBuffer | None  # [N] float32
    out_lengths: DeviceBuffer  # [C] int64


def _power_of_two(n, lowest, most):
    """The smallest power of two >= ``n`` between ``lowest`` and ``most`` (powers of two)."""
    p = lowest
    while p < most and p < n:
        p *= 2
    return p


def run(plan, buffers, validate, alloc, stream):
    """Enqueue moe_sort_chunks's kernels for one call on ``stream``.

    Parameters
    ----------
    plan : moe_numba._contract_sort.SortPlan
        The call's plan.
    buffers : SortBuffers
        The call's arrays and outputs.
    validate : bool
        Whether plan computes the status words of the sizes.
    alloc : callable
        ``alloc(nbytes) -> DeviceBuffer``: stream-ordered scratch memory (plan's table).
    stream : int or RecordingLauncher
        A ``CUstream`` handle (0: the legacy default stream), or the launcher of a call
        being recorded (:mod:`._replay`).

    Returns
    -------
    StatusWords or None
        With ``validate``: the call's status words (final once plan has run), else None.

    Notes
    -----
    Every output element is written; nothing is synchronised.
    """
    b = buffers
    s = _settings.current
    N, C, rb = plan.num_rows, plan.num_chunks, plan.row_bytes
    sizes_itemsize = plan.sizes_dtype.itemsize
    launch = launcher_for(stream)
    (table,) = carve(alloc, ((4 * C + 1, np.dtype(np.int64)),))
    status = StatusWords(launch, abi.SORT_STATUS_LEN) if validate else None
    width = word_width(rb, b.x, b.out_y)
    nw = rb // width  # 0 for rows of no bytes: only the probabilities move
    tpr = _power_of_two(nw, 1, s.copy_bd)  # threads per row
    word = WORD_DTYPE[width]
    # every argument of the call's kernels, by parameter name (each kernel takes its own)
    values = dict(
        sizes=optional_arg(b.sizes if C else None, _SIZES_DTYPES[sizes_itemsize]),
        order=optional_arg(b.order if C else None, np.int64),
        table=table,
        lengths=optional_arg(b.out_lengths if C else None, np.int64),
        status=status.arg if validate else optional_arg(None, np.int64),
        C=C,
        N=N,
        validate=1 if validate else 0,
        x=optional_arg(b.x if N else None, word),
        y=optional_arg(b.out_y if N else None, word),
        probs=optional_arg(b.probs, np.float32),
        probs_y=optional_arg(b.out_probs, np.float32),
        nw=nw,
        tpr=tpr,
        has_probs=0 if b.probs is None else 1,
    )
    launch(
        PLAN.get(SizesKey(8 * sizes_itemsize)),
        1,
        _power_of_two(C, 32, s.plan_bd),
        PLAN.args(values),
        dependent=True,
    )
    if validate:
        status.written()
    if N > 0:
        block = _power_of_two(N * tpr, 32, s.copy_bd)  # whole rows: tpr divides it
        rows_per_block = block // tpr
        grid = max(1, min(s.copy_blocks, -(-N // rows_per_block)))
        launch(COPY.get(CopyKey(width)), grid, block, COPY.args(values), dependent=True)
    return status
