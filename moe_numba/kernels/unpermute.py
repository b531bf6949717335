"""moe_unpermute on the GPU: [init -> check ->] combine.

``init``     (``validate=True`` only) one thread: check's two running minima and its
             ticket counter, in a small scratch buffer.
``check``    (``validate=True`` only) grid-stride over the rowmap and the routing map: each
             block finds its smallest rowmap entry outside [-1, R) and routing slot outside
             [-1, E), folds them into the minima (atomic min) and takes a ticket; the block
             that takes the last ticket writes the status words. The host waits for this
             kernel only (:mod:`._status`), not for the combine, which is launched as its
             programmatic dependent (:mod:`._griddep`): it needs nothing of check's and
             may run alongside it.
``combine``  one block per token. The block reads the token's rowmap row (each thread a
             contiguous group of experts) and places its valid rows (``0 <= rowmap[t, e] <
             R``) in ascending expert order into a shared list (one block scan of the group
             counts), and writes the token's ``expert_prob_topk`` row. Then it
             combines column words: each thread owns whole words (16 bytes when the row
             allows: 8 bf16/fp16 or 4 float32 lanes), loads them from four rows at a time
             (with their probabilities) and folds them into float32 accumulators in list
             order (``cuda.fma`` for the weighted combine, the only multiply-add of the float
             path), then rounds once (or after every step when ``mix_precision`` is off) to
             the data type, NaN made canonical. A token with more valid rows than the list
             holds (only with malformed rowmaps and E > LMAX) walks its rowmap row directly.
             Invalid entries count as -1, so the combine needs no validation.

The call's first kernel (init, or the combine when ``validate=False``) is launched as a
programmatic dependent of the caller's kernel ahead of it and waits for it first thing, so
its launch overlaps that kernel's end (:mod:`._griddep`).

Kernels are built per (word width, data type, weighted, mix_precision) and compiled per
signature on first use.
"""

from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32, int64, uint32
from numba.cuda import types

from .. import _abi
from . import _convert as cv
from . import _griddep as griddep
from ._buffer import carve
from ._copy import word_ops, word_width
from ._launch import Launcher, RawKernel, jit, optional_arg
from ._primitives import (
    BIG,
    TMP_WORDS,
    atomic_add,
    atomic_min,
    block_exclusive_scan_i64,
    block_min_i64,
    device,
    store_found,
)
from ._status import StatusWords

COMBINE_BD = 128  # most threads of a combine block (measured: 128 > 256 > 512 on an H200)
MIN_BD = 32  # fewest threads of a combine block (a warp)
LMAX = 256  # rows a token's shared list holds
CHECK_BD = 256  # threads of a check block
CHECK_BLOCKS = 1024  # most check blocks (each thread then reads a few entries)

# check's scratch words
_BAD_ROW, _BAD_ID, _TICKET = 0, 1, 2

P = types.CPointer
_RT = {4: types.int32, 8: types.int64}
_ITEMSIZE = {_abi.DATA_FLOAT32: 4, _abi.DATA_BFLOAT16: 2, _abi.DATA_FLOAT16: 2}
_WORD_TYPE = {16: types.uint64, 8: types.uint64, 4: types.uint32, 2: types.uint16}
_WORD_DTYPE = {16: np.uint64, 8: np.uint64, 4: np.uint32, 2: np.uint16}

_M32 = np.uint64(0xFFFFFFFF)


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


