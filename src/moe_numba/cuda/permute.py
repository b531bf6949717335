"""moe_permute on the GPU: count -> scan -> gather (the gather also places the rows).

Stages (three launches on the caller's stream, no host synchronisation):

``count``  grid (token chunks of ``CT``, expert tiles of ``ETILE``). Per chunk: decide for
           every slot whether it counts (id in [0, E), first slot of its expert in the token),
           set a bit per (expert, token) in a shared bitmap, and from the bitmap write the
           chunk's per-expert counts and every counting slot's rank among the chunk's tokens
           of that expert (popcounts of the lower tokens' bits), and the chunk's smallest
           bad / repeated slot.
``scan``   one block. Per expert: exclusive scan of the chunk counts (in place: the counts
           become each chunk's base rank), ``c_e``; then ``n_e``, ``padded_e``, the offsets
           (block scan), the end of the filled rows ``lim_e``; then all status words.
``gather`` one block per token, then one block per ``PAD_ROWS`` rows. A token's block turns
           each counting slot into its row (``offset_e + chunk base + rank``, kept when below
           ``lim_e``), writes the token's rowmap row (-1, then its rows), probs and expert
           index of each of its rows, and copies the token's hidden row (and scale row) once
           from memory to each of its rows, with the widest word the row allows (16-byte
           vector accesses). The padding blocks find the
           rows that hold no token (binary search of the offsets) and zero them.

The copy is token-major: each input row is read once and written K times, which is the
byte count of the contract (a row-major gather over the output would read every input row
K times from DRAM).

Every scratch word is written before it is read; every output element is written once
(a rowmap entry of a placed token twice, -1 then its row, by the same block).
"""

from __future__ import annotations

import numpy as np
from numba import cuda, int32, int64, uint32
from numba.cuda import types

from .. import _abi
from . import _copy
from ._buffer import DeviceBuffer
from ._launch import SIM, Launcher, RawKernel, jit
from ._primitives import BIG, TMP_WORDS, block_exclusive_scan_i64, block_min_i64, device

