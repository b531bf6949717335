"""moe_unpermute_backward's owner stage: the (token, expert) pair of every row, without atomics.

::

    claim    grid-stride over the row map [T, E]: owner[r] = f for each entry f = t * E + e
             with r = rowmap[f] in [0, R) (plain stores: of several entries naming r, one
             stays, whichever)
    collide  grid-stride again: an entry f naming r that reads owner[r] != f writes
             owner[r] = DUP (plain stores, all of one value)

Afterwards a row named by one valid entry f holds f, a row named by several holds DUP (every
entry but the one that stayed writes DUP, and nothing writes an entry back), and a row named
by none holds whatever its word held: owner is not initialised. So row r has a pair, f,
exactly when ``0 <= owner[r] = f < T * E`` and ``rowmap[f] == r``: a row that no entry names
cannot pass that test, whatever its word holds. The scatter (:mod:`.scatter`) writes a
token's rows whose owner is its entry, and zeroes the rows that fail the test.

With ``want_status`` (validate) claim also readies collide's scratch, and collide finds the
smallest row named twice (a running minimum, atomic like check's) and its last block
(ticket) writes the status words ``abi.UNPERMUTE_BACKWARD_DUPLICATE_*``: that row and the
first two flat entries naming it, which the block reads off the row map when there is one.
Owner words are read from L2 (:func:`._intrinsics.load_cg`), where the other blocks' stores
are.
"""

from __future__ import annotations

from numba import cuda, int32, int64

from .. import abi
from ._family import INT, KernelFamily, NoKey, ptr
from ._intrinsics import (
    TMP_WORDS,
    atomic_add,
    atomic_min,
    block_min_i64,
    device,
    griddep_trigger,
    griddep_wait,
    load_cg,
)
from ._primitives import BIG

DUP = -2  # owner word of a row named by more than one entry

# collide's scratch words (with want_status)
_DUP_ROW, _TICKET = 0, 1


def _params(key):
    """claim's and collide's parameters."""
    return [
        ("rowmap", ptr(int32)),  # [T, E]
        ("owner", ptr(int64)),  # scratch [R]
        ("dups", ptr(int64)),  # scratch [2] (with want_status): smallest row named twice, ticket
        ("status", ptr(int64)),  # out (collide, with want_status): abi.UNPERMUTE_BACKWARD_*
        ("TE", INT),  # T * E
        ("R", INT),
        ("want_status", INT),
    ]


@device
def _grid_place():
    """(first index, stride) of the calling thread in a grid-stride loop."""
    bd = int64(cuda.blockDim.x)
    return int64(cuda.blockIdx.x) * bd + int64(cuda.threadIdx.x), int64(cuda.gridDim.x) * bd


def claim(rowmap, owner, dups, status, TE, R, want_status):
    """owner[r] = f for the valid entries f of the row map (one of them where several name
    r); with ``want_status`` also collide's running minimum and ticket."""
    griddep_wait()  # (the caller's kernels, or check: collide's end implies check's)
    griddep_trigger()  # collide may launch: it waits for this kernel before it reads owner
    i, stride = _grid_place()
    if want_status != 0 and i == 0:
        dups[_DUP_ROW] = BIG
        dups[_TICKET] = 0
    while i < TE:
        r = int64(rowmap[i])
        if r >= 0 and r < R:
            owner[r] = i
        i += stride


@device
def _first_two(rowmap, TE, row, tmp):
    """The two smallest flat entries of the row map naming ``row``, found by the block (BIG
    where there is none)."""
    first = second = BIG
    i = int64(cuda.threadIdx.x)
    while i < TE:  # ascending: a thread's first two matches are its smallest
        if int64(rowmap[i]) == row:
            if first == BIG:
                first = i
            elif second == BIG:
                second = i
        i += int64(cuda.blockDim.x)
    smallest = block_min_i64(first, tmp)
    return smallest, block_min_i64(second if first == smallest else first, tmp)


def collide(rowmap, owner, dups, status, TE, R, want_status):
    """owner[r] = DUP for each row named by more than one valid entry; with ``want_status``
    the last block writes the status words of the smallest such row."""
    griddep_trigger()  # the scatter may launch: it loads its first rows before it waits
    tmp = cuda.shared.array(TMP_WORDS, int64)
    last = cuda.shared.array(1, int64)
    i, stride = _grid_place()
    found = BIG
    griddep_wait()  # (claim's owner words)
    while i < TE:
        r = int64(rowmap[i])
        if r >= 0 and r < R and load_cg(owner, r) != i:
            owner[r] = DUP
            found = min(found, r)
        i += stride
    if want_status != 0:
        found = block_min_i64(found, tmp)
        nb = int64(cuda.gridDim.x)
        if cuda.threadIdx.x == 0:
            if found != BIG:
                atomic_min(dups, _DUP_ROW, found)
            cuda.threadfence()
            last[0] = 1 if atomic_add(dups, _TICKET, 1) == nb - 1 else 0
        cuda.syncthreads()
        if last[0] != 0:  # every block has folded its minimum in
            cuda.threadfence()
            row = atomic_min(dups, _DUP_ROW, BIG)
            first = second = int64(-1)
            if row != BIG:
                first, second = _first_two(rowmap, TE, row, tmp)
            if cuda.threadIdx.x == 0:
                status[abi.UNPERMUTE_BACKWARD_DUPLICATE_ROW] = -1 if row == BIG else row
                status[abi.UNPERMUTE_BACKWARD_DUPLICATE_FIRST] = first
                status[abi.UNPERMUTE_BACKWARD_DUPLICATE_SECOND] = second


CLAIM = KernelFamily("claim", _params, lambda key: claim, lambda: [NoKey()])
COLLIDE = KernelFamily("collide", _params, lambda key: collide, lambda: [NoKey()])
