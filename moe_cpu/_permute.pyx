"""moe_permute on the CPU: count -> scan -> place -> gather, as the GPU kernels.

Tokens are split into chunks of a fixed size (independent of the thread count), so every stage
gives the same result with any number of threads.
"""

from cython.parallel cimport parallel, prange, threadid
from libc.stdint cimport int32_t, int64_t, uint8_t, INT64_MAX
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from moe_cpu._parallel cimport num_threads

from moe_numba import _abi

# Row copies of the gather. A large output is written with non-temporal stores: it does not fit
# in the cache anyway, and streaming it skips reading every destination line first (1.2x faster
# here). x86-64 only (SSE2 is baseline there).
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

ctypedef fused index_t:
    int32_t
    int64_t

cdef enum:
    TOKEN_CHUNK = 512  # tokens per chunk of the count and place stages

# outputs from this size on bypass the cache in the gather
cdef int64_t STREAM_MIN_BYTES = 8 << 20
# bytes of output rows per work item of the gather
cdef int64_t GATHER_CHUNK_BYTES = 1 << 18

cdef Py_ssize_t BAD_ID = _abi.PERMUTE_BAD_ID
cdef Py_ssize_t BAD_ID_VALUE = _abi.PERMUTE_BAD_ID_VALUE
cdef Py_ssize_t DUPLICATE = _abi.PERMUTE_DUPLICATE
cdef Py_ssize_t DUPLICATE_VALUE = _abi.PERMUTE_DUPLICATE_VALUE
cdef Py_ssize_t MISMATCH = _abi.PERMUTE_MISMATCH
cdef Py_ssize_t MISMATCH_COUNT = _abi.PERMUTE_MISMATCH_COUNT
cdef Py_ssize_t ROWS_NEEDED = _abi.PERMUTE_ROWS_NEEDED
cdef Py_ssize_t STATUS_LEN = _abi.PERMUTE_STATUS_LEN


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
    # scan: count c_e, capacity n_e and first row offset_e (saturated) per expert
    int64_t* count
    int64_t* capacity
    int64_t* offset
    # place: the slot t*K+k that fills each row, -1 for an unfilled row
    int64_t* source


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
                e = routemap[slot]
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

    for e in range(STATUS_LEN):
        status[e] = -1
    for c in range(p.nchunks):
        if p.chunk_status[4 * c] >= 0:
            status[BAD_ID] = p.chunk_status[4 * c]
            status[BAD_ID_VALUE] = p.chunk_status[4 * c + 1]
            break
    for c in range(p.nchunks):
        if p.chunk_status[4 * c + 2] >= 0:
            status[DUPLICATE] = p.chunk_status[4 * c + 2]
            status[DUPLICATE_VALUE] = p.chunk_status[4 * c + 3]
            break

    for e in range(p.E):
        n = count[e] if capacity == NULL else capacity[e]
        if capacity != NULL and n != count[e] and status[MISMATCH] < 0:
            status[MISMATCH] = e
            status[MISMATCH_COUNT] = count[e]
        n = max(n, 0)
        p.capacity[e] = n
        # saturated: an offset past R only means that the expert's tokens are dropped
        p.offset[e] = total
        tmp = _padded(n, p.A)
        total = INT64_MAX if tmp > INT64_MAX - total else total + tmp
    if capacity == NULL and total > p.R:
        status[ROWS_NEEDED] = total


