"""moe_unpermute's combine stage: each token's rows, folded in ascending expert order.

A block per token and part of its row (small calls split rows so that enough blocks share
the loads; one part otherwise); each thread owns whole column words of the part::

    rowmap[t, :]    thread i takes experts [i * G, (i + 1) * G); valid rows (0 <= r < R)
        |           counted (four loads in flight), placed by one block scan
        v
    list [LMAX]     the token's rows in ascending expert id (shared)
        |
        |-- out_probs[t, k] = probs[rowmap[t, routemap[t, k]]]  (0 when there is none;
        |                 the counted variants: 0 also for a slot repeating an earlier
        |                 slot's expert, or no out_probs at all)
        '-- out[t, w]     for each word w: load it from eight rows at a time (with their
                          probabilities), fold each lane into a float32 accumulator in list
                          order, round to the data type once (mix_precision) or after every
                          step, NaN made canonical

Words are 16 bytes when the row allows (8 bf16/fp16 or 4 float32 lanes). The weighted
combine's ``cuda.fma`` is the float path's only multiply-add (explicit: the contract says
where the fma rounds). There is no warp-level reduction over the experts: a shuffle tree
would change the float32 rounding order that CPU and GPU share. A token with more valid rows
than the list holds (only with malformed rowmaps and E > LMAX) walks its rowmap row directly;
invalid entries count as -1, so the combine needs no validation.

The same body, unweighted with mix precision, is ``moe_permute_backward`` (its data gradient
is this combine of the gradient rows, its probability gradient the slot probabilities under
the counted-slot rule): the family ``COMBINE_COUNTED`` with :class:`CountedKey`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import cuda, float32, int32, int64, uint32

from .. import abi
from ._convert import bf16_to_f32, f32_canonical_bits, f32_to_bf16, f32_to_f16
from ._copy import WORD_TYPE, word_ops
from ._family import INDEX_TYPES, INT, KernelFamily, ptr
from ._intrinsics import (
    TMP_WORDS,
    block_exclusive_scan_i64,
    device,
    f16_to_f32,
    f32_from_bits,
    griddep_wait,
)
from ._settings import compiled_in

LMAX = 0  # rows a token's shared list holds, compiled in: the settings' lmax


@compiled_in
def _list_rows(settings):
    """The rows of a token's list from ``settings``."""
    global LMAX
    LMAX = settings.lmax


ITEMSIZE = {abi.DATA_FLOAT32: 4, abi.DATA_BFLOAT16: 2, abi.DATA_FLOAT16: 2}
DATA_TYPES = (abi.DATA_FLOAT32, abi.DATA_BFLOAT16, abi.DATA_FLOAT16)

_M32 = np.uint64(0xFFFFFFFF)

# what a combine writes to out_probs[t, k]: the probability of the row of the slot's expert
# (moe_unpermute), the same but 0 for a slot that repeats an earlier slot's expert (the
# counted-slot rule of moe_permute_backward), or nothing (out_probs and probs unused)
SLOT_PROBS, COUNTED_SLOTS, NO_SLOTS = 0, 1, 2


class CombineKey(NamedTuple):
    """A combine variant: word width (bytes), data type (``abi.DATA_*``), weighted,
    mix_precision, the routing map's id bits."""

    word: int
    data_type: int
    weighted: bool
    mix: bool
    index_bits: int

    TAGS = ("w", "d", "wt", "mix", "i")
    slots = SLOT_PROBS  # (a class constant: every moe_unpermute variant writes them)


class CountedKey(NamedTuple):
    """A ``moe_permute_backward`` variant of the combine (unweighted, mix precision): word
    width (bytes), data type, ``COUNTED_SLOTS`` or ``NO_SLOTS``, the routing map's id bits."""

    word: int
    data_type: int
    slots: int
    index_bits: int

    TAGS = ("w", "d", "p", "i")
    weighted = False
    mix = True


