"""moe_unpermute_backward's scatter stage: each token's gradient row to its rows, the rows'
probability gradients, and zeros for the rows without a pair.

Warps are workers that take items in grid stride, the zero workers first (so that they
overlap the tokens)::

    item  0 .. npz - 1   zero worker z: chunks z, z + npz, ... of LANES rows; a lane per
                         row tests its owner word (:mod:`.owner`); the rows without a pair
                         get +0.0 (dXu: streamed zero words; dp: 0)
    item  npz + j        token t = j / (shares * nparts), share s and part c of the rest:
                         loads the part's dY words (the first ``batch * LANES`` groups, into
                         registers), waits for collide, lists its rows r = rowmap[t, e] (e
                         ascending) whose owner is its entry t * E + e, keeping the s-th of
                         every ``shares`` of them, then for each row: the part of
                         dXu[r] = dY[t] (a bit copy) or rnd(float32(dY[t, h]) * p[r])
                         (weighted), with the dot product's lane partials
                         fma(dY[t, h], Xu[r, h], acc) (dot); part 0 writes dp[r] = the
                         butterfly sum of the partials (dot) + g[t, k] for each slot k
                         naming e, k ascending

One worker per token, one part per row, is the plan of a large call; a small call shares a
token's rows among several workers and, without the dot product, splits rows into parts of
``pg`` groups (the last part: what is left), so that more warps have loads in flight
(:mod:`.unpermute_backward` decides). A row's dot product is always one worker's: its lanes'
partial sums run over the whole row in a fixed order, which a split would change. Every
worker of a token lists the token's rows the same way, so the shares take each row once.

The dot product's order is the contract's (docs/gradients.rst): a *group* is the 16 bytes
that hold elements [g V, (g + 1) V) (V = 16 / itemsize), lane l owns the groups l, l + 32,
..., and takes their elements in ascending h, then :func:`._intrinsics.warp_sum_butterfly`
adds the lanes. Rows move in words of the widest width their bytes allow (:mod:`._copy`),
``16 // width`` words a group, so narrow words change the loads, never the order.

A part longer than ``batch * LANES`` groups goes batch by batch, each batch of dY loaded once
and written to (or multiplied into) every row of the worker; a lane's partial sums wait in
shared memory between batches. So each worker reads its part of the dY row once (a worker
with more than LANES rows, which only a malformed row map gives, reads it again per LANES
rows when it takes several batches), each Xu row is read once, each dXu row is written once.
The float path's only multiply-add is the dot product's explicit ``cuda.fma``; the weighted
row gradient is one float32 product, rounded once (:func:`.combine.word_lanes`).

A worker lists its token's rows LANES experts at a time (a lane per expert, one warp scan);
the row map's entries of the next LANES experts load while the lanes read the owner words
of the current ones, so that a round waits for one load rather than two in a row.
"""

from __future__ import annotations

from typing import NamedTuple

from numba import cuda, float32, int32, int64, uint32, uint64

from . import _settings
from ._convert import f32_canonical_bits
from ._copy import WORD_TYPE, word_ops
from ._family import INDEX_TYPES, INT, KernelFamily, ptr
from ._intrinsics import (
    SYNCWARP_WARPS,
    TMP_WORDS,
    device,
    griddep_wait,
    load_cg,
    syncwarp,
    warp_exclusive_scan_i64,
    warp_sum_butterfly,
)
from .combine import DATA_TYPES, ITEMSIZE, widths, word_lanes

LANES = 32  # threads of a worker, and the dot product's lanes: a warp (in the simulator too)
WARPS = min(4, SYNCWARP_WARPS)  # workers per block


class ScatterKey(NamedTuple):
    """A scatter variant: word width (bytes), data type (``abi.DATA_*``), weighted (rows
    scaled by p), dot (the dot product with Xu; weighted only), groups a thread holds at
    once, the routing map's id bits."""

    word: int
    data_type: int
    weighted: bool
    dot: bool
    batch: int
    index_bits: int

    TAGS = ("w", "d", "wt", "dot", "b", "i")


