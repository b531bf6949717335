"""OpenMP thread control of every kernel of moe_cpu, and the parallel copy used as roofline.

Three rules keep a call alive and fast whatever its environment (docs/threads.rst):

- the thread count never exceeds what the runtime can start (`thread_limit`);
- a child made by ``fork()`` after this process ran a team of threads runs serially, because
  libgomp's thread pool belongs to the parent and a child that starts a team waits forever
  for threads that were not forked;
- by default a call uses fewer threads, down to one, while its caller keeps waiting for a
  processor (the processors are busy with other work): a team whose threads wait for a
  processor stalls at every barrier, far slower than one thread.
"""

from cython.parallel cimport prange
from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcpy

# The C side (OpenMP queries, fork watch, load sensing) lives in _threads.h; without OpenMP it
# needs no omp.h.
cdef extern from "_threads.h" nogil:
    ctypedef struct moe_load_state:
        int64_t backoff_min_ns
        int64_t backoff_max_ns
        int64_t narrowed_calls
    moe_load_state moe_load
    int moe_openmp_enabled()
    int moe_omp_max_threads()
    int moe_omp_thread_limit()
    int moe_omp_num_procs()
    int moe_forked_after_team
    void moe_note_team()
    int moe_watch_forks()
    int moe_threads_for_load(int n)
    int moe_decide_for_test(int n, int64_t wait, int64_t now)
    void moe_reset_load()
    bint MOE_CAN_SENSE_LOAD

# Threads per processor that a count may reach. Beyond the processors no loop of moe_cpu gets
# faster (each one streams memory or splits fixed work), while every thread costs a stack and
# a kernel task; libgomp exits the process when it cannot create one, and it overflows a stack
# at tens of thousands. A few per processor still let a test oversubscribe the cores.
THREADS_PER_PROCESSOR = 4

# 0 = the OpenMP default (omp_get_max_threads() at the time of the call, clamped)
cdef int _requested = 0
# the most threads any call uses; see thread_limit()
cdef int _limit = 1
# False: the default count is used as it is, even while the cores are busy (for benchmarks)
cdef bint _sense_load = True

if moe_watch_forks() != 0:
    raise ImportError("moe_cpu: pthread_atfork failed; a forked child could hang")


def _compute_limit():
    procs = max(1, moe_omp_num_procs())
    return max(1, min(moe_omp_thread_limit(), THREADS_PER_PROCESSOR * procs)), procs


_limit, _PROCESSORS = _compute_limit()


cdef inline int _count() noexcept nogil:
    """The count set, else OpenMP's default clamped to the limit; 1 where loops are serial."""
    if not moe_openmp_enabled() or moe_forked_after_team:
        return 1
    if _requested > 0:
        return _requested
    return min(max(1, moe_omp_max_threads()), _limit)


cdef int num_threads() noexcept nogil:
    """Threads for the parallel loops of the call that asks now."""
    cdef int n = _count()
    if n > 1 and _requested == 0 and _sense_load:
        n = moe_threads_for_load(n)
    if n > 1:
        moe_note_team()
    return n


def openmp_enabled():
    """Whether the extension was built with OpenMP.

    Returns
    -------
    bool
        False when the build fell back to serial loops (no OpenMP, or ``MOE_USE_OPENMP=0``).
    """
    return bool(moe_openmp_enabled())


def thread_limit():
    """The most threads a parallel loop of ``moe_cpu`` may use.

    Returns
    -------
    int
        ``4 *`` the processors available to this process when ``moe_cpu`` was imported,
        at most ``OMP_THREAD_LIMIT``; 1 without OpenMP.
    """
    return _limit if moe_openmp_enabled() else 1


def get_num_threads():
    """Number of threads that every parallel loop of ``moe_cpu`` uses.

    Returns
    -------
    int
        The count set by :func:`set_num_threads`, else OpenMP's default (``OMP_NUM_THREADS``
        or the number of processors) clamped to :func:`thread_limit`, which a call uses when
        the processors are free (by default, on Linux, it uses fewer, down to one, while
        other work keeps them busy). Always 1 without OpenMP, and in a child made by
        ``fork()`` after this process ran parallel loops.
    """
    return _count()


def set_num_threads(n):
    """Set the number of threads of every parallel loop of ``moe_cpu``.

    Parameters
    ----------
    n : int or None
        A thread count from 1 to :func:`thread_limit`, used by every later call as it is; or
        None to restore the default: OpenMP's (``OMP_NUM_THREADS`` or the number of
        processors, clamped to :func:`thread_limit`), lowered on Linux, down to one thread,
        while other work keeps the processors busy. Ignored without OpenMP; in a child made
        by ``fork()`` after this process ran parallel loops, loops stay serial whatever `n`
        is.

    Raises
    ------
    TypeError
        If `n` is neither an integer nor None.
    ValueError
        If `n` is smaller than 1 or larger than :func:`thread_limit`.
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
    if moe_openmp_enabled() and n > _limit:
        raise ValueError(
            f"n must be at most {_limit} (moe_cpu.thread_limit(): {THREADS_PER_PROCESSOR} "
            f"threads per processor, {_PROCESSORS} processors, and OMP_THREAD_LIMIT; more "
            f"threads than OpenMP can start would end the process); got {n}"
        )
    _requested = n


def _set_load_sensing(enabled, backoff_min_s=None, backoff_max_s=None):
    """Turn the default's load sensing on or off, or change its pauses; reset its state.

    For benchmarks and tests. Returns the previous ``(enabled, backoff_min_s,
    backoff_max_s)``.
    """
    global _sense_load
    previous = (bool(_sense_load), moe_load.backoff_min_ns / 1e9, moe_load.backoff_max_ns / 1e9)
    _sense_load = bool(enabled)
    if backoff_min_s is not None:
        moe_load.backoff_min_ns = int(backoff_min_s * 1e9)
    if backoff_max_s is not None:
        moe_load.backoff_max_ns = int(backoff_max_s * 1e9)
    moe_reset_load()
    return previous


def _narrowed_calls():
    """Calls given fewer threads because the processors were busy, since the last reset."""
    return moe_load.narrowed_calls


def _decide_threads(n, wait_s, now_s):
    """The load sensing's decision for `n` threads on a made-up sample: the caller's time on
    a run queue so far, `wait_s` (None: unknown), at time `now_s` (for the tests; it moves
    the state that the calls use)."""
    wait = -1 if wait_s is None else int(wait_s * 1e9)
    return moe_decide_for_test(n, wait, int(now_s * 1e9))


def _threads_now():
    """What num_threads() gives the next call (it advances the load sensing like a call)."""
    return num_threads()


def _load_sensing_supported():
    """Whether this build can see its waits for a processor (OpenMP on Linux)."""
    return bool(MOE_CAN_SENSE_LOAD)


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
