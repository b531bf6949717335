"""moe_permute's count stage: which slots count, the chunks' counts, each slot's rank.

Grid (token chunks of ``ct`` tokens) x (expert tiles of ``ETILE``), a block per chunk and tile::

    routemap [T, K]       chunk c = tokens [c * ct, (c + 1) * ct)
        |                 a slot counts: id in [0, E), first slot of its token with that id
        v
    bits [ETILE, ct / 32] (shared) bit (e, token) set when the token has a counting slot for e
        |
        |-- counts[c, e]        popcount of row e: the chunk's tokens of expert e
        |-- slot_rank[t, k]     popcount of the bits below the token's in row e: its rank
        |                       among the chunk's tokens of expert e (-1: the slot does not
        |                       count; written by tile 0)
        '-- part[c]             the chunk's smallest bad and repeated slot (-1: none; tile 0)

The routing ids of a chunk are staged in shared memory when they fit (``RMT``; otherwise
both passes read them from memory). Block 0 also zeroes the scan's ticket counter ``done``.
``CT``, ``ETILE`` and ``RMT`` are compiled in: the settings' ``ct``, ``etile`` and ``rmt``
(:class:`._settings.Settings`).
"""

from __future__ import annotations

from numba import cuda, int8, int32, int64, uint32

from ._family import INDEX_TYPES, INT, KernelFamily, ptr, routing_variants
from ._intrinsics import device, griddep_trigger, griddep_wait
from ._settings import compiled_in

# the count block's geometry, compiled in (set by _geometry): most tokens per chunk, experts
# per block, the size of its shared bitmap of a bit per expert and token (uint32 words),
# routing ids it stages in shared memory
CT = ETILE = COUNT_BITS = RMT = 0


