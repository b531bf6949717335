"""moe_unpermute's check stage (``validate=True`` only): the value checks, before combine.

::

    init    1 block of 32: minima[BAD_ROW] = minima[BAD_ID] = BIG, minima[TICKET] = 0
    check   grid-stride over the rowmap [T, E] and the routing map [T, K]: each block finds
            its smallest rowmap entry outside [-1, R) and routing slot outside [-1, E),
            folds them into the minima (atomic min) and takes a ticket; the block that takes
            the last ticket writes the status words (abi.UNPERMUTE_*)

The host waits for check only (:mod:`._status`). The combine needs nothing of check's
(invalid entries count as -1 there): it is launched as check's programmatic dependent and
may run alongside it.
"""

from __future__ import annotations

from numba import cuda, int32, int64

from .. import abi
from ._family import INDEX_TYPES, INT, KernelFamily, NoKey, ptr, routing_variants
from ._intrinsics import (
    TMP_WORDS,
    atomic_add,
    atomic_min,
    block_min_i64,
    device,
    griddep_trigger,
    griddep_wait,
)
from ._primitives import BIG, store_found

# check's scratch words
_BAD_ROW, _BAD_ID, _TICKET = 0, 1, 2


@device
def _first_bad(values, n, low, high, start, stride):
    """Smallest index ``i = start + j * stride < n`` with ``values[i]`` outside
    ``[low, high)``, or BIG."""
    i = start
    while i < n:
        v = int64(values[i])
        if v < low or v >= high:
            return i
        i += stride
    return BIG


def _init_params(key):
    """init's parameter: check's scratch words."""
    return [("minima", ptr(int64))]  # out [3]: two running minima, the ticket counter


def init(minima):
    """Before check: the two running minima (none yet) and check's ticket counter."""
    griddep_wait()  # (the caller's kernels)
    if cuda.threadIdx.x == 0:
        minima[_BAD_ROW] = BIG
        minima[_BAD_ID] = BIG
        minima[_TICKET] = 0


def _check_params(key):
    """check's parameters (:class:`._family.RoutingKey`)."""
    return [
        ("rowmap", ptr(int32)),  # [T, E]
        ("routemap", ptr(INDEX_TYPES[key.index_bits])),  # [T, K]
        ("minima", ptr(int64)),  # init's scratch words
        ("status", ptr(int64)),  # out: abi.UNPERMUTE_*
        ("T", INT),
        ("R", INT),
        ("E", INT),
        ("K", INT),
    ]


def check(rowmap, routemap, minima, status, T, R, E, K):
    """Validation (``validate=True``), before combine: the smallest rowmap entry outside
    [-1, R) and routing slot outside [-1, E), grid-stride; each block folds its minima into
    ``minima`` (atomic min) and takes a ticket; the last block writes the status words."""
    griddep_trigger()  # the combine may launch now (it needs nothing of this kernel's)
    tmp = cuda.shared.array(TMP_WORDS, int64)
    tid = int64(cuda.threadIdx.x)
    nb = int64(cuda.gridDim.x)
    start = int64(cuda.blockIdx.x) * int64(cuda.blockDim.x) + tid
    stride = nb * int64(cuda.blockDim.x)
    bad_row = block_min_i64(_first_bad(rowmap, T * E, -1, R, start, stride), tmp)
    bad_id = block_min_i64(_first_bad(routemap, T * K, -1, E, start, stride), tmp)
    griddep_wait()  # (init's minima)
    if tid == 0:
        if bad_row != BIG:
            atomic_min(minima, _BAD_ROW, bad_row)
        if bad_id != BIG:
            atomic_min(minima, _BAD_ID, bad_id)
        cuda.threadfence()
        if atomic_add(minima, _TICKET, 1) == nb - 1:
            cuda.threadfence()
            store_found(status, abi.UNPERMUTE_BAD_ID, atomic_min(minima, _BAD_ID, BIG), routemap)
            store_found(status, abi.UNPERMUTE_BAD_ROW, atomic_min(minima, _BAD_ROW, BIG), rowmap)


INIT = KernelFamily("init", _init_params, lambda key: init, lambda: [NoKey()])
CHECK = KernelFamily("check", _check_params, lambda key: check, routing_variants)
