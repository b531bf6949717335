"""moe_sort_chunks on the CPU: plan the chunks (serial, one pass over the sizes), then copy the
rows of the output in fixed pieces, pieces in parallel.

Every chunk is contiguous in the input and in the output, so a piece of the output is a few
``memcpy`` calls; the result is a copy and cannot depend on the thread count.
"""

from cython.parallel cimport prange
from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

from moe_cpu._common cimport (
    SORT_BAD_SIZE,
    SORT_BAD_SIZE_VALUE,
    SORT_PAST_END,
    SORT_PAST_END_SIZE,
    SORT_PAST_END_START,
    SORT_STATUS_LEN,
    shape_error,
)
from moe_cpu._parallel cimport num_threads

cdef enum:
    PIECE_BYTES = 1 << 18  # bytes of output rows per parallel work item (at least one row)

# The status slots this module writes, for the caller to check against its own table.
STATUS_SLOTS = {
    "SORT_BAD_SIZE": SORT_BAD_SIZE,
    "SORT_BAD_SIZE_VALUE": SORT_BAD_SIZE_VALUE,
    "SORT_PAST_END": SORT_PAST_END,
    "SORT_PAST_END_SIZE": SORT_PAST_END_SIZE,
    "SORT_PAST_END_START": SORT_PAST_END_START,
    "SORT_STATUS_LEN": SORT_STATUS_LEN,
}


cdef int64_t _plan(const int64_t* sizes, const int64_t* order, int64_t C, int64_t N,
                   int64_t* src_first, int64_t* out_first, int64_t* length, int64_t* first,
                   int64_t* count, int64_t* status) noexcept nogil:
    """Fill, per output position i, the first input row ``src_first[i]``, the first output
    row ``out_first[i]`` and the length of chunk ``order[i]``; return the rows the chunks
    cover. ``first`` and ``count`` (per chunk index) are scratch. Bad sizes follow the rule
    of the contract: a negative size counts as 0, the chunks are cut at row N."""
    cdef int64_t c, i, size, row = 0, at = 0
    for i in range(SORT_STATUS_LEN):
        status[i] = -1
    for c in range(C):
        size = sizes[c]
        if size < 0:
            if status[SORT_BAD_SIZE] < 0:
                status[SORT_BAD_SIZE] = c
                status[SORT_BAD_SIZE_VALUE] = size
            size = 0
        # row <= N + 1 throughout: once a chunk passes the end it saturates there
        if size > N - row and status[SORT_PAST_END] < 0:
            status[SORT_PAST_END] = c
            status[SORT_PAST_END_SIZE] = sizes[c]
            status[SORT_PAST_END_START] = row
        first[c] = min(row, N)
        if size > N + 1 - row:
            row = N + 1
        else:
            row = row + size
        count[c] = min(row, N) - first[c]
    for i in range(C):
        c = order[i]
        src_first[i] = first[c]
        length[i] = count[c]
        out_first[i] = at
        at = at + count[c]
    return at


cdef int64_t _position(const int64_t* out_first, int64_t C, int64_t r) noexcept nogil:
    """The last output position i with ``out_first[i] <= r`` (C > 0, ``out_first[0] = 0``);
    chunk i then holds row r (starts rise, so the zero-length ones before it share its start)."""
    cdef int64_t lo = 0, hi = C - 1, mid
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if out_first[mid] <= r:
            lo = mid
        else:
            hi = mid - 1
    return lo


cdef void _copy_piece(const uint8_t* x, uint8_t* y, int64_t rb, int64_t r0, int64_t r1,
                      int64_t covered, const int64_t* src_first, const int64_t* out_first,
                      const int64_t* length, int64_t C) noexcept nogil:
    """Copy output rows [r0, r1): rows below ``covered`` from their chunk, the rest from the
    same row of x."""
    cdef int64_t r = r0, i, n
    if r < covered:
        i = _position(out_first, C, r)
        while r < min(r1, covered):
            n = min(r1, out_first[i] + length[i]) - r
            if n > 0:
                memcpy(y + r * rb, x + (src_first[i] + r - out_first[i]) * rb, n * rb)
                r = r + n
            i = i + 1
    if r < r1:
        memcpy(y + r * rb, x + r * rb, (r1 - r) * rb)


cdef void _copy_probs(const float* p, float* q, int64_t N, int64_t covered,
                      const int64_t* src_first, const int64_t* out_first,
                      const int64_t* length, int64_t C) noexcept nogil:
    cdef int64_t i, n
    for i in range(C):
        n = length[i]
        if n > 0:
            memcpy(q + out_first[i], p + src_first[i], n * sizeof(float))
    if covered < N:
        memcpy(q + covered, p + covered, (N - covered) * sizeof(float))