def _make_lane_ops(width, data_type):
    """(lane(v, i) -> float32, to_bits(f) -> uint32, round_trip(f) -> float32)."""
    unit = _UNIT[width]
    if data_type == _abi.DATA_FLOAT32:

        @device
        def lane(v, i):
            return cv.f32_from_bits(unit(v, i))

        @device
        def to_bits(f):
            return cv.f32_canonical_bits(f)

        @device
        def round_trip(f):
            return f

    elif data_type == _abi.DATA_BFLOAT16:

        @device
        def lane(v, i):
            x = unit(v, i >> 1)
            if (i & 1) == 0:
                return cv.f32_from_bits(x << np.uint32(16))
            return cv.f32_from_bits(x & np.uint32(0xFFFF0000))

        @device
        def to_bits(f):
            return cv.f32_to_bf16(f)

        @device
        def round_trip(f):
            return cv.bf16_to_f32(cv.f32_to_bf16(f))

    else:

        @device
        def lane(v, i):
            x = unit(v, i >> 1)
            if (i & 1) == 0:
                return cv.f16_to_f32(x & np.uint32(0xFFFF))
            return cv.f16_to_f32(x >> np.uint32(16))

        @device
        def to_bits(f):
            return cv.f32_to_f16(f)

        @device
        def round_trip(f):
            return cv.f16_to_f32(cv.f32_to_f16(f))

    return lane, to_bits, round_trip