def _scatter_variants():
    for data_type in DATA_TYPES:
        for width in widths(data_type):
            for weighted, dot in ((False, False), (True, False), (True, True)):
                batches = _settings.current.batch_groups[dot]
                for nb in batches if width == 16 else batches[:1]:
                    for bits in INDEX_TYPES:
                        yield ScatterKey(width, data_type, weighted, dot, nb, bits)


def _scatter_params(key):
    """The scatter kernel's parameters (:class:`ScatterKey`)."""
    word = ptr(WORD_TYPE[key.word])
    return [
        ("dy", word),  # [T, nw] words (null when nw = 0)
        ("xu", word),  # [R, nw] words (null unless dot)
        ("rowmap", ptr(int32)),  # [T, E]
        ("routemap", ptr(INDEX_TYPES[key.index_bits])),  # [T, K]
        ("owner", ptr(int64)),  # collide's [R]
        ("probs", ptr(float32)),  # [R] (null unless weighted)
        ("gprob", ptr(float32)),  # [T, K] (null without has_g)
        ("out", word),  # out [R, nw] words (null when nw = 0)
        ("out_probs", ptr(uint32)),  # out [R] float32 bits
        ("T", INT),
        ("R", INT),
        ("E", INT),
        ("K", INT),
        ("nw", INT),  # words per row
        ("npz", INT),  # zero workers
        ("has_g", INT),  # 1: gprob is given
        ("shares", INT),  # workers that share a token's rows (each takes every shares-th)
        ("nparts", INT),  # parts of a row (without the dot product; else 1)
        ("pg", INT),  # groups of a part (the last part: what is left)
    ]


def _register_words(width):
    """(word(lo, hi, k), keep(lo, hi, k, v)): word k of a thread's register arrays (16-byte
    words: their halves in ``lo`` and ``hi``)."""
    if width == 16:

        @device
        def word(lo, hi, k):
            return (lo[k], hi[k])

        @device
        def keep(lo, hi, k, v):
            lo[k] = v[0]
            hi[k] = v[1]

    else:

        @device
        def word(lo, hi, k):
            return lo[k]

        @device
        def keep(lo, hi, k, v):
            lo[k] = v

    return word, keep


def _group_loader(ld, keep, G, n):
    """``load(src, base, q, we, lo, hi)``: the words of the groups q, q + LANES, ... (``n``
    groups of ``G`` words) of the row at ``src[base:]`` into ``lo``/``hi``, the indices
    clamped to word ``we - 1`` (the last of the row, or of its part) so that all the loads
    are in flight together."""

    @device
    def load(src, base, q, we, lo, hi):
        last = we - 1
        for u in range(n):
            for s in range(G):
                keep(lo, hi, u * G + s, ld(src, base + min((q + u * LANES) * G + s, last)))

    return load


def _chain(steps):
    """One device function ``(*args, a, *regs) -> a`` that runs ``steps`` (each of that
    form, the running value ``a`` in 7th place) in order."""
    first = steps[0]
    if len(steps) == 1:
        return first
    rest = _chain(steps[1:])

    @device
    def chained(xu, out, base, q, we, p, a, lo, hi, xlo, xhi, prods):
        a = first(xu, out, base, q, we, p, a, lo, hi, xlo, xhi, prods)
        return rest(xu, out, base, q, we, p, a, lo, hi, xlo, xhi, prods)

    return chained


@device
def _taken(x, share, shares):
    """How many of a token's first ``x`` rows (in listing order) fall to ``share``: rows
    ``share``, ``share + shares``, ..."""
    return (x + shares - 1 - share) // shares


@device
def _share(seen, pos, cnt, ok, share, shares):
    """A listing round's ``(pos, cnt, ok)`` (a lane's place among the round's rows, their
    count, whether the lane holds one) narrowed to the rows of ``share``, the token's rows
    before the round being ``seen``."""
    first = _taken(seen, share, shares)
    if (seen + pos) % shares != share:
        ok = 0
    return _taken(seen + pos, share, shares) - first, _taken(seen + cnt, share, shares) - first, ok