cdef void _place(Plan* p, const index_t* routemap, int32_t* rowmap, int nthreads) noexcept nogil:
    """Give each counting slot its row (tokens ascending within an expert); fill the rowmap."""
    cdef int64_t c, t, k, slot, e, r, t0, t1
    cdef int64_t* rank
    for c in prange(p.nchunks, num_threads=nthreads, schedule="static"):
        rank = p.ranks + c * p.E
        t0 = c * TOKEN_CHUNK
        t1 = min(t0 + TOKEN_CHUNK, p.T)
        memset(rowmap + t0 * p.E, 0xFF, (t1 - t0) * p.E * sizeof(int32_t))  # all -1
        for t in range(t0, t1):
            for k in range(p.K):
                slot = t * p.K + k
                if not p.counted[slot]:
                    continue
                e = routemap[slot]
                r = rank[e]
                rank[e] = r + 1
                # offset may be saturated: compare r with R - offset, not offset + r with R
                if r < p.capacity[e] and r < p.R - p.offset[e]:
                    rowmap[t * p.E + e] = <int32_t>(p.offset[e] + r)
                    p.source[p.offset[e] + r] = slot


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
    """Copy each filled row's token bytes, probability and expert; zero the other rows."""
    cdef int64_t chunk, first, row, slot, t
    cdef bint stream = MOE_CAN_STREAM and p.R * (hb + sb) >= STREAM_MIN_BYTES
    cdef int64_t rows_per_chunk = max(16, GATHER_CHUNK_BYTES // max(1, hb + sb))
    cdef int64_t nchunks = (p.R + rows_per_chunk - 1) // rows_per_chunk
    with parallel(num_threads=nthreads):
        # dynamic: a thread that shares its core with another process does less of the work
        for chunk in prange(nchunks, schedule="dynamic"):
            first = chunk * rows_per_chunk
            for row in range(first, min(first + rows_per_chunk, p.R)):
                slot = p.source[row]
                if slot >= 0:
                    t = slot // p.K
                    if out_hidden != NULL:
                        _copy_row(out_hidden + row * hb, hidden + t * hb, hb, stream)
                    if out_scale != NULL:
                        _copy_row(out_scale + row * sb, scale + t * sb, sb, stream)
                    out_probs[row] = probs[slot]
                    if out_indices != NULL:
                        out_indices[row] = <int32_t>routemap[slot]
                else:
                    if out_hidden != NULL:
                        _copy_row(out_hidden + row * hb, NULL, hb, stream)
                    if out_scale != NULL:
                        _copy_row(out_scale + row * sb, NULL, sb, stream)
                    out_probs[row] = 0.0
                    if out_indices != NULL:
                        out_indices[row] = -1
        if stream:
            moe_stream_fence()  # order this thread's streaming stores before the join


def permute(hidden, scale, const index_t[:, ::1] routemap, const float[:, ::1] probs,
            capacity, int64_t alignment, out_hidden, out_scale, int32_t[:, ::1] out_rowmap,
            float[::1] out_probs, out_indices, int64_t[::1] status, bint validate):
    """Backend of ``moe_permute``: fill the preallocated outputs and the status words.

    The caller has checked every shape, dtype and contiguity; values may be anything.

    Parameters
    ----------
    hidden : numpy.ndarray or None
        uint8 ``[T, hb]``: the bytes of each token row; None when not gathering.
    scale : numpy.ndarray or None
        uint8 ``[T, sb]``: the bytes of each scale row; None when there is none to gather.
    routemap : numpy.ndarray
        int32 or int64 ``[T, K]`` expert ids, -1 = no expert.
    probs : numpy.ndarray
        float32 ``[T, K]`` routing probabilities.
    capacity : numpy.ndarray or None
        int64 ``[E]`` tokens per expert, or None to use the counts (override mode).
    alignment : int
        Rows per padding unit, >= 1.
    out_hidden, out_scale : numpy.ndarray or None
        uint8 ``[R, hb]`` and ``[R, sb]``, given exactly when `hidden` and `scale` are.
    out_rowmap : numpy.ndarray
        int32 ``[T, E]``; its shape gives E.
    out_probs : numpy.ndarray
        float32 ``[R]``; its shape gives R.
    out_indices : numpy.ndarray or None
        int32 ``[R]`` owning expert of each row.
    status : numpy.ndarray
        int64 ``[PERMUTE_STATUS_LEN]``, see :mod:`moe_numba._abi`.
    validate : bool
        When true and `status` reports an error, return without writing the outputs.
    """
    cdef Plan p
    cdef int nthreads = num_threads()
    cdef const uint8_t[:, ::1] hid, sc
    cdef uint8_t[:, ::1] ohid, osc
    cdef const int64_t[::1] cap
    cdef int32_t[::1] ind
    cdef const uint8_t* hidden_ptr = NULL
    cdef const uint8_t* scale_ptr = NULL
    cdef uint8_t* out_hidden_ptr = NULL
    cdef uint8_t* out_scale_ptr = NULL
    cdef const int64_t* cap_ptr = NULL
    cdef int32_t* indices_ptr = NULL
    cdef int64_t hb = 0, sb = 0
    cdef Py_ssize_t i

    if hidden is not None and out_hidden is not None:
        hid = hidden
        ohid = out_hidden
        hb = hid.shape[1]
        hidden_ptr = &hid[0, 0]
        out_hidden_ptr = &ohid[0, 0]
    if scale is not None and out_scale is not None:
        sc = scale
        osc = out_scale
        sb = sc.shape[1]
        scale_ptr = &sc[0, 0]
        out_scale_ptr = &osc[0, 0]
    if capacity is not None:
        cap = capacity
        cap_ptr = &cap[0]
    if out_indices is not None:
        ind = out_indices
        indices_ptr = &ind[0]

    if alignment < 1:
        raise ValueError(f"alignment must be >= 1, got {alignment}")
    p.T = routemap.shape[0]
    p.K = routemap.shape[1]
    p.E = out_rowmap.shape[1]
    p.R = out_probs.shape[0]
    p.A = alignment
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
    try:
        if (p.counted == NULL or p.ranks == NULL or p.chunk_status == NULL or p.seen == NULL
                or p.count == NULL or p.capacity == NULL or p.offset == NULL
                or p.source == NULL):
            raise MemoryError("moe_cpu.permute: out of memory for the row plan")
        with nogil:
            for i in range(nthreads * p.E):
                p.seen[i] = -1
            _count(&p, &routemap[0, 0], nthreads)
            _scan(&p, cap_ptr, &status[0])
            if not (validate and _has_error(&status[0])):
                memset(p.source, 0xFF, p.R * sizeof(int64_t))  # all -1; cheap next to the gather
                _place(&p, &routemap[0, 0], &out_rowmap[0, 0], nthreads)
                _gather(&p, &routemap[0, 0], &probs[0, 0], hidden_ptr, out_hidden_ptr, hb,
                        scale_ptr, out_scale_ptr, sb, &out_probs[0], indices_ptr, nthreads)
    finally:
        free(p.counted)
        free(p.ranks)
        free(p.chunk_status)
        free(p.seen)
        free(p.count)
        free(p.capacity)
        free(p.offset)
        free(p.source)


cdef bint _has_error(const int64_t* status) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(STATUS_LEN):
        if status[i] != -1:
            return True
    return False
