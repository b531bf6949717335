"""moe_unpermute on the CPU: check -> combine, in one pass over chunks of tokens.

check
    Note each chunk's first ``zipped_expertwise_rowmap`` entry outside [-1, R) and first
    routing id outside [-1, E); the status words take the first of all chunks. Bad entries
    count as -1 in the combine whether or not the caller validates.
combine
    Per token: its rows in ascending expert id folded into a float32 accumulator (the
    arithmetic of one token is in _combine.h, in C, so that it can be compiled for AVX2/FMA
    next to a baseline version), then the probability of each of its slots.

Every row number and id is loaded once into a local, checked there and indexed with (a
caller that rewrites an input during the call gets garbage, never an access out of bounds).

The GPU kernels (``moe_numba.kernels``) run the check as kernels of their own beside the
combine; here it rides along the combine's reading of the same entries.
"""

from cython.parallel cimport prange, threadid
from libc.stdint cimport int32_t, int64_t, uint16_t
from libc.stdlib cimport free, malloc

from moe_cpu._common cimport (
    DATA_BFLOAT16,
    DATA_FLOAT16,
    DATA_FLOAT32,
    UNPERMUTE_BAD_ID,
    UNPERMUTE_BAD_ID_VALUE,
    UNPERMUTE_BAD_ROW,
    UNPERMUTE_BAD_ROW_VALUE,
    UNPERMUTE_STATUS_LEN,
    index_t,
    load_i32,
    load_id,
    shape_error,
)
from moe_cpu._parallel cimport num_threads

cdef extern from "_combine.h" nogil:
    int MOE_DATA_FLOAT32
    int MOE_DATA_BFLOAT16
    int MOE_DATA_FLOAT16
    int MOE_COMBINE_BLOCK
    void moe_combine_token(int dtype, int weighted, int mix_precision, const void* rows,
                           int64_t H, const int64_t* src_rows, const float* src_probs,
                           int64_t nsrc, const int64_t* next_rows, int64_t nnext, float* acc,
                           void* out)
    void moe_widen_array(int dtype, const uint16_t* src, float* dst, int64_t n)
    void moe_narrow_array(int dtype, const float* src, uint16_t* dst, int64_t n)

if (MOE_DATA_FLOAT32, MOE_DATA_BFLOAT16, MOE_DATA_FLOAT16) != (
    DATA_FLOAT32, DATA_BFLOAT16, DATA_FLOAT16
):
    raise ImportError("moe_cpu: _combine.h and _common.pxd disagree on the data-type codes")

# The status slots this module writes and the data-type codes it takes, for the caller to
# check against its own tables.
STATUS_SLOTS = {
    "UNPERMUTE_BAD_ID": UNPERMUTE_BAD_ID,
    "UNPERMUTE_BAD_ID_VALUE": UNPERMUTE_BAD_ID_VALUE,
    "UNPERMUTE_BAD_ROW": UNPERMUTE_BAD_ROW,
    "UNPERMUTE_BAD_ROW_VALUE": UNPERMUTE_BAD_ROW_VALUE,
    "UNPERMUTE_STATUS_LEN": UNPERMUTE_STATUS_LEN,
}
DATA_TYPES = {
    "DATA_FLOAT32": DATA_FLOAT32,
    "DATA_BFLOAT16": DATA_BFLOAT16,
    "DATA_FLOAT16": DATA_FLOAT16,
}

ctypedef fused row_t:
    float
    uint16_t

cdef enum:
    TOKEN_CHUNK = 16  # tokens per parallel work item (status is kept per chunk)


cdef struct Combine:
    int64_t T, K, E, R, H, elem_size
    int dtype, weighted, mix_precision
    const char* rows
    const int32_t* rowmap
    const float* probs
    char* out_hidden
    float* out_probs
    # per chunk: first bad routemap slot, its id, first bad rowmap entry, its value
    int64_t* chunk_status
    # per thread: accumulator [MOE_COMBINE_BLOCK] float, the rows of a token and of the next
    # [2, E] int64, their weights [2, E] float
    char* scratch
    int64_t scratch_stride


cdef int64_t _token_rows(Combine* c, int64_t t, int64_t* src_rows, float* src_probs,
                         int64_t* st) noexcept nogil:
    """Token t's rows in ascending expert id and their probabilities; how many. A rowmap
    entry outside [-1, R) is noted in ``st`` (the chunk's first) and counts as -1."""
    cdef int64_t e, r, flat, nsrc = 0
    for e in range(c.E):
        flat = t * c.E + e
        r = load_i32(c.rowmap + flat)
        if r < -1 or r >= c.R:
            if st[2] < 0:
                st[2] = flat
                st[3] = r
        elif r >= 0:
            src_rows[nsrc] = r
            src_probs[nsrc] = c.probs[r]
            nsrc = nsrc + 1
    return nsrc


