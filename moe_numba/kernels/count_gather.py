"""moe_permute of a small call in one kernel: every block counts and scans, then gathers.

A call with few routing slots spends most of its time in the chain count -> scan -> gather
(each kernel waits for the whole of the one before). Here each block does the count and the
scan of the whole call itself, in shared memory, and then the gather's work (its items, in
the same grid stride as :mod:`.gather`)::

    routemap [T, K]     staged in shared memory; a thread per token: which of its slots
        |               count (the count's rule)
        |
        v
    bits [E, W]         bit (e, t) set when token t has a counting slot for expert e
        |               (W = ceil(T / 32) words per expert)
        |-- ctot[e]         popcount of row e: the expert's tokens
        |-- offsets, lim, padbase      the scan's phase B (:func:`.scan.make_phase_b`)
        '-- slot_rank[t, k] popcount of the bits below token t in row e: the slot's rank
                            among expert e's tokens (-1: the slot does not count)
        |
        v
    the gather's items (:func:`.gather.make_items`) with those shared arrays, one count
    chunk of T tokens (its base ranks all 0)

Nothing goes through global scratch and there is one launch, at the cost of every block
reading the whole routing map (from L2 after the first) and redoing the count: worth it
while the slots are few (:mod:`.permute` decides). No status words: calls with
``validate=True`` take the chunked path.
"""

from __future__ import annotations

from numba import cuda, int32, int64, uint32

from . import gather
from ._family import INT, KernelFamily, ptr
from ._intrinsics import SYNCWARP_WARPS, TMP_WORDS, device, griddep_wait
from .count import _COUNTS, _slot_state
from .gather import LANES, _gather_params, _gather_variants
from .scan import make_phase_b

WARPS = min(8, SYNCWARP_WARPS)  # gather workers per block (the count's threads: 32 each)
SLOTS = 2048  # most routing slots of a call (T * K)
EXPERTS = 256  # most experts of a call
BITS = 2048  # most words of the bitmap (E * ceil(T / 32))
_BOUNDS = EXPERTS + 1  # padbase's words (a shared array's size must be a constant)

# the gather's parameters that this kernel keeps in shared memory instead (and its chunk)
_SHARED = ("slot_rank", "counts", "offsets", "lim", "padbase", "ct")