def _make_combine(width, data_type, weighted, mix):
    """The combine kernel body for one (word width, data type, weighted, mix) variant."""
    esize = _ITEMSIZE[data_type]
    NL = width // esize  # lanes per word
    NU = max(1, width // 4)  # uint32 units per word
    PER_UNIT = 1 if esize == 4 else 2
    ld = word_ops(width)[0]
    st = word_ops(width)[1]
    join = _JOIN[width]
    lane, to_bits, round_trip = _make_lane_ops(width, data_type)
    WEIGHTED = bool(weighted)
    MIX = bool(mix)

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

    @device
    def pack(acc):
        u = cuda.local.array(NU, uint32)
        for j in range(NU):
            u[j] = np.uint32(0)
        for i in range(NL):
            b = to_bits(acc[i])
            if PER_UNIT == 1:
                u[i] = b
            elif (i & 1) == 0:
                u[i >> 1] = u[i >> 1] | b
            else:
                u[i >> 1] = u[i >> 1] | (b << np.uint32(16))
        return join(u)

    def combine(rows, rowmap, routemap, probs, out, out_probs, R, E, K, nw, first):
        if first != 0:
            griddep.wait()  # (the caller's kernels; after check it needs nothing of check's)
        lst_row = cuda.shared.array(LMAX, int32)
        tmp = cuda.shared.array(TMP_WORDS, int64)
        tid = int64(cuda.threadIdx.x)
        bd = int64(cuda.blockDim.x)
        t = int64(cuda.blockIdx.x)

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
        e = eb
        while e < ee and q < LMAX:  # (rereads hit L1)
            r = int64(rowmap[f0 + e])
            if r >= 0 and r < R:
                lst_row[q] = r
                q += 1
            e += 1

        # 2) expert_prob_topk
        k = tid
        while k < K:
            g = t * K + k
            i = int64(routemap[g])
            p = float32(0)
            if i >= 0 and i < E:
                r = int64(rowmap[f0 + i])
                if r >= 0 and r < R:
                    p = probs[r]
            out_probs[g] = p
            k += bd
        cuda.syncthreads()  # the list is complete

        # 3) combine the rows, word by word
        acc = cuda.local.array(NL, float32)
        ob = t * nw
        if n <= LMAX:
            for w in range(tid, nw, bd):
                for i in range(NL):
                    acc[i] = float32(0)
                j = 0
                p0 = p1 = p2 = p3 = float32(0)
                while j + 4 <= n:
                    r0 = int64(lst_row[j])
                    r1 = int64(lst_row[j + 1])
                    r2 = int64(lst_row[j + 2])
                    r3 = int64(lst_row[j + 3])
                    v0 = ld(rows, r0 * nw + w)
                    v1 = ld(rows, r1 * nw + w)
                    v2 = ld(rows, r2 * nw + w)
                    v3 = ld(rows, r3 * nw + w)
                    if WEIGHTED:  # (loaded next to the rows: no extra round trip)
                        p0 = probs[r0]
                        p1 = probs[r1]
                        p2 = probs[r2]
                        p3 = probs[r3]
                    step(acc, v0, p0)
                    step(acc, v1, p1)
                    step(acc, v2, p2)
                    step(acc, v3, p3)
                    j += 4
                while j < n:
                    r0 = int64(lst_row[j])
                    v0 = ld(rows, r0 * nw + w)
                    if WEIGHTED:
                        p0 = probs[r0]
                    step(acc, v0, p0)
                    j += 1
                st(out, ob + w, pack(acc))
        else:
            for w in range(tid, nw, bd):
                for i in range(NL):
                    acc[i] = float32(0)
                for e in range(E):
                    r = int64(rowmap[t * E + e])
                    if r >= 0 and r < R:
                        step(acc, ld(rows, r * nw + w), probs[r])
                st(out, ob + w, pack(acc))

    return combine


@device
def _valid(r, R):
    return 1 if r >= 0 and r < R else 0


@device
def _first_bad(values, n, low, high, start, stride):
    """Smallest index ``i = start + j * stride < n`` with ``values[i]`` outside
    ``[low, high)``, or BIG."""
    i = start
    while i < n:
        v = int64(values[i])
        if v < low or v >= high:
            return i
        i += stride
    return BIG


def _init_body(minima):
    """Before check: the two running minima (none yet) and check's ticket counter."""
    griddep.wait()  # (the caller's kernels)
    if cuda.threadIdx.x == 0:
        minima[_BAD_ROW] = BIG
        minima[_BAD_ID] = BIG
        minima[_TICKET] = 0


def _check_body(rowmap, routemap, minima, status, T, R, E, K):
    """Validation (``validate=True``), before combine: the smallest rowmap entry outside
    [-1, R) and routing slot outside [-1, E), grid-stride; each block folds its minima into
    ``minima`` (atomic min) and takes a ticket; the last block writes the status words."""
    griddep.trigger()  # the combine may launch now (it needs nothing of this kernel's)
    tmp = cuda.shared.array(TMP_WORDS, int64)
    tid = int64(cuda.threadIdx.x)
    nb = int64(cuda.gridDim.x)
    start = int64(cuda.blockIdx.x) * int64(cuda.blockDim.x) + tid
    stride = nb * int64(cuda.blockDim.x)
    bad_row = block_min_i64(_first_bad(rowmap, T * E, -1, R, start, stride), tmp)
    bad_id = block_min_i64(_first_bad(routemap, T * K, -1, E, start, stride), tmp)
    griddep.wait()  # (init's minima)
    if tid == 0:
        if bad_row != BIG:
            atomic_min(minima, _BAD_ROW, bad_row)
        if bad_id != BIG:
            atomic_min(minima, _BAD_ID, bad_id)
        cuda.threadfence()
        if atomic_add(minima, _TICKET, 1) == nb - 1:
            cuda.threadfence()
            store_found(status, _abi.UNPERMUTE_BAD_ID, atomic_min(minima, _BAD_ID, BIG), routemap)
            store_found(status, _abi.UNPERMUTE_BAD_ROW, atomic_min(minima, _BAD_ROW, BIG), rowmap)


# ------------------------------------------------------------------------------------------
# kernels, compiled per signature on first use

_init_jit = jit(_init_body)
_check_jit = jit(_check_body)
_combine_jit = {}
_KERNELS = {}
_I32P, _I64P, _F32P = P(types.int32), P(types.int64), P(types.float32)
_I = types.int64


def _combine_sig(width, rt):
    wt = P(_WORD_TYPE[width])
    return types.void(wt, _I32P, P(rt), _F32P, wt, _F32P, *([_I] * 5))


_INIT_SIG = types.void(_I64P)


def _check_sig(rt):
    return types.void(_I32P, P(rt), _I64P, _I64P, *([_I] * 4))


def _combine_dispatcher(width, data_type, weighted, mix):
    key = (width, data_type, bool(weighted), bool(mix))
    d = _combine_jit.get(key)
    if d is None:
        d = _combine_jit[key] = jit(_make_combine(*key))
    return d


def _widths(data_type):
    return (16, 8, 4) if data_type == _abi.DATA_FLOAT32 else (16, 8, 4, 2)


def _kernel(name, *key):
    k = _KERNELS.get((name, key))
    if k is None:
        if name == "init":
            k = RawKernel(_init_jit, _INIT_SIG, "init")
        elif name == "check":
            k = RawKernel(_check_jit, _check_sig(_RT[key[0]]), "check")
        else:
            width, data_type, weighted, mix, ri = key
            k = RawKernel(
                _combine_dispatcher(width, data_type, weighted, mix),
                _combine_sig(width, _RT[ri]),
                f"combine_w{width}_d{data_type}_{int(weighted)}{int(mix)}",
            )
        _KERNELS[(name, key)] = k
    return k


def all_kernels():
    """Every (name, python function, signature) this module can launch (for the PTX test)."""
    out = [("init", _init_body, _INIT_SIG)]
    for ri in (4, 8):
        rt = _RT[ri]
        out.append((f"check_i{ri * 8}", _check_body, _check_sig(rt)))
        for data_type in (_abi.DATA_FLOAT32, _abi.DATA_BFLOAT16, _abi.DATA_FLOAT16):
            for width in _widths(data_type):
                for weighted in (False, True):
                    for mix in (False, True):
                        fn = _combine_dispatcher(width, data_type, weighted, mix).py_func
                        out.append(
                            (
                                f"combine_w{width}_d{data_type}_{int(weighted)}{int(mix)}"
                                f"_i{ri * 8}",
                                fn,
                                _combine_sig(width, rt),
                            )
                        )
    return out


# ------------------------------------------------------------------------------------------
# host side


def _combine_block(words):
    bd = MIN_BD
    while bd < COMBINE_BD and bd * 2 < words:
        bd *= 2
    return bd


def unpermute(
    rows,
    rowmap,
    routemap,
    probs,
    *,
    num_tokens,
    num_rows,
    hidden,
    num_experts,
    topk,
    data_type,
    routemap_itemsize,
    weighted,
    mix_precision,
    out_hidden,
    out_probs,
    validate,
    alloc,
    stream,
):
    """Run moe_unpermute's kernels on ``stream``; see the module docstring and SPEC.md.

    Every output element is written. Nothing is synchronised. With ``validate=True``
    returns the call's :class:`StatusWords` (final once check has run; ``alloc`` gives
    check's scratch), else None (no check, no scratch).
    """
    T, R, H, E, K = int(num_tokens), int(num_rows), int(hidden), int(num_experts), int(topk)
    ri = int(routemap_itemsize)
    rt_dtype = np.int32 if ri == 4 else np.int64
    esize = _ITEMSIZE[data_type]
    width = max(esize, word_width(H * esize, rows, out_hidden, widths=_widths(data_type)))
    nw = H * esize // width
    wd = _WORD_DTYPE[width]

    rm = routemap.kernel_arg(rt_dtype)
    rmap = rowmap.kernel_arg(np.int32)
    launch = Launcher(stream)
    status = None
    if validate:
        status = StatusWords(launch, _abi.UNPERMUTE_STATUS_LEN)
        (minima,) = carve(alloc, ((3, np.dtype(np.int64)),))
        launch(_kernel("init"), 1, 32, (minima,), dependent=True)
        n = max(T * E, T * K)
        blocks = max(1, min(CHECK_BLOCKS, -(-n // CHECK_BD)))
        launch(
            _kernel("check", ri),
            blocks,
            CHECK_BD,
            (rmap, rm, minima, status.arg, T, R, E, K),
            dependent=True,
        )
        status.written()
    if T > 0:
        launch(
            _kernel("combine", width, data_type, bool(weighted), bool(mix_precision), ri),
            T,
            _combine_block(nw),
            (
                optional_arg(rows if R else None, wd),
                rmap,
                rm,
                optional_arg(probs if R else None, np.float32),
                out_hidden.kernel_arg(wd),
                out_probs.kernel_arg(np.float32),
                R,
                E,
                K,
                nw,
                0 if validate else 1,
            ),
            dependent=True,
        )
    return status