# Launch geometry. Module globals are compile-time constants on a GPU (the simulator reads
# them at run time, so tests can shrink them).
CT = 256  # tokens per count chunk (a multiple of 32)
ETILE = 1024  # experts per count block: shared bitmap of ETILE * CT / 32 words (32 KiB)
COUNT_BD = 256  # threads of a count block
SCAN_BD = 1024  # threads of the scan block
GATHER_BD = 256  # most threads of a gather block
MIN_BD = 32  # fewest threads of a gather block (a warp)
PAD_ROWS = 64  # rows one padding block checks
DMAX = 64  # destinations a token block handles at once (K > DMAX: several passes)
PREFETCH = True  # gather variant (see _make_gather)
COUNT_BITS = ETILE * (CT // 32)  # size of the count block's shared bitmap (uint32 words)

_BIG32 = 0x7FFFFFFF

P = types.CPointer
_RT = {4: types.int32, 8: types.int64}

# slot states
_EMPTY, _BAD, _REPEATED, _COUNTS = 0, 1, 2, 3


@device
def _slot_state(routemap, g0, s, K, E):
    """(expert id, state) of slot ``s`` of the chunk starting at flat slot ``g0``."""
    e = int64(routemap[g0 + s])
    if e == -1:
        return e, _EMPTY
    if e < 0 or e >= E:
        return e, _BAD
    tl = s // K
    base = g0 + tl * K
    for j in range(s - tl * K):
        if int64(routemap[base + j]) == e:
            return e, _REPEATED
    return e, _COUNTS


def _count_body(routemap, slot_rank, counts, part, T, K, E):
    bits = cuda.shared.array(COUNT_BITS, uint32)
    smin = cuda.shared.array(2, int32)
    W = CT // 32
    tid = cuda.threadIdx.x
    bd = cuda.blockDim.x
    chunk = int64(cuda.blockIdx.x)
    etile = int64(cuda.blockIdx.y)
    t0 = chunk * CT
    nt = min(int64(CT), T - t0)
    e0 = etile * ETILE
    ne = min(int64(ETILE), E - e0)
    g0 = t0 * K
    nslots = nt * K

    for i in range(tid, ne * W, bd):
        bits[i] = 0
    if tid < 2:
        smin[tid] = _BIG32
    cuda.syncthreads()

    # pass 1: the bitmap of counting (token, expert) pairs; smallest bad / repeated slot
    for s in range(tid, nslots, bd):
        e, state = _slot_state(routemap, g0, s, K, E)
        if state == _COUNTS:
            if e >= e0 and e < e0 + ne:
                tl = s // K
                cuda.atomic.or_(bits, (e - e0) * W + (tl >> 5), uint32(1) << uint32(tl & 31))
        elif etile == 0:
            if state == _BAD:
                cuda.atomic.min(smin, 0, int32(s))
            elif state == _REPEATED:
                cuda.atomic.min(smin, 1, int32(s))
    cuda.syncthreads()

    # the chunk's count per expert of the tile
    for el in range(tid, ne, bd):
        c = 0
        for w in range(W):
            c += cuda.popc(bits[el * W + w])
        counts[chunk * E + e0 + el] = c

    # rank of each counting slot among the chunk's tokens of its expert; -1 for the others
    for s in range(tid, nslots, bd):
        e, state = _slot_state(routemap, g0, s, K, E)
        if state == _COUNTS:
            if e >= e0 and e < e0 + ne:
                tl = s // K
                base = (e - e0) * W
                wi = tl >> 5
                rank = cuda.popc(bits[base + wi] & ((uint32(1) << uint32(tl & 31)) - uint32(1)))
                for w in range(wi):
                    rank += cuda.popc(bits[base + w])
                slot_rank[g0 + s] = rank
        elif etile == 0:
            slot_rank[g0 + s] = -1

    if etile == 0 and tid == 0:
        bad = smin[0]
        rep = smin[1]
        part[2 * chunk] = -1 if bad == _BIG32 else g0 + bad
        part[2 * chunk + 1] = -1 if rep == _BIG32 else g0 + rep


def _scan_body(counts, capacity, offsets, lim, ctot, part, routemap, status,
               NC, E, A, R, T, K, override, ex_dim):
    sums = cuda.shared.array(SCAN_BD, int64)
    tmp = cuda.shared.array(TMP_WORDS, int64)
    tid = cuda.threadIdx.x
    bd = cuda.blockDim.x

    # phase A: per expert, exclusive scan over the chunks (in place) and the total c_e.
    # Thread (ex, cy) owns expert et + ex and a contiguous range of chunks.
    ex = tid % ex_dim
    cy = tid // ex_dim
    cy_dim = bd // ex_dim
    per = (NC + cy_dim - 1) // cy_dim
    c0 = min(NC, cy * per)
    c1 = min(NC, c0 + per)
    for et in range(0, E, ex_dim):
        e = et + ex
        s = int64(0)
        if e < E:
            for c in range(c0, c1):
                s += counts[c * E + e]
        sums[tid] = s
        cuda.syncthreads()
        before = int64(0)
        total = int64(0)
        for j in range(cy_dim):
            v = sums[j * ex_dim + ex]
            if j < cy:
                before += v
            total += v
        cuda.syncthreads()
        if e < E:
            run = before
            for c in range(c0, c1):
                v = counts[c * E + e]
                counts[c * E + e] = run
                run += v
            if cy == 0:
                ctot[e] = total
    cuda.syncthreads()

    # phase B: capacities, padded sizes, offsets, filled rows; first mismatching expert
    carry = int64(0)
    mismatch = BIG
    for e0 in range(0, E, bd):
        e = e0 + tid
        padded = int64(0)
        c = int64(0)
        n = int64(0)
        if e < E:
            c = ctot[e]
            n = c
            if override == 0:
                n = capacity[e]
                if n != c and e < mismatch:
                    mismatch = e
                if n < 0:
                    n = 0
            padded = (n + A - 1) // A * A
        before, total = block_exclusive_scan_i64(padded, tmp)
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
        carry += total
    if tid == 0:
        offsets[E] = carry

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
        if bad == BIG:
            status[_abi.PERMUTE_BAD_ID] = -1
            status[_abi.PERMUTE_BAD_ID_VALUE] = -1
        else:
            status[_abi.PERMUTE_BAD_ID] = bad
            status[_abi.PERMUTE_BAD_ID_VALUE] = int64(routemap[bad])
        if rep == BIG:
            status[_abi.PERMUTE_DUPLICATE] = -1
            status[_abi.PERMUTE_DUPLICATE_VALUE] = -1
        else:
            status[_abi.PERMUTE_DUPLICATE] = rep
            status[_abi.PERMUTE_DUPLICATE_VALUE] = int64(routemap[rep])
        if mismatch == BIG:
            status[_abi.PERMUTE_MISMATCH] = -1
            status[_abi.PERMUTE_MISMATCH_COUNT] = -1
        else:
            status[_abi.PERMUTE_MISMATCH] = mismatch
            status[_abi.PERMUTE_MISMATCH_COUNT] = ctot[mismatch]
        if override != 0 and carry > R:
            status[_abi.PERMUTE_ROWS_NEEDED] = carry
        else:
            status[_abi.PERMUTE_ROWS_NEEDED] = -1


def _make_gather(hw, sw, prefetch=True):
    """The gather kernel body for hidden words of ``hw`` bytes and scale words of ``sw``.

    ``prefetch``: a token's block loads its first hidden words before it works out its
    rows, so that load's latency overlaps the dependent loads of the placement.
    """
    ldh, sth, stzh = _copy.word_ops(hw)
    lds, sts, stzs = _copy.word_ops(sw)
    PREFETCH = bool(prefetch)

    def gather(hidden, scale, routemap, probs, slot_rank, counts, offsets, lim,
               out_hidden, out_scale, rowmap, out_probs, out_indices,
               T, K, E, R, hnw, snw, has_indices, ct):
        dest = cuda.shared.array(DMAX, int64)
        flags = cuda.shared.array(PAD_ROWS, int32)
        tid = cuda.threadIdx.x
        bd = cuda.blockDim.x
        b = int64(cuda.blockIdx.x)
        if b < T:
            t = b
            chunk = t // ct
            if PREFETCH and hnw > 0:
                p0 = ldh(hidden, t * hnw + min(int64(tid), hnw - 1))
                p1 = ldh(hidden, t * hnw + min(int64(tid) + bd, hnw - 1))
            for e in range(tid, E, bd):  # the token's rowmap row: -1, then its rows below
                rowmap[t * E + e] = -1
            cuda.syncthreads()
            for kb in range(0, K, DMAX):
                nk = min(int64(DMAX), K - kb)
                for j in range(tid, nk, bd):
                    g = t * K + kb + j
                    d = int64(-1)
                    rank = slot_rank[g]
                    if rank >= 0:
                        e = int64(routemap[g])
                        row = offsets[e] + counts[chunk * E + e] + rank
                        if row < lim[e]:
                            d = row
                            rowmap[t * E + e] = row
                            out_probs[row] = probs[g]
                            if has_indices != 0:
                                out_indices[row] = e
                    dest[j] = d
                cuda.syncthreads()
                if hnw > 0:
                    src = t * hnw
                    w = int64(tid)
                    while w < hnw:
                        w1 = w + bd
                        if PREFETCH and kb == 0 and w == tid:
                            v0 = p0
                            v1 = p1
                        else:
                            v0 = ldh(hidden, src + w)
                            v1 = v0
                            if w1 < hnw:
                                v1 = ldh(hidden, src + w1)
                        j = int64(0)
                        while j < nk:
                            d = dest[j]
                            if d >= 0:
                                o = d * hnw + w
                                sth(out_hidden, o, v0)
                                if w1 < hnw:
                                    sth(out_hidden, o + bd, v1)
                            j += 1
                        w += 2 * bd
                if snw > 0:
                    src = t * snw
                    w = int64(tid)
                    while w < snw:
                        v = lds(scale, src + w)
                        j = int64(0)
                        while j < nk:
                            d = dest[j]
                            if d >= 0:
                                sts(out_scale, d * snw + w, v)
                            j += 1
                        w += bd
                cuda.syncthreads()
        else:
            r0 = (b - T) * PAD_ROWS
            nr = min(int64(PAD_ROWS), R - r0)
            for i in range(tid, nr, bd):
                r = r0 + i
                lo = int64(0)
                hi = E
                while hi - lo > 1:
                    mid = (lo + hi) >> 1
                    if offsets[mid] <= r:
                        lo = mid
                    else:
                        hi = mid
                pad = r >= lim[lo]
                flags[i] = 1 if pad else 0
                if pad:
                    out_probs[r] = 0
                    if has_indices != 0:
                        out_indices[r] = -1
            cuda.syncthreads()
            for i in range(nr):
                if flags[i] != 0:
                    r = r0 + i
                    for w in range(tid, hnw, bd):
                        stzh(out_hidden, r * hnw + w)
                    for w in range(tid, snw, bd):
                        stzs(out_scale, r * snw + w)

    return gather


# ------------------------------------------------------------------------------------------
# kernels, compiled per signature on first use

_count_jit = jit(_count_body)
_scan_jit = jit(_scan_body, max_registers=64)  # 1024-thread block
_gather_jit = {}
_KERNELS = {}

_I32P, _I64P, _U32P = P(types.int32), P(types.int64), P(types.uint32)
_I = types.int64


def _count_sig(rt):
    return types.void(P(rt), _I32P, _I32P, _I64P, _I, _I, _I)


def _scan_sig(rt):
    return types.void(_I32P, _I64P, _I64P, _I64P, _I64P, _I64P, P(rt), _I64P,
                      *([_I] * 8))


def _gather_sig(hw, sw, rt):
    h, s = P(_copy.WORD_TYPE[hw]), P(_copy.WORD_TYPE[sw])
    return types.void(h, s, P(rt), _U32P, _I32P, _I32P, _I64P, _I64P,
                      h, s, _I32P, _U32P, _I32P, *([_I] * 8))


def _gather_dispatcher(hw, sw, prefetch=True):
    d = _gather_jit.get((hw, sw, prefetch))
    if d is None:
        d = _gather_jit[(hw, sw, prefetch)] = jit(_make_gather(hw, sw, prefetch))
    return d


def _kernel(name, *key):
    k = _KERNELS.get((name, key))
    if k is None:
        if name == "count":
            k = RawKernel(_count_jit, _count_sig(_RT[key[0]]), "count")
        elif name == "scan":
            k = RawKernel(_scan_jit, _scan_sig(_RT[key[0]]), "scan")
        else:
            hw, sw, ri, prefetch = key
            k = RawKernel(_gather_dispatcher(hw, sw, prefetch), _gather_sig(hw, sw, _RT[ri]),
                          f"gather_h{hw}_s{sw}" + ("" if prefetch else "_noprefetch"))
        _KERNELS[(name, key)] = k
    return k


def all_kernels():
    """Every (name, python function, signature) this module can launch (for the PTX test)."""
    out = []
    for ri in (4, 8):
        rt = _RT[ri]
        out.append((f"count_i{ri * 8}", _count_body, _count_sig(rt)))
        out.append((f"scan_i{ri * 8}", _scan_body, _scan_sig(rt)))
        for hw in _copy.WIDTHS:
            for sw in _copy.WIDTHS[:3]:  # scale rows hold 4-byte elements
                fn = _gather_dispatcher(hw, sw).py_func
                out.append((f"gather_h{hw}_s{sw}_i{ri * 8}", fn, _gather_sig(hw, sw, rt)))
    return out


# ------------------------------------------------------------------------------------------
# host side


def _sub(buf, offset, nbytes):
    """Bytes [offset, offset + nbytes) of a scratch buffer."""
    sim = None if buf.sim_array is None else buf.sim_array.reshape(-1).view(np.uint8)
    return DeviceBuffer(buf.ptr + offset, nbytes,
                        None if sim is None else sim[offset:offset + max(nbytes, 8)])


def _arg(buf, dtype):
    """Kernel argument for an optional buffer (None: a null pointer / a dummy array)."""
    if buf is None:
        return np.zeros(2, dtype) if SIM else 0
    return buf.kernel_arg(dtype)


def _gather_block(words):
    """Threads of a gather block for rows of ``words`` words (two words per thread a pass)."""
    bd = MIN_BD
    while bd < GATHER_BD and bd * 2 < words:
        bd *= 2
    return bd


def _ex_dim(num_experts):
    """Experts the scan block handles side by side (the rest of its threads split chunks)."""
    ex = max(1, SCAN_BD // 32)  # at most 32 chunk groups: each thread sums their partials
    while ex < SCAN_BD and ex < num_experts:
        ex *= 2
    return ex


def permute(hidden, scale, routemap, probs, capacity, *, num_tokens, topk, num_experts,
            alignment, num_rows, hidden_row_bytes, scale_row_bytes, routemap_itemsize,
            out_hidden, out_scale, out_rowmap, out_probs, out_indices, status, alloc, stream):
    """Run moe_permute's kernels on ``stream``; see the module docstring and SPEC.md.

    Every output element and every status word is written. Nothing is synchronised.
    """
    T, K, E, R = int(num_tokens), int(topk), int(num_experts), int(num_rows)
    ri = int(routemap_itemsize)
    rt_dtype = np.int32 if ri == 4 else np.int64
    nc = -(-T // CT)
    net = -(-E // ETILE)

    # one scratch allocation: int64 arrays first (8-byte aligned), then int32 arrays
    o_off = 0
    o_lim = o_off + 8 * (E + 1)
    o_ctot = o_lim + 8 * E
    o_part = o_ctot + 8 * E
    o_counts = o_part + 8 * 2 * max(nc, 1)
    o_rank = o_counts + 4 * max(nc * E, 1)
    total = o_rank + 4 * max(T * K, 1)
    scratch = alloc(total)
    offsets = _sub(scratch, o_off, 8 * (E + 1)).kernel_arg(np.int64)
    lim = _sub(scratch, o_lim, 8 * E).kernel_arg(np.int64)
    ctot = _sub(scratch, o_ctot, 8 * E).kernel_arg(np.int64)
    part = _sub(scratch, o_part, 8 * 2 * max(nc, 1)).kernel_arg(np.int64)
    counts = _sub(scratch, o_counts, 4 * max(nc * E, 1)).kernel_arg(np.int32)
    ranks = _sub(scratch, o_rank, 4 * max(T * K, 1)).kernel_arg(np.int32)

    rm = routemap.kernel_arg(rt_dtype)
    rowmap = out_rowmap.kernel_arg(np.int32)
    launch = Launcher(stream)

    if T > 0:
        launch(_kernel("count", ri), (nc, net), COUNT_BD,
               (rm, ranks, counts, part, T, K, E))

    override = 1 if capacity is None else 0
    launch(_kernel("scan", ri), 1, SCAN_BD,
           (counts, _arg(capacity, np.int64), offsets, lim, ctot, part, rm,
            status.kernel_arg(np.int64), nc, E, int(alignment), R, T, K, override,
            _ex_dim(E)))

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
    blocks = T + -(-R // PAD_ROWS)
    if blocks > 0:
        hd, sd = _copy.WORD_DTYPE[hw], _copy.WORD_DTYPE[sw]
        launch(_kernel("gather", hw, sw, ri, PREFETCH), blocks, _gather_block(max(hnw, snw)),
               (_arg(hidden if hnw else None, hd), _arg(scale if snw else None, sd), rm,
                probs.kernel_arg(np.uint32), ranks, counts, offsets, lim,
                _arg(out_hidden if hnw else None, hd), _arg(out_scale if snw else None, sd),
                rowmap, _arg(out_probs if R else None, np.uint32),
                _arg(out_indices if (out_indices is not None and R) else None, np.int32),
                T, K, E, R, hnw, snw, 0 if out_indices is None else 1, CT))
