"""moe_permute's scan stage: chunk bases, expert offsets and padding, status words.

One block per tile of ``ex_dim`` experts; the last block to finish phase A does B and C::

    phase A  chunk_bases      every block, its experts: counts[c, e] -> the rank of chunk
                              c's first token among expert e's (exclusive scan over the
                              chunks, in place), and c_e = ctot[e], the expert's tokens
    ticket                    atomic on ``done`` (zeroed by count): the last block goes on
    phase B  expert_offsets   n_e (capacity, or c_e under override), padded_e (n_e rounded
                              up to A), offsets[e] (block scan of padded_e), lim[e] (end of
                              the filled rows), padbase[e] (where expert e's padding rows
                              start among all padding rows; the total at padbase[E]); with
                              has_offsets, the output out_offsets[e] (the block's end, cut
                              at R)
    phase C  scan_status      (validate=True only) the status words: smallest bad and
                              repeated slot, first capacity mismatch, rows needed

``count_scan`` replaces count and scan for small calls with ``validate=False`` (one chunk,
one expert tile): one block counts, then scans, one launch fewer.
"""

from __future__ import annotations

from numba import cuda, int32, int64

from .. import abi
from ._family import INDEX_TYPES, INT, KernelFamily, ptr, routing_variants
from ._intrinsics import (
    TMP_WORDS,
    atomic_add,
    block_exclusive_scan_i64,
    block_min_i64,
    device,
    griddep_trigger,
    griddep_wait,
    load_cg,
    warp_exclusive_scan_i64,
)
from ._primitives import BIG, store_found
from .count import count_device


@device
def _load8(counts, c, c1, E, e, vals):
    """vals[u] = counts[(c + u) * E + e] for the chunks below c1, else 0 (8 loads in flight)."""
    for u in range(8):
        vals[u] = counts[(c + u) * E + e] if c + u < c1 else 0


@device
def chunk_bases(counts, ctot, NC, E, ex_dim, tmp, vals, tid, bd, nb):
    """Phase A (every block, its expert tiles): per expert, exclusive scan over the chunks
    (in place: the counts become each chunk's base rank) and the total c_e. Thread (ex, cy)
    owns expert et + ex and a contiguous range of chunks, read eight at a time; an expert's
    cy_dim threads are a warp (or one thread: count_scan, or no tokens). ``tid``, ``bd``,
    ``nb``: the thread's index, the block's size, the number of blocks."""
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


@device
def expert_offsets(
    e0,
    c,
    carry,
    pad_carry,
    mismatch,
    capacity,
    offsets,
    lim,
    padbase,
    out_offsets,
    has_offsets,
    E,
    A,
    R,
    override,
    tmp,
    tid,
):
    """Phase B for experts ``e0 + threadIdx.x`` (one block, ``blockDim.x`` experts a step;
    ``c``: the thread's expert's tokens, 0 past E): capacities, padded sizes, offsets,
    filled rows, where each expert's padding rows start in the sequence of all padding rows.
    Carries (rows so far, padding rows so far, the first expert whose capacity is not its
    count or BIG) from step to step."""
    e = e0 + tid
    padded = int64(0)
    n = int64(0)
    if e < E:
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
        block_end = min(off + padded, R)
        if has_offsets != 0:
            out_offsets[e] = int32(block_end)
        # padding: lim_e .. the next expert's offset (.. R for the last expert)
        end = R if e == E - 1 else block_end
        pad = max(end - (off + filled), int64(0))
    pad_before, pad_total = block_exclusive_scan_i64(pad, tmp)
    if e < E:
        padbase[e] = pad_carry + pad_before
    return carry + total, pad_carry + pad_total, mismatch


@device
def _phase_b(
    ctot, capacity, offsets, lim, padbase, out_offsets, has_offsets, E, A, R, override, tmp, tid, bd
):
    """Phase B over all E experts (one block): :func:`expert_offsets` a tile of blockDim.x
    experts at a time (each expert's tokens read from scratch with ``ld.cg``: another block
    wrote them), then ``padbase[E]``, the call's padding rows. Returns ``(rows, first
    mismatch)``: the padded rows of all experts and the first expert whose capacity is not
    its count, or BIG (with ``override`` 0)."""
    carry = int64(0)
    pad_carry = int64(0)
    mismatch = BIG
    for e0 in range(0, E, bd):
        carry, pad_carry, mismatch = expert_offsets(
            e0,
            load_cg(ctot, e0 + tid) if e0 + tid < E else int64(0),
            carry,
            pad_carry,
            mismatch,
            capacity,
            offsets,
            lim,
            padbase,
            out_offsets,
            has_offsets,
            E,
            A,
            R,
            override,
            tmp,
            tid,
        )
    if tid == 0:
        padbase[E] = pad_carry
    return carry, mismatch


