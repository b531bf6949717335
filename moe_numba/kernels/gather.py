"""moe_permute's gather stage: place each slot's row, copy each token's rows, zero padding.

Warps are workers that take items in grid stride: first the padding workers (so that they
overlap the copies), then the tokens::

    item  0 .. npw - 1      padding worker p = q * nparts + part: chunks q, q + npw / nparts,
                            ... of ``pad_rows`` rows of the sequence of all padding rows
                            (expert 0's, then expert 1's, ...); finds a chunk's first expert
                            (a LANES-ary search of padbase), a lane per expert lists the
                            chunk's rows, the warp zeroes its part of them
    item  npw + j           token t = j / nparts, part j % nparts: loads that part of its
                            hidden row (up to 28 * 32 16-byte words, into registers) and
                            (part 0) the first LANES words of its scale row, places its slots
                            (:func:`place`: a lane per slot), then stores the part to each
                            of its rows

A row's part is ``pw`` words (the last one what is left); part 0's warp writes everything
else (rowmap, probs, expert indices, scale rows). One part per row is the rule; small calls
split rows so that enough warps share the copy (:mod:`.permute` decides).

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

from . import _copy, _settings
from ._family import INDEX_TYPES, INT, KernelFamily, ptr
from ._intrinsics import SYNCWARP_WARPS, device, griddep_wait, syncwarp
from ._primitives import last_at_most
from ._settings import compiled_in

LANES = 0  # threads of a gather worker, compiled in: the settings' gather_lanes (a warp)
WARPS = min(4, SYNCWARP_WARPS)  # gather workers per block


@compiled_in
def _lanes(settings):
    """The gather worker's lanes from ``settings``."""
    global LANES
    LANES = settings.gather_lanes


class GatherKey(NamedTuple):
    """A gather variant: word widths (bytes) of the hidden and scale rows, hidden words a
    thread holds at once, the routing map's id bits."""

    hidden_word: int
    scale_word: int
    batch: int
    index_bits: int

    TAGS = ("h", "s", "b", "i")


def _gather_variants():
    batches = _settings.current.batch_words
    for hw in _copy.WIDTHS:
        for sw in _copy.WIDTHS[:3]:  # scale rows hold 4-byte elements
            for nb in batches if hw == 16 else batches[:1]:
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
        ("nparts", INT),  # parts of a row (warps that share its copy)
        ("pw", INT),  # hidden words of a part (the last part: what is left)
        ("pad_rows", INT),  # rows of a padding chunk (at most LANES)
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
    writes,
):
    """The row of routing slot ``g`` (of token ``t``, in count chunk ``chunk``), or -1 if
    it has none; with ``writes``, writes the token's rowmap entry for the slot's expert, the
    row's prob and expert index."""
    d = int64(-1)
    rank = slot_rank[g]
    e = int64(routemap[g])  # (loaded with the rank, not after it)
    # e is checked again: count checked the id it read, and another writer (a kernel on
    # another stream, the host through mapped memory) may have changed it since
    if rank >= 0 and e >= 0 and e < E:
        row = offsets[e] + counts[chunk * E + e] + rank
        if row < lim[e]:
            d = row
            if not writes:
                return d
            rowmap[t * E + e] = row
            out_probs[row] = probs[g]
            if has_indices != 0:
                out_indices[row] = e
    return d


def _make_gather(key):
    """The gather kernel of ``key``, for blocks of WARPS warps: hidden words of
    ``key.hidden_word`` bytes, scale words of ``key.scale_word`` and ``key.batch`` hidden
    words per thread at a time.

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
        nparts,
        pw,
        pad_rows,
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
        while item < npw + T * nparts:
            if item >= npw:
                t = (item - npw) // nparts
                part = item - npw - t * nparts
                lead = part == 0  # (writes the rowmap, probs, indices and scale rows)
                chunk = t // ct
                w0 = part * pw
                nw = min(pw, hnw - w0)  # the part's hidden words
                src = t * hnw + w0
                if nw > 0:
                    load(hidden, src, lane, nw, LANES, lo, hi)
                if lead and snw > 0:  # the first LANES words of the scale row, early
                    load_s(scale, t * snw, lane, snw, LANES, slo, shi)
                if lead:
                    for e in range(lane, E, LANES):  # the token's rowmap row: -1, then rows
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
                            lead,
                        )
                    dest[wb, lane] = d
                    syncwarp()
                    if nw > 0:
                        if kb > 0:
                            load(hidden, src, lane, nw, LANES, lo, hi)
                        w = lane
                        while True:
                            for j in range(nk):
                                d = dest[wb, j]
                                if d >= 0:
                                    store(out_hidden, d * hnw + w0, w, nw, LANES, lo, hi)
                            w += nb * LANES
                            if w >= nw:
                                break
                            load(hidden, src, w, nw, LANES, lo, hi)
                    if lead:
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
                # a padding worker: its part of chunks of pad_rows rows of the sequence of
                # all padding rows (expert 0's, then expert 1's, ...), every
                # (npw / nparts)-th chunk from its own
                q = item // nparts
                part = item - q * nparts
                lead = part == 0
                w0 = part * pw
                w1 = min(w0 + pw, hnw)
                step = (npw // nparts) * pad_rows  # (the chunks of the other workers)
                griddep_wait()  # (the scan's limits and padding bases)
                p0 = q * pad_rows
                while p0 < padbase[E]:
                    n = min(pad_rows, padbase[E] - p0)
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
                    if lead and lane < n:
                        r = dest[wb, lane]
                        out_probs[r] = 0
                        if has_indices != 0:
                            out_indices[r] = -1
                    for i in range(n):
                        r = dest[wb, i]
                        for w in range(w0 + lane, w1, LANES):
                            stzh(out_hidden, r * hnw + w)
                        if lead:
                            for w in range(lane, snw, LANES):
                                stzs(out_scale, r * snw + w)
                    syncwarp()  # (dest is rewritten next)
                    p0 += step
            item += stride

    return gather


GATHER = KernelFamily("gather", _gather_params, _make_gather, _gather_variants)
