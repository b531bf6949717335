"""Output arrays whose memory is kept for reuse, like a GPU caching allocator.

A large fresh ``np.empty`` is a new ``mmap``: the kernel zeroes and maps every page on first
touch, which costs as much as the permute itself writing its output. Blocks released by
arrays that died go back to a cache (by size, up to a byte limit) and the next output of
that size reuses them, already mapped. Each block is a ``_Block`` exposing the buffer
protocol; NumPy arrays made from it keep it alive, and its deallocation returns the memory.
"""

from libc.stdlib cimport free, malloc

import numpy as np

from moe_cpu._environment import cache_bytes

# Requests below this size go to np.empty: small pages are cheap and malloc reuses them.
MIN_CACHED_BYTES = 1 << 20
# Sizes are rounded up to a multiple of this, so that similar shapes share blocks.
GRANULE = 1 << 16

cdef Py_ssize_t _limit = cache_bytes(4 << 30)  # (a ValueError naming the variable if bad)
cdef Py_ssize_t _cached_bytes = 0
cdef dict _free_blocks = {}  # size -> list of addresses (ints) of idle blocks


cdef class _Block:
    """``size`` bytes of malloc'ed memory that return to the cache when released."""

    cdef char *data
    cdef Py_ssize_t size
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __getbuffer__(self, Py_buffer *view, int flags):
        view.buf = self.data
        view.obj = self
        view.len = self.size
        view.readonly = 0
        view.itemsize = 1
        view.format = b"B"
        view.ndim = 1
        self.shape[0] = self.size
        self.strides[0] = 1
        view.shape = self.shape
        view.strides = self.strides
        view.suboffsets = NULL
        view.internal = NULL

    def __releasebuffer__(self, Py_buffer *view):
        pass

    def __dealloc__(self):
        global _cached_bytes
        if self.data == NULL:
            return
        if _free_blocks is not None and _cached_bytes + self.size <= _limit:
            _free_blocks.setdefault(self.size, []).append(<size_t>self.data)
            _cached_bytes += self.size
        else:
            free(self.data)


cdef _Block _take(Py_ssize_t size):
    global _cached_bytes
    cdef _Block block = _Block.__new__(_Block)
    idle = _free_blocks.get(size)
    if idle:
        block.data = <char *><size_t>idle.pop()
        _cached_bytes -= size
    else:
        block.data = <char *>malloc(size)
        if block.data == NULL:
            raise MemoryError(f"moe_cpu: cannot allocate {size} bytes")
    block.size = size
    return block


def empty(shape, dtype):
    """An uninitialised C-contiguous array, from the cache when it is large.

    Parameters
    ----------
    shape : tuple of int
        Shape of the array.
    dtype : numpy.dtype
        Element type (any NumPy or ml_dtypes dtype).

    Returns
    -------
    numpy.ndarray
        A writable array; its memory returns to the cache when the array (and every view of
        it) is gone.
    """
    dtype = np.dtype(dtype)
    nbytes = dtype.itemsize
    for n in shape:
        nbytes *= n
    if nbytes < MIN_CACHED_BYTES:
        return np.empty(shape, dtype)
    size = -(-nbytes // GRANULE) * GRANULE
    return np.frombuffer(_take(size), np.uint8, nbytes).view(dtype).reshape(shape)


def empty_cache():
    """Free every idle block of the output cache.

    Returns
    -------
    int
        The number of bytes given back to the system.
    """
    global _cached_bytes
    freed = _cached_bytes
    for addresses in _free_blocks.values():
        for address in addresses:
            free(<void *><size_t>address)
    _free_blocks.clear()
    _cached_bytes = 0
    return freed


def cache_info():
    """Bytes held by idle blocks and the cache's limit.

    Returns
    -------
    dict
        ``{"cached_bytes": int, "limit_bytes": int}``. The limit comes from the environment
        variable ``MOE_CPU_CACHE_BYTES``, read when ``moe_cpu`` is imported: a byte count
        such as ``4294967296``, ``512M``, ``4G`` or ``1e9`` (default 4 GiB; 0 turns the
        cache off; empty is unset; anything else makes the import raise a ValueError that
        names the variable).
    """
    return {"cached_bytes": _cached_bytes, "limit_bytes": _limit}