cdef void _combine(Combine* c, const index_t* routemap, int nthreads) noexcept nogil:
    cdef int64_t ch, t, t_end, e, k, r, nsrc, nnext, flat
    cdef int64_t nchunks = (c.T + TOKEN_CHUNK - 1) // TOKEN_CHUNK
    cdef float* acc
    cdef int64_t* src_rows
    cdef float* src_probs
    cdef int64_t* next_rows
    cdef float* next_probs
    cdef int64_t* swap_rows
    cdef float* swap_probs
    cdef int64_t* st
    cdef float w
    # dynamic: a thread that shares its core with another process does less of the work
    for ch in prange(nchunks, num_threads=nthreads, schedule="dynamic"):
        acc = <float*>(c.scratch + threadid() * c.scratch_stride)
        src_rows = <int64_t*>(acc + MOE_COMBINE_BLOCK)
        next_rows = src_rows + c.E
        src_probs = <float*>(next_rows + c.E)
        next_probs = src_probs + c.E
        st = c.chunk_status + 4 * ch
        st[0] = -1
        st[1] = -1
        st[2] = -1
        st[3] = -1
        t_end = min(ch * TOKEN_CHUNK + TOKEN_CHUNK, c.T)
        nsrc = _token_rows(c, ch * TOKEN_CHUNK, src_rows, src_probs, st)
        for t in range(ch * TOKEN_CHUNK, t_end):
            # the next token's rows are known before this one's combine, which prefetches
            # them
            nnext = 0
            if t + 1 < t_end:
                nnext = _token_rows(c, t + 1, next_rows, next_probs, st)
            moe_combine_token(c.dtype, c.weighted, c.mix_precision, c.rows, c.H, src_rows,
                              src_probs, nsrc, next_rows, nnext, acc,
                              c.out_hidden + t * c.H * c.elem_size)
            for k in range(c.K):
                flat = t * c.K + k
                e = load_id(routemap, flat)
                w = 0.0
                if e < -1 or e >= c.E:
                    if st[0] < 0:
                        st[0] = flat
                        st[1] = e
                elif e >= 0:
                    r = load_i32(c.rowmap + t * c.E + e)  # (read again: checked again)
                    if r >= 0 and r < c.R:
                        w = c.probs[r]
                c.out_probs[flat] = w
            swap_rows = src_rows
            src_rows = next_rows
            next_rows = swap_rows
            swap_probs = src_probs
            src_probs = next_probs
            next_probs = swap_probs
            nsrc = nnext