@device
def scan_status(status, part, routemap, ctot, NC, R, override, carry, mismatch, tmp, tid, bd):
    """Phase C (one block): the status words (the smallest index wins)."""
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
        store_found(status, abi.PERMUTE_BAD_ID, bad, routemap)
        store_found(status, abi.PERMUTE_DUPLICATE, rep, routemap)
        if mismatch == BIG:
            status[abi.PERMUTE_MISMATCH] = -1
            status[abi.PERMUTE_MISMATCH_COUNT] = -1
        else:
            status[abi.PERMUTE_MISMATCH] = mismatch
            status[abi.PERMUTE_MISMATCH_COUNT] = load_cg(ctot, mismatch)
        if override != 0 and carry > R:
            status[abi.PERMUTE_ROWS_NEEDED] = carry
        else:
            status[abi.PERMUTE_ROWS_NEEDED] = -1


def _scan_params(key):
    """The scan kernel's parameters (:class:`._family.RoutingKey`)."""
    return [
        ("counts", ptr(int32)),  # [chunks, E]: count's counts -> each chunk's base rank
        ("capacity", ptr(int64)),  # [E] tokens_per_expert (unused under override)
        ("offsets", ptr(int64)),  # out [E]: each expert's first row
        ("lim", ptr(int64)),  # out [E]: the end of each expert's filled rows
        ("padbase", ptr(int64)),  # out [E + 1]: each expert's first padding row, the total
        ("out_offsets", ptr(int32)),  # out [E]: each expert's block end (with has_offsets)
        ("ctot", ptr(int64)),  # out [E]: tokens per expert
        ("part", ptr(int64)),  # [chunks, 2]: count's smallest bad, repeated slot
        ("routemap", ptr(INDEX_TYPES[key.index_bits])),  # (the status words' values)
        ("status", ptr(int64)),  # out: abi.PERMUTE_* (with want_status)
        ("done", ptr(int64)),  # the ticket counter (zeroed by count)
        ("NC", INT),  # chunks
        ("E", INT),
        ("A", INT),
        ("R", INT),
        ("T", INT),
        ("K", INT),
        ("override", INT),  # 1: no capacities (override_buffer_size)
        ("ex_dim", INT),  # experts per block tile
        ("want_status", INT),
        ("has_offsets", INT),
    ]


def scan(
    counts,
    capacity,
    offsets,
    lim,
    padbase,
    out_offsets,
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
    has_offsets,
):
    """The scan kernel (see the module docstring)."""
    tmp = cuda.shared.array(TMP_WORDS, int64)
    last = cuda.shared.array(1, int32)
    vals = cuda.local.array(8, int32)
    griddep_trigger()
    griddep_wait()  # (the counts)
    tid = int64(cuda.threadIdx.x)
    bd = int64(cuda.blockDim.x)
    nb = int64(cuda.gridDim.x)
    chunk_bases(counts, ctot, NC, E, ex_dim, tmp, vals, tid, bd, nb)
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
    # phase B, a tile of blockDim.x experts at a time
    carry, mismatch = _phase_b(
        ctot,
        capacity,
        offsets,
        lim,
        padbase,
        out_offsets,
        has_offsets,
        E,
        A,
        R,
        override,
        tmp,
        tid,
        bd,
    )
    if want_status == 0:  # (validate=False: nobody reads the status words)
        return
    scan_status(status, part, routemap, ctot, NC, R, override, carry, mismatch, tmp, tid, bd)


scan_device = device(scan)


def _count_scan_params(key):
    """count_scan's parameters: count's, then scan's (less what the one block fixes)."""
    return [
        ("routemap", ptr(INDEX_TYPES[key.index_bits])),
        ("slot_rank", ptr(int32)),
        ("counts", ptr(int32)),
        ("part", ptr(int64)),
        ("done", ptr(int64)),
        ("capacity", ptr(int64)),
        ("offsets", ptr(int64)),
        ("lim", ptr(int64)),
        ("padbase", ptr(int64)),
        ("out_offsets", ptr(int32)),
        ("ctot", ptr(int64)),
        ("status", ptr(int64)),  # (unused: no status words without validate)
        ("T", INT),
        ("K", INT),
        ("E", INT),
        ("A", INT),
        ("R", INT),
        ("override", INT),
        ("ex_dim", INT),
        ("ct", INT),
        ("has_offsets", INT),
    ]


def count_scan(
    routemap,
    slot_rank,
    counts,
    part,
    done,
    capacity,
    offsets,
    lim,
    padbase,
    out_offsets,
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
    has_offsets,
):
    """Small calls (one chunk, one expert tile; ``validate=False``): one block counts, then
    scans (one launch fewer, no ticket, no status words)."""
    count_device(routemap, slot_rank, counts, part, done, T, K, E, ct)
    cuda.syncthreads()
    scan_device(
        counts=counts,
        capacity=capacity,
        offsets=offsets,
        lim=lim,
        padbase=padbase,
        out_offsets=out_offsets,
        ctot=ctot,
        part=part,
        routemap=routemap,
        status=status,
        done=done,
        NC=1,
        E=E,
        A=A,
        R=R,
        T=T,
        K=K,
        override=override,
        ex_dim=ex_dim,
        want_status=0,
        has_offsets=has_offsets,
    )


SCAN = KernelFamily("scan", _scan_params, lambda key: scan, routing_variants)
COUNT_SCAN = KernelFamily(
    "count_scan", _count_scan_params, lambda key: count_scan, routing_variants
)