def widths(data_type):
    """The word widths a combine of ``data_type`` rows may use (falling)."""
    return (16, 8, 4) if data_type == abi.DATA_FLOAT32 else (16, 8, 4, 2)


def _combine_variants():
    for data_type in DATA_TYPES:
        for width in widths(data_type):
            for weighted in (False, True):
                for mix in (False, True):
                    for bits in INDEX_TYPES:
                        yield CombineKey(width, data_type, weighted, mix, bits)


def _counted_variants():
    for data_type in DATA_TYPES:
        for width in widths(data_type):
            for slots in (COUNTED_SLOTS, NO_SLOTS):
                for bits in INDEX_TYPES:
                    yield CountedKey(width, data_type, slots, bits)


def _combine_params(key):
    """The combine kernel's parameters (:class:`CombineKey`)."""
    word = ptr(WORD_TYPE[key.word])
    return [
        ("rows", word),  # [R, nw] words (null when R = 0)
        ("rowmap", ptr(int32)),  # [T, E]
        ("routemap", ptr(INDEX_TYPES[key.index_bits])),  # [T, K]
        ("probs", ptr(float32)),  # [R] (null when R = 0 or NO_SLOTS)
        ("out", word),  # out [T, nw] words (null when nw = 0)
        ("out_probs", ptr(float32)),  # out [T, K] (null with NO_SLOTS)
        ("R", INT),
        ("E", INT),
        ("K", INT),
        ("nw", INT),  # words per row
        ("pw", INT),  # words per part of a row (blockIdx.y: the part; the last: what is left)
        ("first", INT),  # 1: the call's first kernel (it waits for the caller's)
    ]


@device
def _valid(r, R):
    return 1 if r >= 0 and r < R else 0


# uint32 unit j of a word, per word width (j is a constant once the lane loops unroll)
@device
def _unit16(v, j):
    q = v[j >> 1]
    if (j & 1) == 0:
        return np.uint32(q & _M32)
    return np.uint32(q >> np.uint64(32))


@device
def _unit8(v, j):
    if j == 0:
        return np.uint32(v & _M32)
    return np.uint32(v >> np.uint64(32))


@device
def _unit4(v, j):
    return np.uint32(v)


_UNIT = {16: _unit16, 8: _unit8, 4: _unit4, 2: _unit4}


@device
def _join16(u):
    lo = np.uint64(u[0]) | (np.uint64(u[1]) << np.uint64(32))
    hi = np.uint64(u[2]) | (np.uint64(u[3]) << np.uint64(32))
    return (lo, hi)


@device
def _join8(u):
    return np.uint64(u[0]) | (np.uint64(u[1]) << np.uint64(32))


@device
def _join4(u):
    return np.uint32(u[0])


@device
def _join2(u):
    return np.uint16(u[0])


_JOIN = {16: _join16, 8: _join8, 4: _join4, 2: _join2}