def sort_chunks(
    const uint8_t[:, ::1] x not None,            # IN   [N, row_bytes]
    const int64_t[::1] sizes not None,           # IN   [C]
    const int64_t[::1] order not None,           # IN   [C]
    const float[::1] probs,                      # IN   [N] or None
    uint8_t[:, ::1] y not None,                  # OUT  [N, row_bytes]
    float[::1] probs_y,                          # OUT  [N] or None
    int64_t[::1] lengths not None,               # OUT  [C]
    int64_t[::1] status not None,                # OUT  [SORT_STATUS_LEN]
):
    """Backend of ``moe_sort_chunks``: fill the preallocated outputs and the status words.

    Parameters
    ----------
    x : numpy.ndarray
        ``uint8 [N, row_bytes]``: the rows' bytes (IN).
    sizes : numpy.ndarray
        int64 ``[C]`` rows per chunk, any values (IN).
    order : numpy.ndarray
        int64 ``[C]``, a permutation of ``range(C)`` (IN; the caller checked it).
    probs : numpy.ndarray or None
        float32 ``[N]`` carried like the rows (IN).
    y : numpy.ndarray
        ``uint8 [N, row_bytes]`` (OUT).
    probs_y : numpy.ndarray or None
        float32 ``[N]``, given exactly when `probs` is (OUT).
    lengths : numpy.ndarray
        int64 ``[C]``: the rows of the chunk at each output position, bad sizes corrected
        by the rule (OUT).
    status : numpy.ndarray
        int64 ``[SORT_STATUS_LEN]`` (OUT), see :mod:`moe_numba.abi`.

    Raises
    ------
    ValueError
        If the shapes disagree, or `probs_y` is given without `probs` (or the reverse).
    """
    cdef int64_t N = x.shape[0], rb = x.shape[1], C = sizes.shape[0]
    if y.shape[0] != N or y.shape[1] != rb:
        raise shape_error("y", (y.shape[0], y.shape[1]), "[N, row_bytes]", (N, rb))
    if order.shape[0] != C:
        raise shape_error("order", (order.shape[0],), "[C]", (C,))
    if lengths.shape[0] != C:
        raise shape_error("lengths", (lengths.shape[0],), "[C]", (C,))
    if (probs is None) != (probs_y is None):
        raise ValueError(
            "probs and probs_y must both be given or both be None; got "
            f"probs {'None' if probs is None else 'given'}, "
            f"probs_y {'None' if probs_y is None else 'given'}"
        )
    if probs is not None and probs.shape[0] != N:
        raise shape_error("probs", (probs.shape[0],), "[N]", (N,))
    if probs_y is not None and probs_y.shape[0] != N:
        raise shape_error("probs_y", (probs_y.shape[0],), "[N]", (N,))
    if status.shape[0] != SORT_STATUS_LEN:
        raise shape_error("status", (status.shape[0],), "[SORT_STATUS_LEN]", (SORT_STATUS_LEN,))
    cdef int nthreads = num_threads()
    cdef int64_t rows_per_piece = max(1, PIECE_BYTES // max(rb, 1))
    cdef int64_t pieces = (N + rows_per_piece - 1) // rows_per_piece
    cdef int64_t covered, w
    cdef bint with_probs = probs is not None
    cdef int64_t* table = <int64_t*>malloc((5 * C + 1) * sizeof(int64_t))
    cdef const uint8_t* xp = &x[0, 0] if N > 0 and rb > 0 else NULL
    cdef uint8_t* yp = &y[0, 0] if N > 0 and rb > 0 else NULL
    if table == NULL:
        raise MemoryError("moe_cpu.sort_chunks: out of memory for the chunk table")
    try:
        with nogil:
            covered = _plan(&sizes[0] if C > 0 else NULL, &order[0] if C > 0 else NULL, C, N,
                            table, table + C, table + 2 * C, table + 3 * C, table + 4 * C,
                            &status[0])
            if C > 0:
                memcpy(&lengths[0], table + 2 * C, C * sizeof(int64_t))
            if yp != NULL:
                for w in prange(pieces, num_threads=nthreads, schedule="static"):
                    _copy_piece(xp, yp, rb, w * rows_per_piece,
                                min(N, w * rows_per_piece + rows_per_piece), covered,
                                table, table + C, table + 2 * C, C)
            if with_probs and N > 0:
                _copy_probs(&probs[0], &probs_y[0], N, covered, table, table + C,
                            table + 2 * C, C)
    finally:
        free(table)
