"""The gradients of moe_permute and moe_unpermute on the CPU (docs/gradients.rst).

The data gradient of the permute is the forward's unweighted combine (moe_cpu.unpermute);
this module has the rest. ``permute_backward_probs``: tokens in parallel, each slot takes
the probability gradient of its row when it is the counted slot. ``unpermute_backward``: a
serial pass over the row map finds the (token, expert) pair of every row (and the rows named
twice), then rows in parallel take their token's gradient and the dot product of
_backward.h. Every output element is computed by one thread from the same inputs whatever
the thread count, and the status words are reduced in a fixed order: the results never
depend on the number of threads, and no atomics are needed.

The status slots are those of moe_unpermute (``UNPERMUTE_*``) and, for
``unpermute_backward``, ``STATUS_SLOTS`` after them (moe_numba checks both at import).
"""

from cython.parallel cimport prange, threadid
from libc.stdint cimport int32_t, int64_t, uint8_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from moe_cpu._common cimport (
    DATA_BFLOAT16,
    DATA_FLOAT16,
    DATA_FLOAT32,
    UNPERMUTE_BACKWARD_DUPLICATE_FIRST,
    UNPERMUTE_BACKWARD_DUPLICATE_ROW,
    UNPERMUTE_BACKWARD_DUPLICATE_SECOND,
    UNPERMUTE_BACKWARD_STATUS_LEN,
    UNPERMUTE_BAD_ID,
    UNPERMUTE_BAD_ID_VALUE,
    UNPERMUTE_BAD_ROW,
    UNPERMUTE_BAD_ROW_VALUE,
    UNPERMUTE_STATUS_LEN,
    index_t,
)
from moe_cpu._parallel cimport num_threads

cdef extern from "_backward.h" nogil:
    float moe_warp_dot(int dtype, const void* x, const void* y, int64_t H)
    void moe_scale_row(int dtype, const void* x, float p, void* out, int64_t H)
    void moe_store(void* out, int64_t i, float v, int dtype)

# The status slots this module writes beyond moe_unpermute's, for the caller to check against
# its own tables.
STATUS_SLOTS = {
    "UNPERMUTE_BACKWARD_DUPLICATE_ROW": UNPERMUTE_BACKWARD_DUPLICATE_ROW,
    "UNPERMUTE_BACKWARD_DUPLICATE_FIRST": UNPERMUTE_BACKWARD_DUPLICATE_FIRST,
    "UNPERMUTE_BACKWARD_DUPLICATE_SECOND": UNPERMUTE_BACKWARD_DUPLICATE_SECOND,
    "UNPERMUTE_BACKWARD_STATUS_LEN": UNPERMUTE_BACKWARD_STATUS_LEN,
}

cdef enum:
    TOKEN_CHUNK = 64  # tokens per work item of permute_backward_probs (status kept per chunk)
    ROW_CHUNK = 64  # rows per work item of unpermute_backward


cdef int64_t _element_size(int data_type) except -1:
    if data_type == DATA_FLOAT32:
        return 4
    if data_type == DATA_BFLOAT16 or data_type == DATA_FLOAT16:
        return 2
    raise ValueError(
        f"data_type must be DATA_FLOAT32, DATA_BFLOAT16 or DATA_FLOAT16; got {data_type}"
    )


cdef int _need(bint ok, str what) except -1:
    if not ok:
        raise ValueError(what)
    return 0


cdef void _slot_grads(const float* grad_probs, const int32_t* rowmap, const index_t* routemap,
                      float* out, int64_t T, int64_t E, int64_t K, int64_t R,
                      int64_t* chunk_status, int64_t* seen_all, int nthreads) noexcept nogil:
    """Per chunk of tokens: each counted slot copies its row's gradient, every other slot
    gets +0.0; note the chunk's first bad row-map entry and routing id."""
    cdef int64_t ch, t, e, r, flat
    cdef int64_t nchunks = (T + TOKEN_CHUNK - 1) // TOKEN_CHUNK
    cdef int64_t* seen  # per thread: the last token that named each expert
    cdef int64_t* st
    cdef float w
    for ch in prange(nchunks, num_threads=nthreads, schedule="static"):
        seen = seen_all + threadid() * E
        for e in range(E):
            seen[e] = -1
        st = chunk_status + 4 * ch
        st[0] = -1
        st[1] = -1
        st[2] = -1
        st[3] = -1
        for t in range(ch * TOKEN_CHUNK, min(ch * TOKEN_CHUNK + TOKEN_CHUNK, T)):
            for flat in range(t * E, t * E + E):
                if (rowmap[flat] < -1 or rowmap[flat] >= R) and st[2] < 0:
                    st[2] = flat
                    st[3] = rowmap[flat]
            for flat in range(t * K, t * K + K):
                e = routemap[flat]
                w = 0.0
                if e < -1 or e >= E:
                    if st[0] < 0:
                        st[0] = flat
                        st[1] = e
                elif e >= 0 and seen[e] != t:  # the counted slot of (t, e)
                    seen[e] = t
                    r = rowmap[t * E + e]
                    if r >= 0 and r < R:
                        w = grad_probs[r]  # a copy: every bit kept
                out[flat] = w


