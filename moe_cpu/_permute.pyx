"""moe_permute on the CPU: count -> scan -> place -> gather, over fixed chunks of tokens.

count
    Flag the slots that count (a valid id, the first slot of its expert in the token),
    histogram them per chunk, note each chunk's first bad and first repeated id.
scan
    Per expert: the exclusive scan of the chunk histograms (each chunk's first rank), the
    capacity and the first row; the status words.
place
    Give each counting slot its row (tokens ascending within an expert): the rowmap, the
    source slot of every row and the row of every slot.
gather
    Token-major: copy each token's bytes, probability and expert to the rows of its slots
    (a token's row is read once, however many rows it fills: a row-major gather reads it
    once per row, from memory when the input is larger than the cache); then zero the rows
    that no slot fills.

The GPU kernels (``moe_numba.kernels``) use the same stage names but divide the work another
way: their count also ranks each slot within its chunk, and their gather places each row
itself, so they have no place stage of their own.

Tokens are split into chunks of a fixed size (independent of the thread count), so every stage
gives the same result with any number of threads.

An id is loaded once into a local, checked there and indexed with; place loads it again and
checks it again (a caller that rewrites the routing map during the call gets garbage, never
an access out of bounds).
"""

from cython.parallel cimport parallel, prange, threadid
from libc.stdint cimport int32_t, int64_t, uint8_t, INT64_MAX
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from moe_cpu._common cimport (
    PERMUTE_BAD_ID,
    PERMUTE_BAD_ID_VALUE,
    PERMUTE_DUPLICATE,
    PERMUTE_DUPLICATE_VALUE,
    PERMUTE_MISMATCH,
    PERMUTE_MISMATCH_COUNT,
    PERMUTE_ROWS_NEEDED,
    PERMUTE_STATUS_LEN,
    index_t,
    load_id,
    shape_error,
)
from moe_cpu._parallel cimport num_threads

# The status slots this module writes, for the caller to check against its own table.
STATUS_SLOTS = {
    "PERMUTE_BAD_ID": PERMUTE_BAD_ID,
    "PERMUTE_BAD_ID_VALUE": PERMUTE_BAD_ID_VALUE,
    "PERMUTE_DUPLICATE": PERMUTE_DUPLICATE,
    "PERMUTE_DUPLICATE_VALUE": PERMUTE_DUPLICATE_VALUE,
    "PERMUTE_MISMATCH": PERMUTE_MISMATCH,
    "PERMUTE_MISMATCH_COUNT": PERMUTE_MISMATCH_COUNT,
    "PERMUTE_ROWS_NEEDED": PERMUTE_ROWS_NEEDED,
    "PERMUTE_STATUS_LEN": PERMUTE_STATUS_LEN,
}

# Row copies of the gather. A large output is written with non-temporal stores: it does not fit
# in the cache anyway, and streaming it skips reading every destination line first. x86-64 only
# (SSE2 is baseline there).
cdef extern from *:
    """
    #if defined(__SSE2__)
    #include <emmintrin.h>
    static void moe_stream_rows(uint8_t *dst, const uint8_t *src, int64_t n) {
        int64_t head = (int64_t)((-(uintptr_t)dst) & 15);
        if (head > n) head = n;
        if (src) memcpy(dst, src, head); else memset(dst, 0, head);
        dst += head;
        n -= head;
        if (src) {
            src += head;
            for (; n >= 64; n -= 64, dst += 64, src += 64) {
                __m128i a = _mm_loadu_si128((const __m128i *)src);
                __m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
                __m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
                __m128i d = _mm_loadu_si128((const __m128i *)(src + 48));
                _mm_stream_si128((__m128i *)dst, a);
                _mm_stream_si128((__m128i *)(dst + 16), b);
                _mm_stream_si128((__m128i *)(dst + 32), c);
                _mm_stream_si128((__m128i *)(dst + 48), d);
            }
            for (; n >= 16; n -= 16, dst += 16, src += 16)
                _mm_stream_si128((__m128i *)dst, _mm_loadu_si128((const __m128i *)src));
            memcpy(dst, src, n);
        } else {
            __m128i z = _mm_setzero_si128();
            for (; n >= 16; n -= 16, dst += 16) _mm_stream_si128((__m128i *)dst, z);
            memset(dst, 0, n);
        }
    }
    static void moe_stream_fence(void) { _mm_sfence(); }
    #define MOE_CAN_STREAM 1
    #else
    static void moe_stream_rows(uint8_t *dst, const uint8_t *src, int64_t n) {
        if (src) memcpy(dst, src, n); else memset(dst, 0, n);
    }
    static void moe_stream_fence(void) {}
    #define MOE_CAN_STREAM 0
    #endif
    """
    # copy n bytes, or zero them when src is NULL
    void moe_stream_rows(uint8_t* dst, const uint8_t* src, int64_t n) noexcept nogil
    void moe_stream_fence() noexcept nogil
    bint MOE_CAN_STREAM