@compiled_in
def _geometry(settings):
    """The count block's geometry from ``settings``."""
    global CT, ETILE, COUNT_BITS, RMT
    CT, ETILE, RMT = settings.ct, settings.etile, settings.rmt
    COUNT_BITS = ETILE * (CT // 32)


_BIG32 = 0x7FFFFFFF

# slot states
_EMPTY, _BAD, _REPEATED, _COUNTS = 0, 1, 2, 3


@device
def _slot_state(src, base, s, k, E):
    """(expert id, state) of slot ``s`` (column ``k`` of its token) of ``src[base:]``."""
    e = int64(src[base + s])
    # no early exit from the loop: a warp whose threads left it at different columns would
    # run the rest of the pass once per exit point
    repeated = False
    first = base + s - k
    for j in range(k):
        if int64(src[first + j]) == e:
            repeated = True
    if e == -1:
        return e, _EMPTY
    if e < 0 or e >= E:
        return e, _BAD
    return e, _REPEATED if repeated else _COUNTS


@device
def _next_slot(s, tl, k, step, q, rr, K):
    """Advance (slot, local token, column) by ``step`` = q * K + rr slots, no division."""
    s += step
    tl += q
    k += rr
    if k >= K:
        k -= K
        tl += 1
    return s, tl, k


def _count_params(key):
    """The count kernel's parameters (:class:`._family.RoutingKey`)."""
    return [
        ("routemap", ptr(INDEX_TYPES[key.index_bits])),  # [T, K] expert ids
        ("slot_rank", ptr(int32)),  # out [T, K]: rank of a counting slot, else -1
        ("counts", ptr(int32)),  # out [chunks, E]
        ("part", ptr(int64)),  # out [chunks, 2]: smallest bad, repeated slot
        ("done", ptr(int64)),  # out [1]: the scan's ticket counter, zeroed
        ("T", INT),
        ("K", INT),
        ("E", INT),
        ("ct", INT),  # tokens per chunk
    ]


def count(routemap, slot_rank, counts, part, done, T, K, E, ct):
    """The count kernel (see the module docstring)."""
    griddep_wait()  # (the caller's kernels: it is launched as a dependent of theirs)
    griddep_trigger()  # the scan (or gather) may launch now: it waits for this kernel
    bits = cuda.shared.array(COUNT_BITS, uint32)
    rmt = cuda.shared.array(RMT, int32)
    states = cuda.shared.array(RMT, int8)  # pass 1's slot states, for pass 2
    smin = cuda.shared.array(2, int32)
    tid = int64(cuda.threadIdx.x)
    bd = int64(cuda.blockDim.x)
    chunk = int64(cuda.blockIdx.x)
    etile = int64(cuda.blockIdx.y)
    W = (ct + 31) >> 5  # bitmap words per expert
    t0 = chunk * ct
    nt = min(ct, T - t0)
    e0 = etile * ETILE
    ne = min(int64(ETILE), E - e0)
    g0 = t0 * K
    nslots = nt * K
    staged = nslots <= RMT  # the chunk's routing ids fit in shared memory

    i = tid
    while i < ne * W:
        bits[i] = 0
        i += bd
    if tid < 2:
        smin[tid] = _BIG32
    if tid == 0 and chunk == 0 and etile == 0:
        done[0] = 0  # the scan blocks' ticket counter (this launch completes before scan)
    if staged:  # four independent loads per thread in flight
        s = tid
        while s < nslots:
            s1 = s + bd
            s2 = s1 + bd
            s3 = s2 + bd
            a0 = int64(routemap[g0 + s])
            a1 = int64(routemap[g0 + s1]) if s1 < nslots else int64(-1)
            a2 = int64(routemap[g0 + s2]) if s2 < nslots else int64(-1)
            a3 = int64(routemap[g0 + s3]) if s3 < nslots else int64(-1)
            rmt[s] = a0 if a0 >= -1 and a0 < E else -2
            if s1 < nslots:
                rmt[s1] = a1 if a1 >= -1 and a1 < E else -2
            if s2 < nslots:
                rmt[s2] = a2 if a2 >= -1 and a2 < E else -2
            if s3 < nslots:
                rmt[s3] = a3 if a3 >= -1 and a3 < E else -2
            s += 4 * bd
    cuda.syncthreads()

    q = bd // K
    rr = bd - q * K
    tl0 = tid // K
    k0 = tid - tl0 * K

    # pass 1: the bitmap of counting (token, expert) pairs; smallest bad / repeated slot
    s, tl, k = tid, tl0, k0
    while s < nslots:
        if staged:
            e, state = _slot_state(rmt, 0, s, k, E)
            states[s] = state
        else:
            e, state = _slot_state(routemap, g0, s, k, E)
        if state == _COUNTS:
            if e >= e0 and e < e0 + ne:
                cuda.atomic.or_(bits, (e - e0) * W + (tl >> 5), uint32(1) << uint32(tl & 31))
        elif etile == 0:
            if state == _BAD:
                cuda.atomic.min(smin, 0, int32(s))
            elif state == _REPEATED:
                cuda.atomic.min(smin, 1, int32(s))
        s, tl, k = _next_slot(s, tl, k, bd, q, rr, K)
    cuda.syncthreads()

    # the chunk's count per expert of the tile
    el = tid
    while el < ne:
        c = 0
        for w in range(W):
            c += cuda.popc(bits[el * W + w])
        counts[chunk * E + e0 + el] = c
        el += bd

    # rank of each counting slot among the chunk's tokens of its expert; -1 for the others
    s, tl, k = tid, tl0, k0
    while s < nslots:
        if staged:
            e = int64(rmt[s])
            state = int64(states[s])
        else:
            e, state = _slot_state(routemap, g0, s, k, E)
        if state == _COUNTS:
            if e >= e0 and e < e0 + ne:
                base = (e - e0) * W
                wi = tl >> 5
                rank = cuda.popc(bits[base + wi] & ((uint32(1) << uint32(tl & 31)) - uint32(1)))
                for w in range(wi):
                    rank += cuda.popc(bits[base + w])
                slot_rank[g0 + s] = rank
        elif etile == 0:
            slot_rank[g0 + s] = -1
        s, tl, k = _next_slot(s, tl, k, bd, q, rr, K)

    if etile == 0 and tid == 0:
        bad = smin[0]
        rep = smin[1]
        part[2 * chunk] = -1 if bad == _BIG32 else g0 + bad
        part[2 * chunk + 1] = -1 if rep == _BIG32 else g0 + rep


COUNT = KernelFamily("count", _count_params, lambda key: count, routing_variants)
count_device = device(count)  # (count_scan counts, then scans, in one block)