def permute_backward_probs(
    const float[::1] grad_probs,  # IN  [R]
    const int32_t[:, ::1] rowmap,  # IN  [T, E]
    const index_t[:, ::1] routemap,  # IN  [T, K]
    float[:, ::1] out_probs,  # OUT [T, K]
    int64_t[::1] status,  # OUT [UNPERMUTE_STATUS_LEN]
):
    """Backend of ``moe_permute_backward``'s probability gradient: fill `out_probs` and the
    status words (the data gradient is ``moe_cpu.unpermute``, unweighted).

    Shapes are checked (a mismatch raises ``ValueError``); values may be anything: row-map
    entries outside [-1, R) and routing ids outside [-1, E) are treated as -1.

    Parameters
    ----------
    grad_probs : numpy.ndarray
        float32 ``[R]`` gradient of each row's probability.
    rowmap : numpy.ndarray
        int32 ``[T, E]`` row of each (token, expert), -1 = none.
    routemap : numpy.ndarray
        int32 or int64 ``[T, K]`` expert ids.
    out_probs : numpy.ndarray
        float32 ``[T, K]``.
    status : numpy.ndarray
        int64, at least ``moe_cpu.STATUS_SLOTS["UNPERMUTE_STATUS_LEN"]`` words.

    Raises
    ------
    ValueError
        For inconsistent shapes.
    """
    cdef int nthreads = num_threads()
    cdef int64_t T = rowmap.shape[0], E = rowmap.shape[1], K = routemap.shape[1]
    cdef int64_t i, ch, nchunks = (T + TOKEN_CHUNK - 1) // TOKEN_CHUNK
    _need(routemap.shape[0] == T, "routemap must have as many rows as rowmap")
    _need(out_probs.shape[0] == T and out_probs.shape[1] == K, "out_probs must be [T, K]")
    _need(status.shape[0] >= UNPERMUTE_STATUS_LEN, "status is too short")
    # (an empty array has no element 0 to point at: NULL, and nothing reads it)
    cdef const float* gp = NULL if grad_probs.shape[0] == 0 else &grad_probs[0]
    cdef const int32_t* rm = NULL if T == 0 or E == 0 else &rowmap[0, 0]
    cdef const index_t* rt = NULL if T == 0 or K == 0 else &routemap[0, 0]
    cdef float* op = NULL if T == 0 or K == 0 else &out_probs[0, 0]
    cdef int64_t* seen = <int64_t*>malloc((nthreads * E + 1) * sizeof(int64_t))
    cdef int64_t* chunk_status = <int64_t*>malloc((4 * nchunks + 1) * sizeof(int64_t))
    try:
        if seen == NULL or chunk_status == NULL:
            raise MemoryError("moe_cpu.permute_backward_probs: out of memory for the scratch")
        with nogil:
            _slot_grads(gp, rm, rt, op, T, E, K, grad_probs.shape[0], chunk_status, seen,
                        nthreads)
            for i in range(UNPERMUTE_STATUS_LEN):
                status[i] = -1
            for ch in range(nchunks):  # chunk order: the smallest flat index is reported
                if status[UNPERMUTE_BAD_ID] < 0 and chunk_status[4 * ch] >= 0:
                    status[UNPERMUTE_BAD_ID] = chunk_status[4 * ch]
                    status[UNPERMUTE_BAD_ID_VALUE] = chunk_status[4 * ch + 1]
                if status[UNPERMUTE_BAD_ROW] < 0 and chunk_status[4 * ch + 2] >= 0:
                    status[UNPERMUTE_BAD_ROW] = chunk_status[4 * ch + 2]
                    status[UNPERMUTE_BAD_ROW_VALUE] = chunk_status[4 * ch + 3]
    finally:
        free(seen)
        free(chunk_status)


cdef struct UnpermuteGrad:
    int64_t T, K, E, R, H, row_bytes
    int dtype
    bint weighted
    const char* grad_hidden  # [T, H] or NULL (no row gradient, no dot product)
    const float* grad_probs  # [T, K] or NULL
    const char* rows  # [R, H], read for the dot product (weighted with grad_hidden)
    const float* probs  # [R], read for the weighted row gradient
    const int32_t* rowmap
    # the flat row-map entry t * E + e of each row's pair; -1: none, -2: named twice
    int64_t* owner
    char* out_rows  # [R, H] or NULL
    float* out_probs  # [R] or NULL