def unpermute(
    const row_t[:, ::1] rows not None,           # IN   [R, H]
    const int32_t[:, ::1] rowmap not None,       # IN   [T, E]
    const index_t[:, ::1] routemap not None,     # IN   [T, K]
    const float[::1] probs not None,             # IN   [R]
    row_t[:, ::1] out_hidden not None,           # OUT  [T, H]
    float[:, ::1] out_probs not None,            # OUT  [T, K]
    int64_t[::1] status not None,                # OUT  [UNPERMUTE_STATUS_LEN]
    *,
    int data_type,
    bint weighted,
    bint mix_precision,
):
    """Backend of ``moe_unpermute``: fill the preallocated outputs and the status words.

    The shapes must agree with each other (checked here); the values may be anything: bad
    ones are reported in `status` and count as -1.

    Parameters
    ----------
    rows : numpy.ndarray
        ``[R, H]`` float32, or uint16 holding bfloat16 / float16 bits.
    rowmap : numpy.ndarray
        int32 ``[T, E]`` row of each (token, expert), -1 = none.
    routemap : numpy.ndarray
        int32 or int64 ``[T, K]`` expert ids.
    probs : numpy.ndarray
        float32 ``[R]`` weight of each row.
    out_hidden : numpy.ndarray
        ``[T, H]``, the type of `rows`.
    out_probs : numpy.ndarray
        float32 ``[T, K]``.
    status : numpy.ndarray
        int64 ``[UNPERMUTE_STATUS_LEN]``; the slots are :data:`moe_cpu.STATUS_SLOTS`.
    data_type : int
        The code in :data:`moe_cpu.DATA_TYPES` of the rows' element type.
    weighted : bool
        Accumulate ``fma(row, prob, acc)`` instead of ``acc + row``.
    mix_precision : bool
        Keep the accumulator in float32 (else round it to the data type after every row).

    Raises
    ------
    ValueError
        If `data_type` does not match the element type of `rows`, or shapes disagree.
    """
    cdef Combine c
    cdef int nthreads = num_threads()
    cdef int64_t i, ch, nchunks
    if row_t is float:
        if data_type != DATA_FLOAT32:
            raise ValueError(f"float32 rows need data_type DATA_FLOAT32; got {data_type}")
    elif data_type != DATA_BFLOAT16 and data_type != DATA_FLOAT16:
        raise ValueError(f"uint16 rows need data_type DATA_BFLOAT16 or DATA_FLOAT16; got "
                         f"{data_type}")

    c.T = rowmap.shape[0]
    c.E = rowmap.shape[1]
    c.K = routemap.shape[1]
    c.R = rows.shape[0]
    c.H = rows.shape[1]
    if routemap.shape[0] != c.T:
        raise shape_error("routemap", (routemap.shape[0], c.K), "[T, K]", (c.T, c.K))
    if probs.shape[0] != c.R:
        raise shape_error("probs", (probs.shape[0],), "[R]", (c.R,))
    if out_hidden.shape[0] != c.T or out_hidden.shape[1] != c.H:
        raise shape_error("out_hidden", (out_hidden.shape[0], out_hidden.shape[1]), "[T, H]",
                          (c.T, c.H))
    if out_probs.shape[0] != c.T or out_probs.shape[1] != c.K:
        raise shape_error("out_probs", (out_probs.shape[0], out_probs.shape[1]), "[T, K]",
                          (c.T, c.K))
    if status.shape[0] != UNPERMUTE_STATUS_LEN:
        raise shape_error("status", (status.shape[0],), "[UNPERMUTE_STATUS_LEN]",
                          (UNPERMUTE_STATUS_LEN,))
    c.elem_size = sizeof(row_t)
    c.dtype = data_type
    c.weighted = weighted
    c.mix_precision = mix_precision
    c.rows = NULL if c.R == 0 else <const char*>&rows[0, 0]
    c.rowmap = NULL if c.T == 0 else &rowmap[0, 0]
    c.probs = NULL if c.R == 0 else &probs[0]
    c.out_hidden = NULL if c.T == 0 else <char*>&out_hidden[0, 0]
    c.out_probs = NULL if c.T == 0 else &out_probs[0, 0]
    cdef const index_t* routemap_ptr = NULL if c.T == 0 else &routemap[0, 0]
    nchunks = (c.T + TOKEN_CHUNK - 1) // TOKEN_CHUNK
    # 64-byte multiples so that the threads' scratch never shares a cache line
    c.scratch_stride = (4 * MOE_COMBINE_BLOCK + 24 * c.E + 63) // 64 * 64
    cdef char* scratch = <char*>malloc(nthreads * c.scratch_stride + 64)
    c.chunk_status = <int64_t*>malloc((4 * nchunks + 1) * sizeof(int64_t))
    try:
        if scratch == NULL or c.chunk_status == NULL:
            raise MemoryError("moe_cpu.unpermute: out of memory for the scratch buffers")
        c.scratch = scratch + (-<size_t>scratch) % 64
        with nogil:
            _combine(&c, routemap_ptr, nthreads)
            for i in range(UNPERMUTE_STATUS_LEN):
                status[i] = -1
            for ch in range(nchunks):
                if status[UNPERMUTE_BAD_ID] < 0 and c.chunk_status[4 * ch] >= 0:
                    status[UNPERMUTE_BAD_ID] = c.chunk_status[4 * ch]
                    status[UNPERMUTE_BAD_ID_VALUE] = c.chunk_status[4 * ch + 1]
                if status[UNPERMUTE_BAD_ROW] < 0 and c.chunk_status[4 * ch + 2] >= 0:
                    status[UNPERMUTE_BAD_ROW] = c.chunk_status[4 * ch + 2]
                    status[UNPERMUTE_BAD_ROW_VALUE] = c.chunk_status[4 * ch + 3]
    finally:
        free(scratch)
        free(c.chunk_status)


def _widen(const uint16_t[::1] src, float[::1] dst, int data_type):
    """Widen bfloat16/float16 bits to float32 with the combine's conversion (for tests)."""
    with nogil:
        moe_widen_array(data_type, &src[0], &dst[0], min(src.shape[0], dst.shape[0]))


def _narrow(const float[::1] src, uint16_t[::1] dst, int data_type):
    """Round float32 to bfloat16/float16 bits with the combine's conversion (for tests)."""
    with nogil:
        moe_narrow_array(data_type, &src[0], &dst[0], min(src.shape[0], dst.shape[0]))
