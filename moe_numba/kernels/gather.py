"""moe_permute's gather stage: place each slot's row, copy each token's rows, zero padding.

Warps are workers that take items in grid stride: first the padding workers (so that they
overlap the copies), then the tokens::

    item  0 .. npw - 1      padding worker p: chunks p, p + npw, ... of PAD_ROWS rows of the
                            sequence of all padding rows (expert 0's, then expert 1's, ...);
                            finds a chunk's first expert (a LANES-ary search of padbase), a
                            lane per expert lists the chunk's rows, the warp zeroes them
    item  npw + t           token t: loads its hidden row (up to 28 * 32 16-byte words, into
                            registers) and the first LANES words of its scale row, places
                            its slots (:func:`place`: a lane per slot), then stores the row
                            to each of its rows

``place``: slot g of token t (count chunk c) goes to row ``offsets[e] + counts[c, e] +
slot_rank[g]`` of its expert e (the chunk's base rank from the scan, the slot's rank from
count), kept when below ``lim[e]``; it writes the token's rowmap entry, the row's prob and
expert index. The token's rowmap row is -1 first, written by the same warp.

The copy is token-major: each input row is read once and written K times, the byte count
of the contract (a row-major gather over the output rows would read every input row K times
from DRAM). Rows move in the widest word they allow (:mod:`._copy`); 16-byte stores and the
padding's zeros carry the streaming cache hint (every output row is written once). The
gather waits for the scan (:func:`._intrinsics.griddep_wait`) only after it has loaded its
first row.
"""

from __future__ import annotations

from typing import NamedTuple

from numba import cuda, int32, int64, uint32, uint64

from . import _copy
from ._family import INDEX_TYPES, INT, KernelFamily, ptr
from ._intrinsics import SYNCWARP_WARPS, device, griddep_wait, syncwarp
from ._primitives import last_at_most

LANES = 32  # threads of a gather worker: a warp (the simulator's tests shrink it)
WARPS = min(4, SYNCWARP_WARPS)  # gather workers per block
BATCH_WORDS = (4, 8, 16, 28)  # hidden words a gather thread may hold at once (rising)
PAD_ROWS = 32  # rows of a padding worker's chunk (at most LANES)


class GatherKey(NamedTuple):
    """A gather variant: word widths (bytes) of the hidden and scale rows, hidden words a
    thread holds at once, the routing map's id bits."""

    hidden_word: int
    scale_word: int
    batch: int
    index_bits: int

    TAGS = ("h", "s", "b", "i")


def _gather_variants():
    for hw in _copy.WIDTHS:
        for sw in _copy.WIDTHS[:3]:  # scale rows hold 4-byte elements
            for nb in BATCH_WORDS if hw == 16 else BATCH_WORDS[:1]:
                for bits in INDEX_TYPES:
                    yield GatherKey(hw, sw, nb, bits)


def _gather_params(key):
    """The gather kernel's parameters (:class:`GatherKey`)."""
    h, s = ptr(_copy.WORD_TYPE[key.hidden_word]), ptr(_copy.WORD_TYPE[key.scale_word])
    return [
        ("hidden", h),  # [T, hnw] words (null when rows are not copied)
        ("scale", s),  # [T, snw] words (null when no scale rows are copied)
        ("routemap", ptr(INDEX_TYPES[key.index_bits])),  # [T, K]
        ("probs", ptr(uint32)),  # [T, K] float32 bits
        ("slot_rank", ptr(int32)),  # count's ranks [T, K]
        ("counts", ptr(int32)),  # scan's chunk bases [chunks, E]
        ("offsets", ptr(int64)),  # scan's [E]
        ("lim", ptr(int64)),  # scan's [E]
        ("padbase", ptr(int64)),  # scan's [E + 1]
        ("out_hidden", h),  # out [R, hnw]
        ("out_scale", s),  # out [R, snw]
        ("rowmap", ptr(int32)),  # out [T, E]
        ("out_probs", ptr(uint32)),  # out [R]
        ("out_indices", ptr(int32)),  # out [R] (with has_indices)
        ("T", INT),
        ("K", INT),
        ("E", INT),
        ("npw", INT),  # padding workers
        ("hnw", INT),  # hidden words per row
        ("snw", INT),  # scale words per row
        ("has_indices", INT),
        ("ct", INT),  # tokens per count chunk
    ]


@device
def place(
    g,
    t,
    chunk,
    routemap,
    probs,
    slot_rank,
    counts,
    offsets,
    lim,
    rowmap,
    out_probs,
    out_indices,
    E,
    has_indices,
):
    """The row of routing slot ``g`` (of token ``t``, in count chunk ``chunk``), or -1 if
    it has none; writes the token's rowmap entry for the slot's expert, the row's prob and
    expert index."""
    d = int64(-1)
    rank = slot_rank[g]
    e = int64(routemap[g])  # (loaded with the rank, not after it)
    # e is checked again: count checked the id it read, and another writer (a kernel on
    # another stream, the host through mapped memory) may have changed it since
    if rank >= 0 and e >= 0 and e < E:
        row = offsets[e] + counts[chunk * E + e] + rank
        if row < lim[e]:
            d = row
            rowmap[t * E + e] = row
            out_probs[row] = probs[g]
            if has_indices != 0:
                out_indices[row] = e
    return d


def _make_gather(key):
    """The gather kernel for hidden words of ``key.hidden_word`` bytes, scale words of
    ``key.scale_word`` and ``key.batch`` hidden words per thread at a time.

    Every warp is a worker that takes items (padding workers first, then tokens) in grid
    stride. A token's warp loads the first ``nb * LANES`` words of its hidden row (the whole
    row, for rows up to ``28 * 32`` 16-byte words) before it works out its rows, so that the
    loads' latency overlaps the dependent loads of the placement, then stores them to each
    of the token's rows. Reading the row in big batches matters: an H200 mixes the few reads
    into the many writes badly when they come in small pieces.
    """
    hw, sw, nb = key.hidden_word, key.scale_word, key.batch
    # every output row is written once: streaming stores (the L2 evicts those lines first)
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
        box = cuda.shared.array(WARPS, int64)  # a warp's word for last_at_most
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
                griddep_wait()  # (the scan's offsets and limits)
                syncwarp()
                for kb in range(0, K, LANES):
                    nk = min(LANES, K - kb)
                    d = int64(-1)
                    if lane < nk:
                        d = place(
                            t * K + kb + lane,
                            t,
                            chunk,
                            routemap,
                            probs,
                            slot_rank,
                            counts,
                            offsets,
                            lim,
                            rowmap,
                            out_probs,
                            out_indices,
                            E,
                            has_indices,
                        )
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
                griddep_wait()  # (the scan's limits and padding bases)
                p0 = item * PAD_ROWS
                while p0 < padbase[E]:
                    n = min(PAD_ROWS, padbase[E] - p0)
                    # a lane per expert, from the one that holds padding row p0: the rows
                    # of its padding in the chunk
                    eb = last_at_most(padbase, E, p0, lane, LANES, box, wb)
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


GATHER = KernelFamily("gather", _gather_params, _make_gather, _gather_variants)
