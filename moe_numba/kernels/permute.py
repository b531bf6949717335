"""moe_permute on the GPU: count -> scan -> gather (the gather also places the rows).

Stages (three launches on the caller's stream, no host synchronisation; with ``validate=True``
the host waits for an event recorded after ``scan``, see :mod:`._status`):

``count``  grid (token chunks of ``CT``, expert tiles of ``ETILE``). Per chunk: decide for
           every slot whether it counts (id in [0, E), first slot of its expert in the token),
           set a bit per (expert, token) in a shared bitmap, and from the bitmap write the
           chunk's per-expert counts and every counting slot's rank among the chunk's tokens
           of that expert (popcounts of the lower tokens' bits), and the chunk's smallest
           bad / repeated slot.
``scan``   one block per tile of experts. Per expert: exclusive scan of the chunk counts (in
           place: the counts become each chunk's base rank) and ``c_e``. The last block to
           finish (atomic ticket; the counter is zeroed by ``count``) then computes ``n_e``,
           ``padded_e``, the offsets (block scan), the end of the filled rows ``lim_e``,
           where each expert's padding rows start in the sequence of all padding rows
           (``padbase_e``, block scan; the total at ``padbase_E``), and, with
           ``validate=True``, all status words (nobody reads them otherwise).
``count_scan`` instead of both for small calls with ``validate=False`` (``T <= CT``,
           ``E <= ETILE``): one block counts the only chunk, then scans (one launch fewer).
``gather`` warps as workers, one item at a time: first the padding workers (so that they
           overlap the copies; a few hundred, see ``_padding_workers``), then the tokens.
           A padding worker takes every ``npw``-th chunk of ``PAD_ROWS`` rows of the
           padding sequence: it finds the chunk's first expert (a 32-ary search of
           ``padbase``), a lane per expert from there lists its rows, and the warp zeroes
           them. Workers with no chunk leave at once. A token's warp loads its hidden row
           (up to ``28 * 32`` 16-byte words at once, into registers) and the first 32
           words of its scale row, turns each counting slot into its row (``offset_e +
           chunk base + rank``, kept when below ``lim_e``), writes the token's rowmap row
           (-1, then its rows), probs and expert index of each of its rows, and stores the
           hidden row (and scale row) to each of its rows, with the widest word the row
           allows (16-byte vector accesses; the 16-byte stores, and the padding's zeros,
           with the streaming cache hint: every output row is written once).

Every kernel is launched as a programmatic dependent (:mod:`._griddep`, sm_90 and newer): it
may start while the kernel ahead of it runs and waits for it only before it needs its
results. The count (or count_scan) waits first thing, for the caller's kernels, so its
launch overlaps their end; the gather starts during the count and loads its first rows
then.

The copy is token-major: each input row is read once and written K times, which is the
byte count of the contract (a row-major gather over the output would read every input row
K times from DRAM).

Every scratch word is written before it is read; every output element is written once
(a rowmap entry of a placed token twice, -1 then its row, by the same warp).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int8, int32, int64, uint32, uint64
from numba.cuda import types

from .. import _abi
from . import _copy
from . import _griddep as griddep
from ._buffer import carve
from ._launch import SIM, Launcher, RawKernel, jit, optional_arg
from ._primitives import (
    BIG,
    TMP_WORDS,
    atomic_add,
    block_exclusive_scan_i64,
    block_min_i64,
    device,
    load_cg,
    store_found,
    syncwarp,
    warp_exclusive_scan_i64,
)
from ._status import StatusWords

# Launch geometry. Module globals are compile-time constants on a GPU (the simulator reads
# them at run time, so tests can shrink them).
CT = 256  # most tokens per count chunk (a multiple of 32; see _chunk_tokens)
ETILE = 1024  # experts per count block: shared bitmap of ETILE * CT / 32 words (32 KiB)
COUNT_BD = 256  # threads of a count block
SCAN_BD = 256  # threads of a scan block
LANES = 32  # threads of a gather worker: a warp (the simulator's tests shrink it)
WARPS = 1 if SIM else 4  # gather workers per block (the simulator's warps are whole blocks)
GATHER_BLOCKS = 1 << 30  # most gather blocks (workers then take several items)
BATCH_WORDS = (4, 8, 16, 28)  # hidden words a gather thread may hold at once (rising)
PAD_ROWS = 32  # rows of a padding worker's chunk (at most LANES)
PAD_WORKERS = 256  # fewest padding workers (when there are as many chunks of rows)
COUNT_BITS = ETILE * (CT // 32)  # size of the count block's shared bitmap (uint32 words)
RMT = 2048  # routing ids a count block stages in shared memory (8 KiB; 32 KiB bitmap)
NC_TARGET = 128  # count chunks to aim for

_BIG32 = 0x7FFFFFFF
_I64, _I32 = np.dtype(np.int64), np.dtype(np.int32)

P = types.CPointer
_RT = {4: types.int32, 8: types.int64}

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


def _count_body(routemap, slot_rank, counts, part, done, T, K, E, ct):
    griddep.wait()  # (the caller's kernels: it is launched as a dependent of theirs)
    griddep.trigger()  # the scan (or gather) may launch now: it waits for this kernel
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


@device
def _load8(counts, c, c1, E, e, vals):
    """vals[u] = counts[(c + u) * E + e] for the chunks below c1, else 0 (8 loads in flight)."""
    for u in range(8):
        vals[u] = counts[(c + u) * E + e] if c + u < c1 else 0


def _scan_body(
    counts,
    capacity,
    offsets,
    lim,
    padbase,
    ctot,
    part,
    routemap,
    status,
    done,
    NC,
    E,
    A,
    R,
    T,
    K,
    override,
    ex_dim,
    want_status,
):
    tmp = cuda.shared.array(TMP_WORDS, int64)
    last = cuda.shared.array(1, int32)
    vals = cuda.local.array(8, int32)
    griddep.trigger()
    griddep.wait()  # (the counts)
    tid = int64(cuda.threadIdx.x)
    bd = int64(cuda.blockDim.x)
    nb = int64(cuda.gridDim.x)

    # phase A (every block, its expert tiles): per expert, exclusive scan over the chunks
    # (in place: the counts become each chunk's base rank) and the total c_e. Thread
    # (ex, cy) owns expert et + ex and a contiguous range of chunks, read eight at a time;
    # an expert's cy_dim threads are a warp (or one thread: count_scan, or no tokens).
    cy_dim = bd // ex_dim
    ex = tid // cy_dim
    cy = tid - ex * cy_dim
    per = (NC + cy_dim - 1) // cy_dim
    c0 = min(NC, cy * per)
    c1 = min(NC, c0 + per)
    et = int64(cuda.blockIdx.x) * ex_dim
    while et < E:
        e = et + ex
        s = int64(0)
        if e < E:
            c = c0
            while c < c1:
                _load8(counts, c, c1, E, e, vals)
                for u in range(8):
                    s += vals[u]
                c += 8
        if cy_dim == 1:
            before = int64(0)
            total = s
        else:
            before, total = warp_exclusive_scan_i64(s, tmp)
        if e < E:
            run = before
            c = c0
            while c < c1:
                _load8(counts, c, c1, E, e, vals)
                for u in range(8):
                    if c + u < c1:
                        counts[(c + u) * E + e] = run
                        run += vals[u]
                c += 8
            if cy == 0:
                ctot[e] = total
        et += nb * ex_dim

    # the last block to finish phase A does the rest (no block waits for another)
    if nb > 1:
        cuda.threadfence()
        cuda.syncthreads()
        if tid == 0:
            last[0] = 1 if atomic_add(done, 0, 1) == nb - 1 else 0
        cuda.syncthreads()
        if last[0] == 0:
            return
    cuda.syncthreads()

    # phase B: capacities, padded sizes, offsets, filled rows, where each expert's padding
    # rows start in the sequence of all padding rows; first mismatching expert
    carry = int64(0)
    pad_carry = int64(0)
    mismatch = BIG
    for e0 in range(0, E, bd):
        e = e0 + tid
        padded = int64(0)
        c = int64(0)
        n = int64(0)
        if e < E:
            c = load_cg(ctot, e)
            n = c
            if override == 0:
                n = capacity[e]
                if n != c and e < mismatch:
                    mismatch = e
                if n < 0:
                    n = 0
            padded = (n + A - 1) // A * A
        before, total = block_exclusive_scan_i64(padded, tmp)
        pad = int64(0)
        if e < E:
            off = carry + before
            filled = min(c, n)
            room = R - off
            if room < 0:
                room = 0
            if filled > room:
                filled = room
            offsets[e] = off
            lim[e] = off + filled
            # padding: lim_e .. the next expert's offset (.. R for the last expert)
            end = R if e == E - 1 else min(off + padded, R)
            pad = max(end - (off + filled), int64(0))
        pad_before, pad_total = block_exclusive_scan_i64(pad, tmp)
        if e < E:
            padbase[e] = pad_carry + pad_before
        carry += total
        pad_carry += pad_total
    if tid == 0:
        padbase[E] = pad_carry
    if want_status == 0:  # (validate=False: nobody reads the status words)
        return

    # phase C: status words (smallest index wins)
    mismatch = block_min_i64(mismatch, tmp)
    bad = BIG
    rep = BIG
    for c in range(tid, NC, bd):
        v = part[2 * c]
        if v >= 0 and v < bad:
            bad = v
        v = part[2 * c + 1]
        if v >= 0 and v < rep:
            rep = v
    bad = block_min_i64(bad, tmp)
    rep = block_min_i64(rep, tmp)
    if tid == 0:
        store_found(status, _abi.PERMUTE_BAD_ID, bad, routemap)
        store_found(status, _abi.PERMUTE_DUPLICATE, rep, routemap)
        if mismatch == BIG:
            status[_abi.PERMUTE_MISMATCH] = -1
            status[_abi.PERMUTE_MISMATCH_COUNT] = -1
        else:
            status[_abi.PERMUTE_MISMATCH] = mismatch
            status[_abi.PERMUTE_MISMATCH_COUNT] = load_cg(ctot, mismatch)
        if override != 0 and carry > R:
            status[_abi.PERMUTE_ROWS_NEEDED] = carry
        else:
            status[_abi.PERMUTE_ROWS_NEEDED] = -1


# count and scan run as kernels of their own and, for small calls, inlined into count_scan
_count = device(_count_body)
_scan = device(_scan_body)


def _count_scan_kernel(
    routemap,
    slot_rank,
    counts,
    part,
    done,
    capacity,
    offsets,
    lim,
    padbase,
    ctot,
    status,
    T,
    K,
    E,
    A,
    R,
    override,
    ex_dim,
    ct,
):
    """Small calls (one chunk, one expert tile; ``validate=False``): one block counts, then
    scans (one launch fewer, no ticket, no status words)."""
    _count(routemap, slot_rank, counts, part, done, T, K, E, ct)
    cuda.syncthreads()
    _scan(
        counts,
        capacity,
        offsets,
        lim,
        padbase,
        ctot,
        part,
        routemap,
        status,
        done,
        1,
        E,
        A,
        R,
        T,
        K,
        override,
        ex_dim,
        0,
    )


@device
def _last_at_most(values, n, x, lane, box, wb):
    """The last ``i < n`` with ``values[i] <= x``, for non-decreasing ``values`` with
    ``values[0] <= x``, found by the warp (``lane``; ``box[wb]`` is its shared word): a
    LANES-ary search, one load per lane a round (2 rounds up to 1024 values)."""
    lo = int64(0)
    while n > 1:
        step = (n + LANES - 1) // LANES
        c = lo + lane * step
        if lane == 0:
            box[wb] = 0
        syncwarp()
        # values do not fall, so the lanes that pass are lanes 0 .. k - 1: count them
        if c < lo + n and values[c] <= x:
            cuda.atomic.add(box, wb, 1)
        syncwarp()
        end = lo + n
        lo += (box[wb] - 1) * step
        n = min(step, end - lo)
        syncwarp()  # (box is reused)
    return lo


def _make_gather(hw, sw, nb):
    """The gather kernel body for hidden words of ``hw`` bytes, scale words of ``sw`` and
    ``nb`` hidden words per thread at a time.

    Every warp is a worker that takes items (padding workers first, then tokens) in grid
    stride. A token's warp loads the first ``nb * LANES`` words of its hidden row (the whole
    row, for rows up to ``28 * 32`` 16-byte words) before it works out its rows, so that the
    loads' latency overlaps the dependent loads of the placement, then stores them to each
    of the token's rows. Reading the row in big batches matters: an H200 mixes the few reads
    into the many writes badly when they come in small pieces.
    """
    # every output row is written once: streaming stores (+1.1 to +2.6 points of the copy on
    # an H200; the L2 evicts those lines first)
    lds, sts, stzs = _copy.word_ops(sw, streaming=True)
    stzh = _copy.word_ops(hw, streaming=True)[2]
    load, store = _copy.batch_ops(hw, nb, streaming=True)
    load_s, store_s = _copy.batch_ops(sw, 1, streaming=True)
    lo_t = _copy.WORD_TYPE[hw]
    slo_t = _copy.WORD_TYPE[sw]

    def gather(
        hidden,
        scale,
        routemap,
        probs,
        slot_rank,
        counts,
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
        ct,
    ):
        dest = cuda.shared.array((WARPS, LANES), int64)  # a warp's rows: a token's, or padding
        box = cuda.shared.array(WARPS, int64)  # a warp's word for _last_at_most
        lo = cuda.local.array(nb, lo_t)
        hi = cuda.local.array(nb, uint64)
        slo = cuda.local.array(1, slo_t)  # a scale word
        shi = cuda.local.array(1, uint64)
        lane = int64(cuda.threadIdx.x) % LANES
        wb = int64(cuda.threadIdx.x) // LANES
        item = int64(cuda.blockIdx.x) * WARPS + wb
        stride = int64(cuda.gridDim.x) * WARPS
        while item < npw + T:
            if item >= npw:
                t = item - npw
                chunk = t // ct
                src = t * hnw
                if hnw > 0:
                    load(hidden, src, lane, hnw, LANES, lo, hi)
                if snw > 0:  # the first LANES words of the scale row, with the hidden row
                    load_s(scale, t * snw, lane, snw, LANES, slo, shi)
                for e in range(lane, E, LANES):  # the token's rowmap row: -1, then its rows
                    rowmap[t * E + e] = -1
                griddep.wait()  # (the scan's offsets and limits)
                syncwarp()
                for kb in range(0, K, LANES):
                    nk = min(LANES, K - kb)
                    d = int64(-1)
                    if lane < nk:
                        g = t * K + kb + lane
                        rank = slot_rank[g]
                        e = int64(routemap[g])  # (loaded with the rank, not after it)
                        if rank >= 0:
                            row = offsets[e] + counts[chunk * E + e] + rank
                            if row < lim[e]:
                                d = row
                                rowmap[t * E + e] = row
                                out_probs[row] = probs[g]
                                if has_indices != 0:
                                    out_indices[row] = e
                    dest[wb, lane] = d
                    syncwarp()
                    if hnw > 0:
                        if kb > 0:
                            load(hidden, src, lane, hnw, LANES, lo, hi)
                        w = lane
                        while True:
                            for j in range(nk):
                                d = dest[wb, j]
                                if d >= 0:
                                    store(out_hidden, d * hnw, w, hnw, LANES, lo, hi)
                            w += nb * LANES
                            if w >= hnw:
                                break
                            load(hidden, src, w, hnw, LANES, lo, hi)
                    if lane < snw:
                        for j in range(nk):
                            d = dest[wb, j]
                            if d >= 0:
                                store_s(out_scale, d * snw, lane, snw, LANES, slo, shi)
                    for w in range(lane + LANES, snw, LANES):  # (the rest of a long row)
                        x = lds(scale, t * snw + w)
                        for j in range(nk):
                            d = dest[wb, j]
                            if d >= 0:
                                sts(out_scale, d * snw + w, x)
                    syncwarp()  # (dest is rewritten next)
            else:
                # a padding worker: chunks of PAD_ROWS rows of the sequence of all padding
                # rows (expert 0's, then expert 1's, ...), every npw-th chunk from its own
                griddep.wait()  # (the scan's limits and padding bases)
                p0 = item * PAD_ROWS
                while p0 < padbase[E]:
                    n = min(PAD_ROWS, padbase[E] - p0)
                    # a lane per expert, from the one that holds padding row p0: the rows
                    # of its padding in the chunk
                    eb = _last_at_most(padbase, E, p0, lane, box, wb)
                    while True:
                        e = eb + lane
                        if e < E:
                            base = padbase[e]
                            for p in range(max(base, p0), min(padbase[e + 1], p0 + n)):
                                dest[wb, p - p0] = lim[e] + p - base
                        eb += LANES
                        if eb >= E or padbase[eb] >= p0 + n:
                            break
                    syncwarp()
                    if lane < n:
                        r = dest[wb, lane]
                        out_probs[r] = 0
                        if has_indices != 0:
                            out_indices[r] = -1
                    for i in range(n):
                        r = dest[wb, i]
                        for w in range(lane, hnw, LANES):
                            stzh(out_hidden, r * hnw + w)
                        for w in range(lane, snw, LANES):
                            stzs(out_scale, r * snw + w)
                    syncwarp()  # (dest is rewritten next)
                    p0 += npw * PAD_ROWS
            item += stride

    return gather


# ------------------------------------------------------------------------------------------
# kernels, compiled per signature on first use

_count_jit = jit(_count_body)
_scan_jit = jit(_scan_body)
_count_scan_jit = jit(_count_scan_kernel)
_gather_jit = {}
_KERNELS = {}

_I32P, _I64P, _U32P = P(types.int32), P(types.int64), P(types.uint32)
_I = types.int64


def _count_sig(rt):
    return types.void(P(rt), _I32P, _I32P, _I64P, _I64P, _I, _I, _I, _I)


def _scan_sig(rt):
    return types.void(_I32P, *([_I64P] * 6), P(rt), _I64P, _I64P, *([_I] * 9))


def _count_scan_sig(rt):
    return types.void(P(rt), _I32P, _I32P, _I64P, _I64P, *([_I64P] * 6), *([_I] * 8))


def _gather_sig(hw, sw, rt):
    h, s = P(_copy.WORD_TYPE[hw]), P(_copy.WORD_TYPE[sw])
    return types.void(
        h, s, P(rt), _U32P, _I32P, _I32P, *([_I64P] * 3), h, s, _I32P, _U32P, _I32P, *([_I] * 8)
    )


def _gather_dispatcher(hw, sw, nb):
    d = _gather_jit.get((hw, sw, nb))
    if d is None:
        d = _gather_jit[(hw, sw, nb)] = jit(_make_gather(hw, sw, nb))
    return d


def _gather_variants():
    """(hidden word width, scale word width, words per batch) of every gather kernel."""
    for hw in _copy.WIDTHS:
        for sw in _copy.WIDTHS[:3]:  # scale rows hold 4-byte elements
            for nb in BATCH_WORDS if hw == 16 else BATCH_WORDS[:1]:
                yield hw, sw, nb


def _batch_words(hw, hnw):
    """Hidden words a gather thread holds at once: the fewest of BATCH_WORDS that take the
    whole row (16-byte words; narrower words come from odd rows: the smallest batch)."""
    if hw != 16:
        return BATCH_WORDS[0]
    for nb in BATCH_WORDS:
        if nb * LANES >= hnw:
            return nb
    return BATCH_WORDS[-1]


def _kernel(name, *key):
    k = _KERNELS.get((name, key))
    if k is None:
        if name == "count":
            k = RawKernel(_count_jit, _count_sig(_RT[key[0]]), "count")
        elif name == "scan":
            k = RawKernel(_scan_jit, _scan_sig(_RT[key[0]]), "scan")
        elif name == "count_scan":
            k = RawKernel(_count_scan_jit, _count_scan_sig(_RT[key[0]]), "count_scan")
        else:
            hw, sw, nb, ri = key
            k = RawKernel(
                _gather_dispatcher(hw, sw, nb),
                _gather_sig(hw, sw, _RT[ri]),
                f"gather_h{hw}_s{sw}_b{nb}",
            )
        _KERNELS[(name, key)] = k
    return k


def all_kernels():
    """Every (name, python function, signature) this module can launch (for the PTX test)."""
    out = []
    for ri in (4, 8):
        rt = _RT[ri]
        out.append((f"count_i{ri * 8}", _count_body, _count_sig(rt)))
        out.append((f"scan_i{ri * 8}", _scan_body, _scan_sig(rt)))
        out.append((f"count_scan_i{ri * 8}", _count_scan_kernel, _count_scan_sig(rt)))
        for hw, sw, nb in _gather_variants():
            fn = _gather_dispatcher(hw, sw, nb).py_func
            out.append((f"gather_h{hw}_s{sw}_b{nb}_i{ri * 8}", fn, _gather_sig(hw, sw, rt)))
    return out


# ------------------------------------------------------------------------------------------
# host side


def _padding_workers(R, slots):
    """Warps that zero the padding rows: a chunk of PAD_ROWS rows each for the padding there
    would be if every routing slot counted (``R - slots`` rows), and at least PAD_WORKERS
    (there is more padding when slots are empty), but no more than R's chunks."""
    chunks = -(-R // PAD_ROWS)
    return min(chunks, max(PAD_WORKERS, -(-max(R - slots, 0) // PAD_ROWS)))


def _chunk_tokens(T, K):
    """Tokens per count chunk: about NC_TARGET chunks (parallel count blocks, a short scan),
    at most CT, and small enough that the chunk's routing ids fit in shared memory."""
    ct = 32
    while ct < CT and ct * NC_TARGET < T:
        ct *= 2
    while ct > 1 and ct * K > RMT:
        ct //= 2
    return ct


def permute(
    hidden,
    scale,
    routemap,
    probs,
    capacity,
    *,
    num_tokens,
    topk,
    num_experts,
    alignment,
    num_rows,
    hidden_row_bytes,
    scale_row_bytes,
    routemap_itemsize,
    out_hidden,
    out_scale,
    out_rowmap,
    out_probs,
    out_indices,
    validate,
    alloc,
    stream,
):
    """Run moe_permute's kernels on ``stream``; see the module docstring and SPEC.md.

    Every output element is written. Nothing is synchronised. Returns the call's
    :class:`StatusWords` with ``validate=True`` (final once the scan has run), else None
    (the words are not computed).
    """
    T, K, E, R = int(num_tokens), int(topk), int(num_experts), int(num_rows)
    ri = int(routemap_itemsize)
    rt_dtype = np.int32 if ri == 4 else np.int64
    # copy word widths (checked before anything is launched)
    if hidden is not None and hidden_row_bytes > 0:
        hw = _copy.word_width(hidden_row_bytes, hidden, out_hidden)
        hnw = hidden_row_bytes // hw
    else:
        hw, hnw = 8, 0
    if scale is not None and scale_row_bytes > 0:
        sw = _copy.word_width(scale_row_bytes, scale, out_scale)
        if sw < 4:
            raise ValueError("scale rows must be whole, 4-byte aligned float32/int32 words")
        snw = scale_row_bytes // sw
    else:
        sw, snw = 4, 0
    # count and scan in one block: one launch fewer, for calls bound by host time; with
    # validate=True the host waits for the scan, which chunked counting finishes sooner
    one_block = not validate and 0 < T <= CT and E <= ETILE
    ct = T if one_block else _chunk_tokens(T, K)
    nc = -(-T // ct)
    net = -(-E // ETILE)

    # one scratch allocation: int64 arrays first (8-byte aligned), then int32 arrays
    done, offsets, lim, padbase, ctot, part, counts, ranks = carve(
        alloc,
        (
            (1, _I64),
            (E, _I64),
            (E, _I64),
            (E + 1, _I64),
            (E, _I64),
            (2 * max(nc, 1), _I64),
            (max(nc * E, 1), _I32),
            (max(T * K, 1), _I32),
        ),
    )

    rm = routemap.kernel_arg(rt_dtype)
    rowmap = out_rowmap.kernel_arg(np.int32)
    launch = Launcher(stream)
    if validate:
        status = StatusWords(launch, _abi.PERMUTE_STATUS_LEN)
        status_arg = status.arg
    else:
        status = None
        status_arg = optional_arg(None, np.int64)  # (the scan writes no status words)

    override = 1 if capacity is None else 0
    capacity = optional_arg(capacity, np.int64)
    if one_block:
        launch(
            _kernel("count_scan", ri),
            1,
            COUNT_BD,
            (rm, ranks, counts, part, done, capacity, offsets, lim, padbase, ctot, status_arg)
            + (T, K, E, int(alignment), R, override, COUNT_BD, ct),  # a thread per expert
            dependent=True,
        )
    else:
        if T > 0:
            launch(
                _kernel("count", ri),
                (nc, net),
                COUNT_BD,
                (rm, ranks, counts, part, done, T, K, E, ct),
                dependent=True,
            )
        # scan: one block per tile of ex_dim experts (the last one to finish does the
        # offsets and the status); with no tokens, one block and no ticket counter
        ex_dim = max(1, SCAN_BD // 32) if T > 0 else SCAN_BD
        launch(
            _kernel("scan", ri),
            -(-E // ex_dim) if T > 0 else 1,
            SCAN_BD,
            (counts, capacity, offsets, lim, padbase, ctot, part, rm, status_arg, done)
            + (nc, E, int(alignment), R, T, K, override, ex_dim, 1 if validate else 0),
            dependent=True,
        )

    if status is not None:
        status.written()

    npw = _padding_workers(R, T * K)
    items = npw + T
    if items > 0:
        hd, sd = _copy.WORD_DTYPE[hw], _copy.WORD_DTYPE[sw]
        launch(
            _kernel("gather", hw, sw, _batch_words(hw, hnw), ri),
            min(-(-items // WARPS), GATHER_BLOCKS),
            WARPS * LANES,
            (
                optional_arg(hidden if hnw else None, hd),
                optional_arg(scale if snw else None, sd),
                rm,
                probs.kernel_arg(np.uint32),
                ranks,
                counts,
                offsets,
                lim,
                padbase,
                optional_arg(out_hidden if hnw else None, hd),
                optional_arg(out_scale if snw else None, sd),
                rowmap,
                optional_arg(out_probs if R else None, np.uint32),
                optional_arg(out_indices if (out_indices is not None and R) else None, np.int32),
                T,
                K,
                E,
                npw,
                hnw,
                snw,
                0 if out_indices is None else 1,
                ct,
            ),
            dependent=True,
        )
    return status