def word_lanes(width, data_type):
    """Device functions for the float lanes of a word of ``width`` bytes of ``data_type``
    rows (``NL = width // itemsize`` lanes, lane i holding element i of the word):
    ``(lane(v, i) -> float32, pack(values) -> word, round_trip(f) -> float32)``.

    ``pack`` rounds the ``NL`` float32 ``values`` (a local array) to the data type, NaN made
    canonical, and joins them into a word; ``round_trip`` is that rounding, back in float32.
    """
    esize = ITEMSIZE[data_type]
    NL = width // esize  # lanes per word
    NU = max(1, width // 4)  # uint32 units per word
    PER_UNIT = 1 if esize == 4 else 2
    join = _JOIN[width]
    unit = _UNIT[width]
    if data_type == abi.DATA_FLOAT32:

        @device
        def lane(v, i):
            return f32_from_bits(unit(v, i))

        @device
        def to_bits(f):
            return f32_canonical_bits(f)

        @device
        def round_trip(f):
            return f

    elif data_type == abi.DATA_BFLOAT16:

        @device
        def lane(v, i):
            x = unit(v, i >> 1)
            if (i & 1) == 0:
                return f32_from_bits(x << np.uint32(16))
            return f32_from_bits(x & np.uint32(0xFFFF0000))

        @device
        def to_bits(f):
            return f32_to_bf16(f)

        @device
        def round_trip(f):
            return bf16_to_f32(f32_to_bf16(f))

    else:

        @device
        def lane(v, i):
            x = unit(v, i >> 1)
            if (i & 1) == 0:
                return f16_to_f32(x & np.uint32(0xFFFF))
            return f16_to_f32(x >> np.uint32(16))

        @device
        def to_bits(f):
            return f32_to_f16(f)

        @device
        def round_trip(f):
            return f16_to_f32(f32_to_f16(f))

    @device
    def pack(values):
        u = cuda.local.array(NU, uint32)
        for j in range(NU):
            u[j] = np.uint32(0)
        for i in range(NL):
            b = to_bits(values[i])
            if PER_UNIT == 1:
                u[i] = b
            elif (i & 1) == 0:
                u[i >> 1] = u[i >> 1] | b
            else:
                u[i >> 1] = u[i >> 1] | (b << np.uint32(16))
        return join(u)

    return lane, pack, round_trip


def _make_combine(key):
    """The combine kernel of one :class:`CombineKey` variant."""
    width, data_type = key.word, key.data_type
    NL = width // ITEMSIZE[data_type]  # lanes per word
    ld = word_ops(width)[0]
    st = word_ops(width)[1]
    lane, pack, round_trip = word_lanes(width, data_type)
    WEIGHTED = bool(key.weighted)
    MIX = bool(key.mix)
    SLOTS = key.slots

    @device
    def prob(probs, r):
        return probs[r] if WEIGHTED else float32(0)

    @device
    def step(acc, v, p):
        for i in range(NL):
            x = lane(v, i)
            if WEIGHTED:
                a = cuda.fma(x, p, acc[i])
            else:
                a = acc[i] + x
            if not MIX:
                a = round_trip(a)
            acc[i] = a

    def combine(rows, rowmap, routemap, probs, out, out_probs, R, E, K, nw, pw, first):
        if first != 0:
            griddep_wait()  # (the caller's kernels; after check it needs nothing of check's)
        lst_row = cuda.shared.array(LMAX, int32)
        tmp = cuda.shared.array(TMP_WORDS, int64)
        tid = int64(cuda.threadIdx.x)
        bd = int64(cuda.blockDim.x)
        t = int64(cuda.blockIdx.x)
        w0 = int64(cuda.blockIdx.y) * pw  # the part's words: w0 .. w1 - 1
        w1 = min(nw, w0 + pw)

        # 1) the token's valid rows, ascending expert id. Thread tid owns experts
        # [tid * G, tid * G + G): it counts its valid rows (four loads in flight), one block
        # scan places them.
        G = (E + bd - 1) // bd
        eb = min(E, tid * G)
        ee = min(E, eb + G)
        f0 = t * E
        cnt = int64(0)
        e = eb
        while e < ee:
            r0 = int64(rowmap[f0 + e])
            r1 = int64(rowmap[f0 + e + 1]) if e + 1 < ee else int64(-1)
            r2 = int64(rowmap[f0 + e + 2]) if e + 2 < ee else int64(-1)
            r3 = int64(rowmap[f0 + e + 3]) if e + 3 < ee else int64(-1)
            cnt += _valid(r0, R) + _valid(r1, R) + _valid(r2, R) + _valid(r3, R)
            e += 4
        q, n = block_exclusive_scan_i64(cnt, tmp)
        qe = min(q + cnt, int64(LMAX))  # the end of this thread's entries
        e = eb
        while e < ee and q < qe:  # (rereads hit L1)
            r = int64(rowmap[f0 + e])
            if r >= 0 and r < R:
                lst_row[q] = r
                q += 1
            e += 1
        # Fewer valid rows than counted: another writer (a kernel on another stream, the
        # host through mapped memory) changed the rowmap since. Every entry stays a row
        # (row 0: cnt > 0 means R > 0); the output is garbage, no load leaves the rows.
        while q < qe:
            lst_row[q] = 0
            q += 1

        # 2) expert_prob_topk (the slot probabilities, a copy of each row's; by part 0)
        if SLOTS != NO_SLOTS and w0 == 0:
            k = tid
            while k < K:
                g = t * K + k
                i = int64(routemap[g])
                p = float32(0)
                if i >= 0 and i < E:
                    counted = True
                    if SLOTS == COUNTED_SLOTS:  # not counted: an earlier slot names i
                        for j in range(t * K, g):
                            if int64(routemap[j]) == i:
                                counted = False
                    r = int64(rowmap[f0 + i])
                    if counted and r >= 0 and r < R:
                        p = probs[r]
                out_probs[g] = p
                k += bd
        cuda.syncthreads()  # the list is complete

        # 3) combine the rows, word by word, eight rows' loads in flight at a time: the
        # loads of a group come before its folds (a group past the list's end loads its
        # last row again, folded once)
        acc = cuda.local.array(NL, float32)
        ob = t * nw
        if n <= LMAX:
            for w in range(w0 + tid, w1, bd):
                for i in range(NL):
                    acc[i] = float32(0)
                j = 0
                while j < n:
                    m = n - j  # rows left (the group folds min(m, 8) of them)
                    r0 = int64(lst_row[j])
                    r1 = int64(lst_row[j + min(1, m - 1)])
                    r2 = int64(lst_row[j + min(2, m - 1)])
                    r3 = int64(lst_row[j + min(3, m - 1)])
                    r4 = int64(lst_row[j + min(4, m - 1)])
                    r5 = int64(lst_row[j + min(5, m - 1)])
                    r6 = int64(lst_row[j + min(6, m - 1)])
                    r7 = int64(lst_row[j + min(7, m - 1)])
                    v0 = ld(rows, r0 * nw + w)
                    p0 = prob(probs, r0)
                    v1 = ld(rows, r1 * nw + w)
                    p1 = prob(probs, r1)
                    v2 = ld(rows, r2 * nw + w)
                    p2 = prob(probs, r2)
                    v3 = ld(rows, r3 * nw + w)
                    p3 = prob(probs, r3)
                    v4 = ld(rows, r4 * nw + w)
                    p4 = prob(probs, r4)
                    v5 = ld(rows, r5 * nw + w)
                    p5 = prob(probs, r5)
                    v6 = ld(rows, r6 * nw + w)
                    p6 = prob(probs, r6)
                    v7 = ld(rows, r7 * nw + w)
                    p7 = prob(probs, r7)
                    step(acc, v0, p0)
                    if m > 1:
                        step(acc, v1, p1)
                    if m > 2:
                        step(acc, v2, p2)
                    if m > 3:
                        step(acc, v3, p3)
                    if m > 4:
                        step(acc, v4, p4)
                    if m > 5:
                        step(acc, v5, p5)
                    if m > 6:
                        step(acc, v6, p6)
                    if m > 7:
                        step(acc, v7, p7)
                    j += 8
                st(out, ob + w, pack(acc))
        else:
            for w in range(w0 + tid, w1, bd):
                for i in range(NL):
                    acc[i] = float32(0)
                for e in range(E):
                    r = int64(rowmap[t * E + e])
                    if r >= 0 and r < R:
                        step(acc, ld(rows, r * nw + w), prob(probs, r))
                st(out, ob + w, pack(acc))

    return combine


COMBINE = KernelFamily("combine", _combine_params, _make_combine, _combine_variants)
COMBINE_COUNTED = KernelFamily("combine_counted", _combine_params, _make_combine, _counted_variants)
