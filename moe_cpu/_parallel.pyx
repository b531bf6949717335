"""OpenMP thread control and the parallel copy used as the CPU bandwidth roofline."""

from cython.parallel cimport prange
from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcpy

# Query OpenMP through this shim rather than `cimport openmp`, so that the build without OpenMP
# needs no omp.h.
cdef extern from *:
    """
    #ifdef _OPENMP
    #include <omp.h>
    static int moe_openmp_enabled(void) { return 1; }
    static int moe_omp_max_threads(void) { return omp_get_max_threads(); }
    #else
    static int moe_openmp_enabled(void) { return 0; }
    static int moe_omp_max_threads(void) { return 1; }
    #endif
    """
    int moe_openmp_enabled() noexcept nogil
    int moe_omp_max_threads() noexcept nogil

# 0 = the OpenMP default (omp_get_max_threads() at the time of the call)
cdef int _requested = 0


cdef int num_threads() noexcept nogil:
    if not moe_openmp_enabled():
        return 1
    if _requested > 0:
        return _requested
    return moe_omp_max_threads()


def openmp_enabled():
    """Whether the extension was built with OpenMP.

    Returns
    -------
    bool
        False when the build fell back to serial loops (no OpenMP, or ``MOE_USE_OPENMP=0``).
    """
    return bool(moe_openmp_enabled())


def get_num_threads():
    """Number of threads that every parallel loop of ``moe_cpu`` uses.

    Returns
    -------
    int
        The count set by :func:`set_num_threads`, else OpenMP's default; always 1 without
        OpenMP.
    """
    return num_threads()


def set_num_threads(n):
    """Set the number of threads of every parallel loop of ``moe_cpu``.

    Parameters
    ----------
    n : int or None
        A positive thread count, or None to restore the OpenMP default
        (``OMP_NUM_THREADS`` or the number of cores). Ignored without OpenMP.

    Raises
    ------
    TypeError
        If `n` is neither an integer nor None.
    ValueError
        If `n` is smaller than 1.
    """
    global _requested
    if n is None:
        _requested = 0
        return
    if isinstance(n, bool) or not hasattr(n, "__index__"):
        raise TypeError(f"n must be a positive int or None, got {type(n).__name__}")
    n = n.__index__()
    if n < 1:
        raise ValueError(f"n must be a positive int or None, got {n}")
    _requested = min(n, 1 << 16)


cdef void _copy_chunks(const uint8_t* src, uint8_t* dst, int64_t size, int nthreads) noexcept nogil:
    cdef int64_t chunk = (size + nthreads - 1) // nthreads
    cdef int64_t start, stop
    cdef int i
    for i in prange(nthreads, num_threads=nthreads, schedule="static"):
        start = i * chunk
        stop = min(start + chunk, size)
        if start < stop:
            memcpy(dst + start, src + start, stop - start)


def copy_rows(src, dst):
    """Copy a uint8 array into another of the same size, one contiguous chunk per thread.

    The CPU copy roofline of the benchmarks: it moves ``2 * src.nbytes`` bytes.

    Parameters
    ----------
    src : numpy.ndarray
        C-contiguous uint8 array, any shape.
    dst : numpy.ndarray
        Writable C-contiguous uint8 array with as many elements as `src`.

    Raises
    ------
    ValueError
        If the sizes differ.
    """
    if not (src.flags.c_contiguous and dst.flags.c_contiguous):
        raise ValueError("src and dst must be C-contiguous")
    cdef const uint8_t[::1] s = src.reshape(-1)
    cdef uint8_t[::1] d = dst.reshape(-1)
    if s.shape[0] != d.shape[0]:
        raise ValueError(f"dst must have {s.shape[0]} elements, got {d.shape[0]}")
    if s.shape[0] == 0:
        return
    with nogil:
        _copy_chunks(&s[0], &d[0], s.shape[0], num_threads())