cdef enum:
    TOKEN_CHUNK = 512  # tokens per chunk of the count and place stages

# outputs from this size on bypass the cache in the gather
cdef int64_t STREAM_MIN_BYTES = 8 << 20
# bytes of output rows per work item of the gather
cdef int64_t GATHER_CHUNK_BYTES = 1 << 18


cdef struct Plan:
    # shapes
    int64_t T, K, E, R, A
    int64_t nchunks
    # count: 1 where slot t*K+k counts (valid id, first slot of its expert in the token)
    uint8_t* counted
    # count: per-chunk expert histogram [nchunks, E]; scan turns it into each chunk's first
    # rank per expert, place then advances it
    int64_t* ranks
    # count: per chunk, the first bad slot, its id, the first repeated slot, its id (-1 = none)
    int64_t* chunk_status
    # count: per thread, the last token that named each expert [nthreads, E]
    int64_t* seen
    # scan: count c_e, capacity n_e and first row offset_e (saturated) per expert, and the
    # rows all experts need (saturated)
    int64_t* count
    int64_t* capacity
    int64_t* offset
    int64_t total
    # place: the slot t*K+k that fills each row, -1 for an unfilled row
    int64_t* source
    # place: the row that each slot t*K+k fills, -1 for none
    int64_t* dest


cdef void _count(Plan* p, const index_t* routemap, int nthreads) noexcept nogil:
    """Flag the counting slots, histogram them per chunk, note bad and repeated ids."""
    cdef int64_t c, t, k, slot, e, t0, t1
    cdef int64_t* hist
    cdef int64_t* seen
    cdef int64_t* st
    for c in prange(p.nchunks, num_threads=nthreads, schedule="static"):
        hist = p.ranks + c * p.E
        seen = p.seen + threadid() * p.E
        st = p.chunk_status + 4 * c
        st[0] = -1
        st[1] = -1
        st[2] = -1
        st[3] = -1
        memset(hist, 0, p.E * sizeof(int64_t))
        t0 = c * TOKEN_CHUNK
        t1 = min(t0 + TOKEN_CHUNK, p.T)
        for t in range(t0, t1):
            for k in range(p.K):
                slot = t * p.K + k
                e = load_id(routemap, slot)
                p.counted[slot] = 0
                if e == -1:
                    continue
                if e < 0 or e >= p.E:
                    if st[0] < 0:
                        st[0] = slot
                        st[1] = e
                elif seen[e] == t:
                    if st[2] < 0:
                        st[2] = slot
                        st[3] = e
                else:
                    seen[e] = t
                    hist[e] += 1
                    p.counted[slot] = 1


cdef inline int64_t _padded(int64_t n, int64_t a) noexcept nogil:
    """ceil(n / a) * a, saturated at INT64_MAX."""
    cdef int64_t q = n // a + (n % a != 0)
    if q > INT64_MAX // a:
        return INT64_MAX
    return q * a