def _make_scatter(key):
    """The scatter kernel of one :class:`ScatterKey` variant (see the module docstring)."""
    width, data_type, NB = key.word, key.data_type, key.batch
    WEIGHTED, DOT = bool(key.weighted), bool(key.dot)
    G = 16 // width  # words per group
    NL = width // ITEMSIZE[data_type]  # elements per word
    SPAN = NB * LANES  # groups of a row per batch
    WORDS = NB * G  # register words of a thread, of dY and of Xu
    ld, st, stz = word_ops(width, streaming=True)  # (each dXu row is written once)
    lane_value, pack, _ = word_lanes(width, data_type)
    word, keep = _register_words(width)
    load_dy = _group_loader(ld, keep, G, NB)
    word_t = WORD_TYPE[width]

    @device
    def copy(out, base, q, we, lo, hi):
        """dXu: the batch's words of dY, as they are."""
        for u in range(NB):
            for s in range(G):
                w = (q + u * LANES) * G + s
                if w < we:
                    st(out, base + w, word(lo, hi, u * G + s))

    @device
    def load_step(xu, out, base, q, we, p, a, lo, hi, xlo, xhi, prods):  # (with DOT)
        """``step(..., a) -> a``: load the Xu words of the batch's groups."""
        load_dy(xu, base, q, we, xlo, xhi)
        return a

    def compute_step(u):
        """``step(..., a) -> a``: the batch's group u."""

        @device
        def step(xu, out, base, q, we, p, a, lo, hi, xlo, xhi, prods):
            for s in range(G):
                w = (q + u * LANES) * G + s
                if w < we:
                    v = word(lo, hi, u * G + s)
                    x = word(xlo, xhi, u * G + s)
                    for i in range(NL):
                        y = lane_value(v, i)
                        if DOT:
                            a = cuda.fma(y, lane_value(x, i), a)
                        prods[i] = y * p
                    st(out, base + w, pack(prods))
            return a

        return step

    # scale(xu, out, base, q, we, p, a, lo, hi, xlo, xhi, prods) -> a: dXu, the batch's words
    # of dY times p; returns a plus (DOT) the lane's fma over the batch's elements of dY and
    # Xu, ascending h. The batch's Xu words are loaded at once, then a step per group
    # follows, chained here rather than looped over in the kernel so that every index into
    # the registers is a constant (NVVM does not unroll such a loop of big bodies).
    scale = _chain(([load_step] if DOT else []) + [compute_step(u) for u in range(NB)])

    def scatter(
        dy,
        xu,
        rowmap,
        routemap,
        owner,
        probs,
        gprob,
        out,
        out_probs,
        T,
        R,
        E,
        K,
        nw,
        npz,
        has_g,
        shares,
        nparts,
        pg,
    ):
        dest = cuda.shared.array((WARPS, LANES), int64)  # a warp's rows: a token's, or zeros
        dexp = cuda.shared.array((WARPS, LANES), int64)  # the expert of each token's row
        dots = cuda.shared.array((WARPS, LANES), float32)  # the dot product of each
        part = cuda.shared.array((WARPS, LANES, LANES), float32)  # partials between batches
        tmp = cuda.shared.array(TMP_WORDS, int64)
        ftmp = cuda.shared.array(TMP_WORDS, float32)
        lo = cuda.local.array(WORDS, word_t)
        hi = cuda.local.array(WORDS, uint64)
        xlo = cuda.local.array(WORDS, word_t)
        xhi = cuda.local.array(WORDS, uint64)
        prods = cuda.local.array(NL, float32)
        lane = int64(cuda.threadIdx.x) % LANES
        wb = int64(cuda.threadIdx.x) // LANES
        item = int64(cuda.blockIdx.x) * WARPS + wb
        stride = int64(cuda.gridDim.x) * WARPS
        TE = T * E
        ngroups = (nw + G - 1) // G
        workers = shares * nparts  # a token's
        while item < npz + T * workers:
            if item >= npz:
                t = (item - npz) // workers
                share = (item - npz - t * workers) // nparts
                cpart = item - npz - t * workers - share * nparts
                g0 = cpart * pg  # the part's first group
                span = min(ngroups, g0 + pg) - g0  # its groups
                we = min(nw, (g0 + pg) * G)  # the word after its last
                f0 = t * E
                src = t * nw
                if nw > 0:
                    load_dy(dy, src, g0 + lane, we, lo, hi)
                rn = int64(rowmap[f0 + lane]) if lane < E else int64(-1)
                griddep_wait()  # (collide's owner words)
                fresh = True  # lo, hi hold the part's first batch
                n = int64(0)  # rows listed in dest
                seen = int64(0)  # the token's rows in the rounds before (every share's)
                eb = int64(0)
                while True:
                    # the next LANES experts' rows (their owner is this token's entry) of
                    # this worker's share; the row map's next LANES entries load meanwhile
                    ok = int64(0)
                    r = rn
                    pos = cnt = int64(0)
                    if eb < E:
                        e = eb + LANES + lane
                        rn = int64(rowmap[f0 + e]) if e < E else int64(-1)
                        if r >= 0 and r < R and load_cg(owner, r) == f0 + eb + lane:
                            ok = 1
                        pos, cnt = warp_exclusive_scan_i64(ok, tmp)
                        if shares > 1:
                            total = cnt
                            pos, cnt, ok = _share(seen, pos, cnt, ok, share, shares)
                            seen += total
                    if n > 0 and (eb >= E or n + cnt > LANES):  # the listed rows, now
                        if nw > 0:
                            if not fresh:
                                load_dy(dy, src, g0 + lane, we, lo, hi)
                            bq = int64(0)  # the batch's first group, in the part
                            while True:
                                q = g0 + bq + lane
                                last = bq + SPAN >= span
                                for j in range(n):
                                    row = dest[wb, j]
                                    if WEIGHTED:
                                        a = float32(0)
                                        if DOT and bq > 0:
                                            a = part[wb, j, lane]
                                        a = scale(
                                            xu, out, row * nw, q, we, probs[row], a,
                                            lo, hi, xlo, xhi, prods,
                                        )  # fmt: skip
                                        if DOT and last:
                                            a = warp_sum_butterfly(a, ftmp)
                                            if lane == 0:
                                                dots[wb, j] = a
                                        elif DOT:
                                            part[wb, j, lane] = a
                                    else:
                                        copy(out, row * nw, q, we, lo, hi)
                                if last:
                                    break
                                bq += SPAN
                                load_dy(dy, src, g0 + bq + lane, we, lo, hi)
                            fresh = bq == 0
                        syncwarp()  # (dots)
                        if cpart == 0 and lane < n:  # (part 0 writes its rows' dp)
                            d = dots[wb, lane] if DOT else float32(0)
                            if has_g != 0:
                                e = dexp[wb, lane]
                                for k in range(K):  # every slot the forward filled from it
                                    if int64(routemap[t * K + k]) == e:
                                        d = d + gprob[t * K + k]
                            out_probs[dest[wb, lane]] = f32_canonical_bits(d)
                        syncwarp()  # (dest is rewritten next)
                        n = 0
                    if eb >= E:
                        break
                    if ok != 0:
                        dest[wb, n + pos] = r
                        dexp[wb, n + pos] = eb + lane
                    n += cnt
                    syncwarp()
                    eb += LANES
            else:
                # a zero worker: rows without a pair get +0.0
                griddep_wait()  # (collide's owner words)
                c = item
                while c * LANES < R:
                    r = c * LANES + lane
                    z = int64(0)
                    if r < R:
                        o = load_cg(owner, r)
                        if not (o >= 0 and o < TE and int64(rowmap[o]) == r):
                            z = 1
                    pos, cnt = warp_exclusive_scan_i64(z, tmp)
                    if z != 0:
                        dest[wb, pos] = r
                        out_probs[r] = 0
                    syncwarp()
                    for i in range(cnt):
                        row = dest[wb, i]
                        for w in range(lane, nw, LANES):
                            stz(out, row * nw + w)
                    syncwarp()  # (dest is rewritten next)
                    c += npz
            item += stride

    return scatter


SCATTER = KernelFamily("scatter", _scatter_params, _make_scatter, _scatter_variants)
