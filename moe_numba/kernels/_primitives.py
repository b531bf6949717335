"""Device functions shared by the stages: status words and a warp's search.

They are built from :mod:`._intrinsics` and run unchanged on a GPU and in the simulator.
"""

from __future__ import annotations

from numba import cuda, int64

from ._intrinsics import device, syncwarp

BIG = 0x7FFFFFFFFFFFFFFF  # "no index yet" for min reductions


@device
def store_found(status, at, index, values):
    """Status words ``at`` and ``at + 1``: a found ``index`` and ``values[index]``, or -1 and
    -1 when nothing was found (``index == BIG``)."""
    if index == BIG:
        status[at] = -1
        status[at + 1] = -1
    else:
        status[at] = index
        status[at + 1] = int64(values[index])


@device
def last_at_most(values, n, x, lane, lanes, box, wb):
    """The last ``i < n`` with ``values[i] <= x``, for non-decreasing ``values`` with
    ``values[0] <= x``, found by a warp of ``lanes`` threads (this one is ``lane``;
    ``box[wb]`` is the warp's shared word): a ``lanes``-ary search, one load per lane a
    round (2 rounds up to 1024 values with 32 lanes)::

        i        0  1  2  3  4  5  6  7  8  9 10 11 12 ..     x = 8, n = 16, lanes = 4
        values   0  0  3  3  3  7  9  9  9 12 12 13 14 ..
        round 1  lanes read i = 0, 4, 8, 12: 2 pass   -> lo = 4, n = 4
        round 2  lanes read i = 4, 5, 6, 7:  2 pass   -> lo = 5, n = 1: the answer
    """
    lo = int64(0)
    while n > 1:
        step = (n + lanes - 1) // lanes
        c = lo + lane * step
        if lane == 0:
            box[wb] = 0
        syncwarp()
        # values do not fall, so the lanes that pass are lanes 0 .. k - 1: count them
        if c < lo + n and values[c] <= x:
            cuda.atomic.add(box, wb, 1)
        syncwarp()
        end = lo + n
        lo += (box[wb] - 1) * step
        n = min(step, end - lo)
        syncwarp()  # (box is reused)
    return lo