cdef void _find_owners(UnpermuteGrad* c, int64_t* status) noexcept nogil:
    """Serial, in flat order: so the first bad entry and the first two entries naming a
    row are found without atomics, and a row named twice is known before any row is
    written."""
    cdef int64_t flat, r, twice
    for r in range(c.R):
        c.owner[r] = -1
    for flat in range(c.T * c.E):
        r = c.rowmap[flat]
        if r < -1 or r >= c.R:
            if status[UNPERMUTE_BAD_ROW] < 0:
                status[UNPERMUTE_BAD_ROW] = flat
                status[UNPERMUTE_BAD_ROW_VALUE] = r
        elif r >= 0:
            if c.owner[r] == -1:
                c.owner[r] = flat
            elif c.owner[r] >= 0:
                twice = status[UNPERMUTE_BACKWARD_DUPLICATE_ROW]
                if twice < 0 or r < twice:
                    status[UNPERMUTE_BACKWARD_DUPLICATE_ROW] = r
                    status[UNPERMUTE_BACKWARD_DUPLICATE_FIRST] = c.owner[r]
                    status[UNPERMUTE_BACKWARD_DUPLICATE_SECOND] = flat
                c.owner[r] = -2


cdef void _check_ids(const index_t* routemap, int64_t n, int64_t E,
                     int64_t* status) noexcept nogil:
    cdef int64_t flat
    for flat in range(n):
        if routemap[flat] < -1 or routemap[flat] >= E:
            status[UNPERMUTE_BAD_ID] = flat
            status[UNPERMUTE_BAD_ID_VALUE] = routemap[flat]
            return


cdef void _unpermute_grad(UnpermuteGrad* c, const index_t* routemap,
                          int nthreads) noexcept nogil:
    cdef int64_t ch, r, f, t, e, k
    cdef int64_t nchunks = (c.R + ROW_CHUNK - 1) // ROW_CHUNK
    cdef float d
    cdef const char* dy
    for ch in prange(nchunks, num_threads=nthreads, schedule="dynamic"):
        for r in range(ch * ROW_CHUNK, min(ch * ROW_CHUNK + ROW_CHUNK, c.R)):
            f = c.owner[r]
            if f < 0:  # padding, unfilled, or named twice: +0.0
                if c.out_rows != NULL:
                    memset(c.out_rows + r * c.row_bytes, 0, c.row_bytes)
                if c.out_probs != NULL:
                    c.out_probs[r] = 0.0
                continue
            t = f // c.E
            e = f - t * c.E
            dy = NULL
            if c.grad_hidden != NULL:
                dy = c.grad_hidden + t * c.row_bytes
            if c.out_rows != NULL:
                if c.weighted:
                    moe_scale_row(c.dtype, dy, c.probs[r], c.out_rows + r * c.row_bytes, c.H)
                else:
                    memcpy(c.out_rows + r * c.row_bytes, dy, c.row_bytes)
            if c.out_probs != NULL:
                d = 0.0
                if c.rows != NULL:  # (set only when the dot-product term is wanted)
                    d = moe_warp_dot(c.dtype, dy, c.rows + r * c.row_bytes, c.H)
                if c.grad_probs != NULL:
                    for k in range(c.K):  # every slot the forward filled from this row
                        if routemap[t * c.K + k] == e:
                            d = d + c.grad_probs[t * c.K + k]
                moe_store(c.out_probs, r, d, DATA_FLOAT32)