def fits(T, K, E):
    """Whether a call of ``T`` tokens, ``K`` slots each and ``E`` experts fits one block's
    shared memory (SLOTS, EXPERTS, BITS)."""
    return 0 < T * K <= SLOTS and E <= EXPERTS and E * ((T + 31) // 32) <= BITS


def _count_gather_params(key):
    """The gather's parameters less its scratch, with the scan's capacities and scalars."""
    params = [(n, t) for n, t in _gather_params(key) if n not in _SHARED]
    at = [n for n, _ in params].index("out_hidden")
    params[at:at] = [("capacity", ptr(int64))]  # [E] tokens_per_expert (unused: override)
    params += [("out_offsets", ptr(int32))]  # out [E] (with has_offsets)
    return params + [("A", INT), ("R", INT), ("override", INT), ("has_offsets", INT)]


@device
def _stage(routemap, ids, n, E, tid, bd):
    """``ids[:n]``: the routing ids, those outside [-1, E) as -2 (four loads in flight)."""
    for s in range(tid, n, 4 * bd):
        a = cuda.local.array(4, int64)
        for u in range(4):
            i = s + u * bd
            a[u] = int64(routemap[i]) if i < n else int64(-1)
        for u in range(4):
            i = s + u * bd
            if i < n:
                ids[i] = a[u] if a[u] >= -1 and a[u] < E else -2


@device
def _count(bits, rank, T, K, E, W, tid, bd):
    """A thread per token: the bitmap of counting (token, expert) pairs; ``rank[g]``, the
    slot's staged id, becomes the expert of a counting slot, else -1. (A slot's id is
    compared with the ones before it after those became -1 where they do not count: a
    repeated id still finds its first slot, which kept it; a bad one is bad itself.)"""
    for t in range(tid, T, bd):
        for k in range(K):
            e, state = _slot_state(rank, t * K, k, k, E)
            if state == _COUNTS:
                cuda.atomic.or_(bits, e * W + (t >> 5), uint32(1) << uint32(t & 31))
            else:
                rank[t * K + k] = -1


@device
def _rank(bits, rank, T, K, W, tid, bd):
    """``rank[g]``: a counting slot's expert -> the number of its expert's tokens before it."""
    for g in range(tid, T * K, bd):
        e = int64(rank[g])
        if e >= 0:
            t = g // K
            base = e * W
            wi = t >> 5
            r = cuda.popc(bits[base + wi] & ((uint32(1) << uint32(t & 31)) - uint32(1)))
            for w in range(wi):
                r += cuda.popc(bits[base + w])
            rank[g] = r


@device
def _shared(array, i):
    return array[i]


_phase_b = make_phase_b(_shared)  # (the counts are in shared memory)


def _make_count_gather(key):
    """The count_gather kernel of ``key`` (a :class:`.gather.GatherKey`)."""
    items = gather.make_items(key, WARPS)

    def count_gather(
        hidden,
        scale,
        routemap,
        probs,
        capacity,
        out_hidden,
        out_scale,
        rowmap,
        out_probs,
        out_indices,
        T,
        K,
        E,
        npw,
        hnw,
        snw,
        has_indices,
        nparts,
        pw,
        pad_rows,
        out_offsets,
        A,
        R,
        override,
        has_offsets,
    ):
        bits = cuda.shared.array(BITS, uint32)
        rank = cuda.shared.array(SLOTS, int32)  # slot_rank
        zeros = cuda.shared.array(EXPERTS, int32)  # the one chunk's base ranks
        ctot = cuda.shared.array(EXPERTS, int64)
        offsets = cuda.shared.array(EXPERTS, int64)
        lim = cuda.shared.array(EXPERTS, int64)
        padbase = cuda.shared.array(_BOUNDS, int64)
        tmp = cuda.shared.array(TMP_WORDS, int64)
        dest = cuda.shared.array((WARPS, LANES), int64)  # (at least the gather's lanes)
        box = cuda.shared.array(WARPS, int64)
        tid = int64(cuda.threadIdx.x)
        bd = int64(cuda.blockDim.x)
        W = (T + 31) >> 5
        # (the caller's kernels; no early trigger: the next call's blocks would sit on the
        # SMs waiting for this one's)
        griddep_wait()
        for i in range(tid, E * W, bd):
            bits[i] = 0
        for e in range(tid, E, bd):
            zeros[e] = 0
        _stage(routemap, rank, T * K, E, tid, bd)
        cuda.syncthreads()
        _count(bits, rank, T, K, E, W, tid, bd)
        cuda.syncthreads()
        for e in range(tid, E, bd):
            c = 0
            for w in range(W):
                c += cuda.popc(bits[e * W + w])
            ctot[e] = c
        cuda.syncthreads()
        # (no status words: the rows and the first mismatch are not needed)
        # (every block finds the same offsets: the first one writes them out)
        ends = has_offsets if cuda.blockIdx.x == 0 else 0
        _phase_b(
            ctot, capacity, offsets, lim, padbase, out_offsets, ends, E, A, R, override, tmp,
            tid, bd
        )
        _rank(bits, rank, T, K, W, tid, bd)
        cuda.syncthreads()
        items(
            hidden,
            scale,
            routemap,
            probs,
            rank,
            zeros,
            offsets,
            lim,
            padbase,
            out_hidden,
            out_scale,
            rowmap,
            out_probs,
            out_indices,
            T,
            K,
            E,
            npw,
            hnw,
            snw,
            has_indices,
            T,  # (one count chunk)
            nparts,
            pw,
            pad_rows,
            dest,
            box,
        )

    return count_gather


COUNT_GATHER = KernelFamily(
    "count_gather", _count_gather_params, _make_count_gather, _gather_variants
)