cdef void _scan(Plan* p, const int64_t* capacity, int64_t* status) noexcept nogil:
    """Per expert: exclusive scan of the chunk histograms, capacity, offset; fill status."""
    cdef int64_t c, e, tmp, n, total = 0
    cdef int64_t* count = p.count
    cdef int64_t* row
    memset(count, 0, p.E * sizeof(int64_t))
    for c in range(p.nchunks):
        row = p.ranks + c * p.E
        for e in range(p.E):
            tmp = row[e]
            row[e] = count[e]
            count[e] += tmp

    for e in range(PERMUTE_STATUS_LEN):
        status[e] = -1
    for c in range(p.nchunks):
        if p.chunk_status[4 * c] >= 0:
            status[PERMUTE_BAD_ID] = p.chunk_status[4 * c]
            status[PERMUTE_BAD_ID_VALUE] = p.chunk_status[4 * c + 1]
            break
    for c in range(p.nchunks):
        if p.chunk_status[4 * c + 2] >= 0:
            status[PERMUTE_DUPLICATE] = p.chunk_status[4 * c + 2]
            status[PERMUTE_DUPLICATE_VALUE] = p.chunk_status[4 * c + 3]
            break

    for e in range(p.E):
        n = count[e] if capacity == NULL else capacity[e]
        if capacity != NULL and n != count[e] and status[PERMUTE_MISMATCH] < 0:
            status[PERMUTE_MISMATCH] = e
            status[PERMUTE_MISMATCH_COUNT] = count[e]
        n = max(n, 0)
        p.capacity[e] = n
        # saturated: an offset past R only means that the expert's tokens are dropped
        p.offset[e] = total
        tmp = _padded(n, p.A)
        total = INT64_MAX if tmp > INT64_MAX - total else total + tmp
    p.total = total
    if capacity == NULL and total > p.R:
        status[PERMUTE_ROWS_NEEDED] = total


cdef void _block_ends(Plan* p, int32_t* ends) noexcept nogil:
    """ends[e] = min(offset_e + padded_e, R): where expert e's block ends, which is where the
    next one starts (the scan's saturated offsets; the total for the last)."""
    cdef int64_t e, end
    for e in range(p.E):
        end = p.offset[e + 1] if e + 1 < p.E else p.total
        ends[e] = <int32_t>min(end, p.R)


cdef void _place(Plan* p, const index_t* routemap, int32_t* rowmap, int nthreads) noexcept nogil:
    """Give each counting slot its row (tokens ascending within an expert); fill the rowmap."""
    cdef int64_t c, t, k, slot, e, r, t0, t1
    cdef int64_t* rank
    for c in prange(p.nchunks, num_threads=nthreads, schedule="static"):
        rank = p.ranks + c * p.E
        t0 = c * TOKEN_CHUNK
        t1 = min(t0 + TOKEN_CHUNK, p.T)
        memset(rowmap + t0 * p.E, 0xFF, (t1 - t0) * p.E * sizeof(int32_t))  # all -1
        memset(p.dest + t0 * p.K, 0xFF, (t1 - t0) * p.K * sizeof(int64_t))
        for t in range(t0, t1):
            for k in range(p.K):
                slot = t * p.K + k
                if not p.counted[slot]:
                    continue
                # read again, so checked again: a caller that rewrites the routing map during
                # the call may have changed the id that count checked
                e = load_id(routemap, slot)
                if e < 0 or e >= p.E:
                    continue
                r = rank[e]
                rank[e] = r + 1
                # offset may be saturated: compare r with R - offset, not offset + r with R
                if r < p.capacity[e] and r < p.R - p.offset[e]:
                    rowmap[t * p.E + e] = <int32_t>(p.offset[e] + r)
                    p.source[p.offset[e] + r] = slot
                    p.dest[slot] = p.offset[e] + r


cdef inline void _copy_row(uint8_t* dst, const uint8_t* src, int64_t n, bint stream) noexcept nogil:
    """Copy n bytes, or zero them when src is NULL."""
    if stream:
        moe_stream_rows(dst, src, n)
    elif src != NULL:
        memcpy(dst, src, n)
    else:
        memset(dst, 0, n)