def unpermute_backward(
    const uint8_t[:, ::1] grad_hidden,  # IN  [T, H * size] or None
    const float[:, ::1] grad_probs,  # IN  [T, K] or None
    const uint8_t[:, ::1] rows,  # IN  [R, H * size]; may be None unless weighted with grad_hidden
    const int32_t[:, ::1] rowmap,  # IN  [T, E]
    const index_t[:, ::1] routemap,  # IN  [T, K]
    const float[::1] probs,  # IN  [R]; may be None unless weighted with grad_hidden
    uint8_t[:, ::1] out_rows,  # OUT [R, H * size], given with grad_hidden
    float[::1] out_probs,  # OUT [R] or None
    int64_t[::1] status,  # OUT [UNPERMUTE_BACKWARD_STATUS_LEN]
    *,
    int data_type,
    bint weighted,
    int64_t num_rows,
):
    """Backend of ``moe_unpermute_backward``: fill the preallocated outputs and the status.

    Shapes are checked (a mismatch raises ``ValueError``); values may be anything: row-map
    entries outside [-1, R) and routing ids outside [-1, E) are treated as -1, and a row
    named by two valid entries gets zero gradients.

    Parameters
    ----------
    grad_hidden : numpy.ndarray or None
        uint8 ``[T, H * size]``: the raw bytes of the gradient of the combined rows.
    grad_probs : numpy.ndarray or None
        float32 ``[T, K]`` gradient of the per-slot probabilities.
    rows : numpy.ndarray or None
        uint8 ``[R, H * size]``: the forward's input rows, read by the dot product.
    rowmap : numpy.ndarray
        int32 ``[T, E]`` row of each (token, expert), -1 = none.
    routemap : numpy.ndarray
        int32 or int64 ``[T, K]`` expert ids.
    probs : numpy.ndarray or None
        float32 ``[R]`` probability of each row.
    out_rows : numpy.ndarray or None
        uint8 ``[R, H * size]``, required with `grad_hidden`.
    out_probs : numpy.ndarray or None
        float32 ``[R]``.
    status : numpy.ndarray
        int64, at least ``moe_cpu.STATUS_SLOTS["UNPERMUTE_BACKWARD_STATUS_LEN"]`` words.
    data_type : int
        ``DATA_FLOAT32``, ``DATA_BFLOAT16`` or ``DATA_FLOAT16`` of the rows.
    weighted : bool
        Whether the forward combine was weighted.
    num_rows : int
        R.

    Raises
    ------
    ValueError
        For a bad `data_type`, a missing input or inconsistent shapes.
    """
    cdef UnpermuteGrad c
    cdef int nthreads = num_threads()
    cdef int64_t size = _element_size(data_type)
    cdef int64_t i
    # the dot-product term needs the forward rows: without them the caller wants none
    cdef bint dot = (weighted and grad_hidden is not None and out_probs is not None
                     and rows is not None)
    c.T = rowmap.shape[0]
    c.E = rowmap.shape[1]
    c.K = routemap.shape[1]
    c.R = num_rows
    c.dtype = data_type
    c.weighted = weighted
    _need(routemap.shape[0] == c.T, "routemap must have as many rows as rowmap")
    _need(status.shape[0] >= UNPERMUTE_BACKWARD_STATUS_LEN, "status is too short")
    _need((grad_hidden is None) == (out_rows is None), "grad_hidden and out_rows go together")
    c.grad_hidden = NULL
    c.out_rows = NULL
    c.rows = NULL
    c.probs = NULL
    c.H = 0
    c.row_bytes = 0
    if grad_hidden is not None:
        c.row_bytes = grad_hidden.shape[1]
        c.H = c.row_bytes // size
        _need(grad_hidden.shape[0] == c.T and c.H * size == c.row_bytes and c.H > 0,
              "grad_hidden must be [T, H * element size] with H >= 1")
        _need(out_rows.shape[0] == c.R and out_rows.shape[1] == c.row_bytes,
              "out_rows must have num_rows rows of the bytes of a grad_hidden row")
        # (an empty array has no element 0 to point at: NULL, and nothing reads it)
        c.grad_hidden = NULL if c.T == 0 else <const char*>&grad_hidden[0, 0]
        c.out_rows = NULL if c.R == 0 else <char*>&out_rows[0, 0]
        if weighted:
            _need(probs is not None and probs.shape[0] == c.R,
                  "probs must have num_rows entries when weighted")
            c.probs = NULL if c.R == 0 else &probs[0]
    if dot:
        _need(rows is not None and rows.shape[0] == c.R and rows.shape[1] == c.row_bytes,
              "rows must have the shape of out_rows")
        c.rows = NULL if c.R == 0 else <const char*>&rows[0, 0]
    c.grad_probs = NULL
    if grad_probs is not None:
        _need(out_probs is not None, "grad_probs needs out_probs")
        _need(grad_probs.shape[0] == c.T and grad_probs.shape[1] == c.K,
              "grad_probs must be [T, K]")
        c.grad_probs = NULL if c.T == 0 or c.K == 0 else &grad_probs[0, 0]
    c.out_probs = NULL
    if out_probs is not None:
        _need(out_probs.shape[0] == c.R, "out_probs must have num_rows entries")
        c.out_probs = NULL if c.R == 0 else &out_probs[0]
    c.rowmap = NULL if c.T == 0 or c.E == 0 else &rowmap[0, 0]
    cdef const index_t* routemap_ptr = NULL if c.T == 0 or c.K == 0 else &routemap[0, 0]
    c.owner = <int64_t*>malloc((c.R + 1) * sizeof(int64_t))
    try:
        if c.owner == NULL:
            raise MemoryError("moe_cpu.unpermute_backward: out of memory for the row owners")
        with nogil:
            for i in range(UNPERMUTE_BACKWARD_STATUS_LEN):
                status[i] = -1
            _find_owners(&c, &status[0])
            _check_ids(routemap_ptr, c.T * c.K, c.E, &status[0])
            _unpermute_grad(&c, routemap_ptr, nthreads)
    finally:
        free(c.owner)
