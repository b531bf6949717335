"""Block-level primitives for the kernels: min reduction, exclusive scan (per block and per
warp); atomics and L2-coherent loads on pointer parameters.

On a GPU the block primitives are built from warp shuffles (``shfl_*_sync``) plus one small
shared array. numba's CUDA simulator has no warp intrinsics, so when
``numba.config.ENABLE_CUDASIM`` is set the same names are bound to shared-memory versions
(slow, obviously correct). The choice is made once, at import.

Rules for every function here (both versions):

- every thread of the block calls it, in uniform control flow (no early ``return`` before);
- the block is one-dimensional and its size a multiple of 32 (the launchers ensure it);
- ``tmp`` is a shared array of at least :data:`TMP_WORDS` elements of the value's type
  (int64 for the scans and reductions here); the kernels allocate it as
  ``cuda.shared.array(TMP_WORDS, int64)``;
- each function synchronises the block before it returns, so ``tmp`` may be reused at once
  (the warp scan needs no block barrier on a GPU, but its simulator version has one, so it
  follows the same rules).
"""

from __future__ import annotations

from numba import config, cuda, int64

SIM = bool(config.ENABLE_CUDASIM)

# shared scratch one primitive needs: one slot per warp on a GPU, one per thread in the
# simulator (whose blocks stay small)
TMP_WORDS = 1024 if SIM else 32

FULL_MASK = 0xFFFFFFFF
BIG = 0x7FFFFFFFFFFFFFFF  # "no index yet" for min reductions


def device(fn):
    """``cuda.jit(device=True)``, force-inlined on a GPU (the simulator takes no such flag)."""
    if SIM:
        return cuda.jit(device=True)(fn)
    return cuda.jit(device=True, forceinline=True)(fn)


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


if not SIM:
    from numba.cuda.np.numpy_support import carray

    @device
    def atomic_add(ptr, i, v):
        """``cuda.atomic.add`` on element ``i`` of a pointer parameter (atomics take arrays:
        view the pointer as one); returns the old value."""
        return cuda.atomic.add(carray(ptr, i + 1), i, v)

    @device
    def atomic_min(ptr, i, v):
        """``cuda.atomic.min`` on element ``i`` of a pointer parameter; returns the old value."""
        return cuda.atomic.min(carray(ptr, i + 1), i, v)

    @device
    def syncwarp():
        """``__syncwarp()``: the warp's threads meet, their memory accesses ordered."""
        cuda.syncwarp()

    @device
    def load_cg(array, i):
        """``array[i]`` read from L2 (``ld.global.cg``): sees other blocks' writes of this
        launch once they are published (threadfence + atomic ticket)."""
        return cuda.ldcg(array, i)

    @device
    def _warp_place():
        """(lane, warp, number of warps) of the calling thread in its block."""
        tid = cuda.threadIdx.x
        return tid & 31, tid >> 5, cuda.blockDim.x >> 5

    @device
    def block_min_i64(value, tmp):
        """Minimum of an int64 over the block, returned to every thread."""
        lane, warp, nwarps = _warp_place()
        v = value
        d = 16
        while d > 0:
            o = cuda.shfl_down_sync(FULL_MASK, v, d)
            if o < v:
                v = o
            d >>= 1
        if lane == 0:
            tmp[warp] = v
        cuda.syncthreads()
        m = tmp[0]
        for w in range(1, nwarps):
            o = tmp[w]
            if o < m:
                m = o
        cuda.syncthreads()
        return m

    @device
    def _warp_inclusive_scan(x, lane):
        """Inclusive prefix sum of ``x`` over the warp, in lane order."""
        d = 1
        while d < 32:
            y = cuda.shfl_up_sync(FULL_MASK, x, d)
            if lane >= d:
                x += y
            d <<= 1
        return x

    @device
    def block_exclusive_scan_i64(value, tmp):
        """(exclusive prefix sum over the block in thread order, block total), int64."""
        lane, warp, nwarps = _warp_place()
        x = _warp_inclusive_scan(value, lane)
        if lane == 31:
            tmp[warp] = x
        cuda.syncthreads()
        base = 0
        total = 0
        for w in range(nwarps):
            c = tmp[w]
            if w < warp:
                base += c
            total += c
        cuda.syncthreads()
        return base + x - value, total

    @device
    def warp_exclusive_scan_i64(value, tmp):
        """(exclusive prefix sum over the thread's warp in lane order, warp total), int64;
        ``tmp`` is unused (the simulator's version needs it)."""
        x = _warp_inclusive_scan(value, cuda.threadIdx.x & 31)
        return x - value, cuda.shfl_sync(FULL_MASK, x, 31)

else:

    @device
    def atomic_add(ptr, i, v):
        """``cuda.atomic.add`` on element ``i`` (the simulator passes arrays)."""
        return cuda.atomic.add(ptr, i, v)

    @device
    def atomic_min(ptr, i, v):
        """``cuda.atomic.min`` on element ``i`` (the simulator passes arrays)."""
        return cuda.atomic.min(ptr, i, v)

    @device
    def syncwarp():
        """The simulator has no warps: kernels that call this launch blocks of one warp
        there, so the block barrier stands in for the warp's."""
        cuda.syncthreads()

    @device
    def load_cg(array, i):
        """``array[i]`` (the simulator has one coherent memory)."""
        return array[i]

    @device
    def block_min_i64(value, tmp):
        """Minimum of an int64 over the block, returned to every thread."""
        tid = cuda.threadIdx.x
        tmp[tid] = value
        cuda.syncthreads()
        m = tmp[0]
        for i in range(1, cuda.blockDim.x):
            if tmp[i] < m:
                m = tmp[i]
        cuda.syncthreads()
        return m

    @device
    def _group_exclusive_scan(value, tmp, size):
        """(exclusive prefix sum over the thread's group of ``size`` consecutive threads, the
        group's total), int64."""
        tid = cuda.threadIdx.x
        tmp[tid] = value
        cuda.syncthreads()
        first = tid - tid % size
        before = 0
        total = 0
        for i in range(first, first + size):
            c = tmp[i]
            if i < tid:
                before += c
            total += c
        cuda.syncthreads()
        return before, total

    @device
    def block_exclusive_scan_i64(value, tmp):
        """(exclusive prefix sum over the block in thread order, block total), int64."""
        return _group_exclusive_scan(value, tmp, cuda.blockDim.x)

    @device
    def warp_exclusive_scan_i64(value, tmp):
        """(exclusive prefix sum over the thread's group of 32 threads in thread order, the
        group's total), int64."""
        return _group_exclusive_scan(value, tmp, 32)