cdef void _gather(Plan* p, const index_t* routemap, const float* probs,
                  const uint8_t* hidden, uint8_t* out_hidden, int64_t hb,
                  const uint8_t* scale, uint8_t* out_scale, int64_t sb,
                  float* out_probs, int32_t* out_indices, int nthreads) noexcept nogil:
    """Copy each token's bytes, probability and expert to the rows of its slots (a token's
    row is read once, however many rows it fills), then zero the rows no slot fills."""
    cdef int64_t chunk, first, row, slot, t, k
    cdef bint stream = MOE_CAN_STREAM and p.R * (hb + sb) >= STREAM_MIN_BYTES
    cdef int64_t tokens_per_chunk = max(1, GATHER_CHUNK_BYTES // max(1, p.K * (hb + sb)))
    cdef int64_t token_chunks = (p.T + tokens_per_chunk - 1) // tokens_per_chunk
    cdef int64_t rows_per_chunk = max(16, GATHER_CHUNK_BYTES // max(1, hb + sb))
    cdef int64_t row_chunks = (p.R + rows_per_chunk - 1) // rows_per_chunk
    with parallel(num_threads=nthreads):
        # dynamic: a thread that shares its core with another process does less of the work
        for chunk in prange(token_chunks, schedule="dynamic"):
            first = chunk * tokens_per_chunk
            for t in range(first, min(first + tokens_per_chunk, p.T)):
                for k in range(p.K):
                    slot = t * p.K + k
                    row = p.dest[slot]
                    if row < 0:
                        continue
                    if out_hidden != NULL:
                        _copy_row(out_hidden + row * hb, hidden + t * hb, hb, stream)
                    if out_scale != NULL:
                        _copy_row(out_scale + row * sb, scale + t * sb, sb, stream)
                    out_probs[row] = probs[slot]
                    if out_indices != NULL:
                        out_indices[row] = <int32_t>routemap[slot]
        for chunk in prange(row_chunks, schedule="dynamic"):
            first = chunk * rows_per_chunk
            for row in range(first, min(first + rows_per_chunk, p.R)):
                if p.source[row] >= 0:
                    continue
                if out_hidden != NULL:
                    _copy_row(out_hidden + row * hb, NULL, hb, stream)
                if out_scale != NULL:
                    _copy_row(out_scale + row * sb, NULL, sb, stream)
                out_probs[row] = 0.0
                if out_indices != NULL:
                    out_indices[row] = -1
        if stream:
            moe_stream_fence()  # order this thread's streaming stores before the join


def permute(
    const uint8_t[:, ::1] hidden,                # IN   [T, hb] or None
    const uint8_t[:, ::1] scale,                 # IN   [T, sb] or None
    const index_t[:, ::1] routemap not None,     # IN   [T, K]
    const float[:, ::1] probs not None,          # IN   [T, K]
    const int64_t[::1] capacity,                 # IN   [E] or None
    uint8_t[:, ::1] out_hidden,                  # OUT  [R, hb] or None
    uint8_t[:, ::1] out_scale,                   # OUT  [R, sb] or None
    int32_t[:, ::1] out_rowmap not None,         # OUT  [T, E]
    float[::1] out_probs not None,               # OUT  [R]
    int32_t[::1] out_indices,                    # OUT  [R] or None
    int32_t[::1] out_offsets,                    # OUT  [E] or None
    int64_t[::1] status not None,                # OUT  [PERMUTE_STATUS_LEN]
    *,
    int64_t alignment,
    bint validate,
):
    """Backend of ``moe_permute``: fill the preallocated outputs and the status words.

    The shapes must agree with each other (checked here); the values may be anything: bad
    ones are reported in `status` and follow the contract's rules for ``validate=False``.

    Parameters
    ----------
    hidden : numpy.ndarray or None
        uint8 ``[T, hb]``: the bytes of each token row; None when rows are not gathered.
    scale : numpy.ndarray or None
        uint8 ``[T, sb]``: the bytes of each scale row; None when there is none to gather.
    routemap : numpy.ndarray
        int32 or int64 ``[T, K]`` expert ids, -1 = no expert.
    probs : numpy.ndarray
        float32 ``[T, K]`` routing probabilities.
    capacity : numpy.ndarray or None
        int64 ``[E]`` tokens per expert, or None to use the counts (``override_buffer_size``).
    out_hidden, out_scale : numpy.ndarray or None
        uint8 ``[R, hb]`` and ``[R, sb]``, given exactly when `hidden` and `scale` are.
    out_rowmap : numpy.ndarray
        int32 ``[T, E]``; its shape gives E.
    out_probs : numpy.ndarray
        float32 ``[R]``; its shape gives R.
    out_indices : numpy.ndarray or None
        int32 ``[R]`` owning expert of each row, or None when not asked for.
    out_offsets : numpy.ndarray or None
        int32 ``[E]``: the end row of each expert's block, cut at R; None when not asked for.
    status : numpy.ndarray
        int64 ``[PERMUTE_STATUS_LEN]``; the slots are :data:`moe_cpu.STATUS_SLOTS`.
    alignment : int
        Rows per padding unit, >= 1.
    validate : bool
        When true and `status` reports an error, return without writing the outputs.

    Raises
    ------
    ValueError
        For shapes that disagree, an output given without its input (or the reverse), or
        ``alignment < 1``.
    """
    cdef Plan p
    cdef int nthreads = num_threads()
    cdef int64_t hb = 0 if hidden is None else hidden.shape[1]
    cdef int64_t sb = 0 if scale is None else scale.shape[1]
    cdef Py_ssize_t i

    p.T = routemap.shape[0]
    p.K = routemap.shape[1]
    p.E = out_rowmap.shape[1]
    p.R = out_probs.shape[0]
    p.A = alignment
    _check_permute_shapes(hidden, scale, probs, capacity, out_hidden, out_scale, out_rowmap,
                          out_indices, out_offsets, status, &p)
    if alignment < 1:
        raise ValueError(f"alignment must be >= 1; got {alignment}")
    cdef const uint8_t* hidden_ptr = NULL if p.T == 0 or hidden is None else &hidden[0, 0]
    cdef const uint8_t* scale_ptr = NULL if p.T == 0 or scale is None else &scale[0, 0]
    cdef const index_t* routemap_ptr = NULL if p.T == 0 else &routemap[0, 0]
    cdef const float* probs_ptr = NULL if p.T == 0 else &probs[0, 0]
    cdef const int64_t* capacity_ptr = NULL if capacity is None else &capacity[0]
    cdef uint8_t* out_hidden_ptr = NULL if p.R == 0 or out_hidden is None else &out_hidden[0, 0]
    cdef uint8_t* out_scale_ptr = NULL if p.R == 0 or out_scale is None else &out_scale[0, 0]
    cdef int32_t* rowmap_ptr = NULL if p.T == 0 else &out_rowmap[0, 0]
    cdef float* out_probs_ptr = NULL if p.R == 0 else &out_probs[0]
    cdef int32_t* indices_ptr = NULL if p.R == 0 or out_indices is None else &out_indices[0]
    cdef int32_t* offsets_ptr = NULL if out_offsets is None else &out_offsets[0]

    p.nchunks = (p.T + TOKEN_CHUNK - 1) // TOKEN_CHUNK
    # +1: malloc(0) may return NULL
    p.counted = <uint8_t*>malloc(p.T * p.K + 1)
    p.ranks = <int64_t*>malloc((p.nchunks * p.E + 1) * sizeof(int64_t))
    p.chunk_status = <int64_t*>malloc((4 * p.nchunks + 1) * sizeof(int64_t))
    p.seen = <int64_t*>malloc((nthreads * p.E + 1) * sizeof(int64_t))
    p.count = <int64_t*>malloc((p.E + 1) * sizeof(int64_t))
    p.capacity = <int64_t*>malloc((p.E + 1) * sizeof(int64_t))
    p.offset = <int64_t*>malloc((p.E + 1) * sizeof(int64_t))
    p.source = <int64_t*>malloc((p.R + 1) * sizeof(int64_t))
    p.dest = <int64_t*>malloc((p.T * p.K + 1) * sizeof(int64_t))
    try:
        if (p.counted == NULL or p.ranks == NULL or p.chunk_status == NULL or p.seen == NULL
                or p.count == NULL or p.capacity == NULL or p.offset == NULL
                or p.source == NULL or p.dest == NULL):
            raise MemoryError("moe_cpu.permute: out of memory for the row plan")
        with nogil:
            for i in range(nthreads * p.E):
                p.seen[i] = -1
            _count(&p, routemap_ptr, nthreads)
            _scan(&p, capacity_ptr, &status[0])
            if not (validate and _has_error(&status[0])):
                memset(p.source, 0xFF, p.R * sizeof(int64_t))  # all -1; cheap next to the gather
                _place(&p, routemap_ptr, rowmap_ptr, nthreads)
                _gather(&p, routemap_ptr, probs_ptr, hidden_ptr, out_hidden_ptr, hb,
                        scale_ptr, out_scale_ptr, sb, out_probs_ptr, indices_ptr, nthreads)
                if offsets_ptr != NULL:
                    _block_ends(&p, offsets_ptr)
    finally:
        free(p.counted)
        free(p.ranks)
        free(p.chunk_status)
        free(p.seen)
        free(p.count)
        free(p.capacity)
        free(p.offset)
        free(p.source)
        free(p.dest)


cdef int _check_permute_shapes(
    const uint8_t[:, ::1] hidden, const uint8_t[:, ::1] scale, const float[:, ::1] probs,
    const int64_t[::1] capacity, uint8_t[:, ::1] out_hidden, uint8_t[:, ::1] out_scale,
    int32_t[:, ::1] out_rowmap, int32_t[::1] out_indices, int32_t[::1] out_offsets,
    int64_t[::1] status, Plan* p,
) except -1:
    """Raise ValueError unless every shape agrees with routemap's [T, K], E and R."""
    if probs.shape[0] != p.T or probs.shape[1] != p.K:
        raise shape_error("probs", (probs.shape[0], probs.shape[1]), "[T, K]", (p.T, p.K))
    if out_rowmap.shape[0] != p.T:
        raise shape_error("out_rowmap", (out_rowmap.shape[0], p.E), "[T, E]", (p.T, p.E))
    if capacity is not None and capacity.shape[0] != p.E:
        raise shape_error("capacity", (capacity.shape[0],), "[E]", (p.E,))
    _check_rows("hidden", hidden, "out_hidden", out_hidden, p, "hb")
    _check_rows("scale", scale, "out_scale", out_scale, p, "sb")
    if out_indices is not None and out_indices.shape[0] != p.R:
        raise shape_error("out_indices", (out_indices.shape[0],), "[R]", (p.R,))
    if out_offsets is not None and out_offsets.shape[0] != p.E:
        raise shape_error("out_offsets", (out_offsets.shape[0],), "[E]", (p.E,))
    if status.shape[0] != PERMUTE_STATUS_LEN:
        raise shape_error("status", (status.shape[0],), "[PERMUTE_STATUS_LEN]",
                          (PERMUTE_STATUS_LEN,))
    return 0


cdef int _check_rows(str name, const uint8_t[:, ::1] rows, str out_name, uint8_t[:, ::1] out,
                     Plan* p, str width) except -1:
    """Raise ValueError unless rows [T, width] and out [R, width] are both given or both None."""
    if (rows is None) != (out is None):
        raise ValueError(f"{name} and {out_name} must both be arrays or both be None; got "
                         f"{name}={_kind(rows)}, {out_name}={_kind(out)}")
    if rows is None:
        return 0
    cdef int64_t w = rows.shape[1]
    if rows.shape[0] != p.T:
        raise shape_error(name, (rows.shape[0], w), f"[T, {width}]", (p.T, w))
    if out.shape[0] != p.R or out.shape[1] != w:
        raise shape_error(out_name, (out.shape[0], out.shape[1]), f"[R, {width}]", (p.R, w))
    return 0


cdef str _kind(x):
    return "None" if x is None else "an array"


cdef bint _has_error(const int64_t* status) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(PERMUTE_STATUS_LEN):
        if status[i] != -1:
            return True
    return False
