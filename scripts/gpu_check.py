#!/usr/bin/env python3
"""Device check of the GPU backend: bit-exact agreement with the NumPy oracle, then timings.

Calls ``moe_numba.kernels.permute.permute`` / ``moe_numba.kernels.unpermute.unpermute`` directly
with torch tensors (raw bytes in uint8 tensors, scratch and outputs from torch's caching
allocator, torch's current stream), compares every output bit for bit with
``moe_numba._oracle``, then times the large shapes against a device-to-device copy measured
in the same run, and the host cost of small calls.

    python scripts/gpu_check.py [--out DIR] [--skip-check] [--skip-bench]
    NUMBA_ENABLE_CUDASIM=1 python scripts/gpu_check.py --sim   # the checks, tiny, simulator

On the H200 machine (numpy 2.5 in the image breaks numba-cuda 0.30):
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=/tmp/site:$PWD/src && python3 scripts/gpu_check.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))


from moe_numba import _abi, _oracle  # noqa: E402
from moe_numba.kernels import permute as PM  # noqa: E402
from moe_numba.kernels import unpermute as UP  # noqa: E402
from moe_numba.kernels._buffer import DeviceBuffer  # noqa: E402

LOG = []
ONLY = ""


def log(*args):
    line = " ".join(str(a) for a in args)
    print(line, flush=True)
    LOG.append(line)


# ------------------------------------------------------------------------------------------
# memory: torch on a GPU, NumPy under the simulator


class TorchMemory:
    def __init__(self):
        import torch

        self.torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.keep = []

    def put(self, a, misalign=0):
        raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
        t = self.torch.empty(raw.size + misalign, dtype=self.torch.uint8, device=self.device)
        t = t[misalign:]
        if raw.size:
            t.copy_(self.torch.from_numpy(raw.copy()))
        return t

    def empty(self, nbytes, poison=0x5A, misalign=0):
        t = self.torch.full(
            (nbytes + misalign,), poison, dtype=self.torch.uint8, device=self.device
        )
        return t[misalign:]

    @staticmethod
    def buf(t):
        return DeviceBuffer(t.data_ptr(), t.numel() * t.element_size())

    @staticmethod
    def host(t, dtype, shape):
        return t.cpu().numpy().view(dtype).reshape(shape)

    def alloc(self, nbytes):
        t = self.torch.empty(
            max(16, -(-nbytes // 16) * 16), dtype=self.torch.uint8, device=self.device
        )
        self.keep.append(t)
        return DeviceBuffer(t.data_ptr(), nbytes)

    def stream(self):
        return int(self.torch._C._cuda_getCurrentRawStream(self.device.index))

    def sync(self):
        self.torch.cuda.synchronize()


class SimMemory:
    def put(self, a, misalign=0):
        return np.ascontiguousarray(a).reshape(-1).view(np.uint8).copy()

    def empty(self, nbytes, poison=0x5A, misalign=0):
        return np.full(nbytes, poison, np.uint8)

    @staticmethod
    def buf(a):
        return DeviceBuffer(0, a.nbytes, a)

    @staticmethod
    def host(a, dtype, shape):
        return a.view(dtype).reshape(shape).copy()

    def alloc(self, nbytes):
        return DeviceBuffer(0, nbytes, np.full(max(16, nbytes), 0xA5, np.uint8))

    def stream(self):
        return 0

    def sync(self):
        pass


# ------------------------------------------------------------------------------------------
# inputs


def routing(rng, T, K, E, dtype=np.int32, fill=1.0):
    rm = np.full((T, K), -1, dtype)
    for t in range(T):
        n = min(E, int(rng.binomial(K, fill)) if fill < 1 else K)
        rm[t, :n] = rng.choice(E, n, replace=False)
        rng.shuffle(rm[t])
    return rm


def counts_of(rm, E):
    flat = np.unique(
        np.stack([np.repeat(np.arange(rm.shape[0]), rm.shape[1]), rm.reshape(-1).astype(np.int64)]),
        axis=1,
    )
    ids = flat[1][(flat[1] >= 0) & (flat[1] < E)]
    return np.bincount(ids, minlength=E).astype(np.int64)


def hidden_of(rng, T, H, dtype):
    if np.dtype(dtype).itemsize == 1:
        return rng.integers(0, 256, (T, H), dtype=np.uint8).view(dtype)
    x = rng.standard_normal((T, H)).astype(dtype)
    flat = x.reshape(-1)
    if flat.size > 16:  # special bit patterns travel unchanged
        flat[3] = np.asarray(np.nan, dtype) if dtype != np.uint8 else flat[3]
        flat[5] = -np.asarray(0.0, dtype)
    return x


BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32}


def device_permute(
    M, hidden, scale, rm, probs, E, tpe, A, do_gather=True, indices=True, override=-1, misalign=0
):
    T, K = rm.shape
    H = hidden.shape[1]
    plan_counts = counts_of(rm, E) if override >= 0 else np.asarray(tpe, np.int64)
    R = override if override >= 0 else int((-(-plan_counts // A) * A).sum())
    bits = BITS[hidden.dtype.itemsize]
    gather_scale = do_gather and scale is not None
    d_hidden = M.put(hidden.view(bits), misalign) if do_gather else None
    d_scale = M.put(scale, misalign) if gather_scale else None
    d_rm, d_probs = M.put(rm), M.put(probs)
    d_cap = None if override >= 0 else M.put(np.asarray(tpe, np.int64))
    o_hidden = M.empty(R * H * hidden.dtype.itemsize, misalign=misalign) if do_gather else None
    o_scale = M.empty(R * scale.shape[1] * 4, misalign=misalign) if gather_scale else None
    o_rowmap, o_probs = M.empty(T * E * 4), M.empty(R * 4)
    o_idx = M.empty(R * 4) if indices else None
    o_status = M.empty(8 * _abi.PERMUTE_STATUS_LEN)
    b = M.buf
    PM.permute(
        None if d_hidden is None else b(d_hidden),
        None if d_scale is None else b(d_scale),
        b(d_rm),
        b(d_probs),
        None if d_cap is None else b(d_cap),
        num_tokens=T,
        topk=K,
        num_experts=E,
        alignment=A,
        num_rows=R,
        hidden_row_bytes=H * hidden.dtype.itemsize,
        scale_row_bytes=scale.shape[1] * 4 if gather_scale else 0,
        routemap_itemsize=rm.dtype.itemsize,
        out_hidden=None if o_hidden is None else b(o_hidden),
        out_scale=None if o_scale is None else b(o_scale),
        out_rowmap=b(o_rowmap),
        out_probs=b(o_probs),
        out_indices=None if o_idx is None else b(o_idx),
        status=b(o_status),
        alloc=M.alloc,
        stream=M.stream(),
    )
    M.sync()
    out = {
        "rowmap": M.host(o_rowmap, np.int32, (T, E)),
        "probs": M.host(o_probs, np.uint32, (R,)),
        "status": M.host(o_status, np.int64, (_abi.PERMUTE_STATUS_LEN,)),
    }
    if do_gather:
        out["hidden"] = M.host(o_hidden, bits, (R, H))
    if gather_scale:
        out["scale"] = M.host(o_scale, np.uint32, (R, scale.shape[1]))
    if indices:
        out["indices"] = M.host(o_idx, np.int32, (R,))
    return out


def check_permute(
    M,
    name,
    hidden,
    scale,
    rm,
    probs,
    E,
    tpe,
    A,
    do_gather=True,
    indices=True,
    override=-1,
    misalign=0,
):
    if ONLY and ONLY not in f"permute {name}":
        return True
    t0 = time.time()
    (exp, status) = _oracle.permute(
        hidden, scale, rm, probs, E, tpe, A, do_gather, indices, override
    )
    got = device_permute(
        M, hidden, scale, rm, probs, E, tpe, A, do_gather, indices, override, misalign
    )
    bits = BITS[hidden.dtype.itemsize]
    bad = []
    if not np.array_equal(got["status"], status):
        bad.append(f"status {got['status']} != {status}")
    if not np.array_equal(got["rowmap"], exp[1]):
        bad.append(f"rowmap ({(got['rowmap'] != exp[1]).sum()} entries)")
    if not np.array_equal(got["probs"], exp[2].view(np.uint32)):
        bad.append("probs")
    if do_gather and not np.array_equal(got["hidden"], exp[0].view(bits)):
        bad.append(f"hidden ({(got['hidden'] != exp[0].view(bits)).any(1).sum()} rows)")
    if "scale" in got and not np.array_equal(got["scale"], exp[3].view(np.uint32)):
        bad.append("scale")
    if indices and not np.array_equal(got["indices"], exp[4]):
        bad.append("indices")
    verdict = "OK" if not bad else "FAIL " + "; ".join(bad)
    log(f"  permute   {name:44s} R={exp[2].shape[0]:7d} {verdict}  ({time.time() - t0:.1f}s)")
    return not bad


DT_CODE = {
    np.dtype(np.float32): _abi.DATA_FLOAT32,
    np.dtype(ml_dtypes.bfloat16): _abi.DATA_BFLOAT16,
    np.dtype(np.float16): _abi.DATA_FLOAT16,
}


def device_unpermute(M, rows, rowmap, rm, probs, E, weighted, mix, misalign=0):
    T, K = rm.shape
    R, H = rows.shape
    bits = BITS[rows.dtype.itemsize]
    d_rows = M.put(rows.view(bits), misalign)
    o_hidden = M.empty(T * H * rows.dtype.itemsize, misalign=misalign)
    o_probs, o_status = M.empty(T * K * 4), M.empty(8 * _abi.UNPERMUTE_STATUS_LEN)
    b = M.buf
    d_rowmap, d_rm, d_probs = M.put(rowmap), M.put(rm), M.put(probs)  # alive until the sync
    UP.unpermute(
        b(d_rows),
        b(d_rowmap),
        b(d_rm),
        b(d_probs),
        num_tokens=T,
        num_rows=R,
        hidden=H,
        num_experts=E,
        topk=K,
        data_type=DT_CODE[rows.dtype],
        routemap_itemsize=rm.dtype.itemsize,
        weighted=weighted,
        mix_precision=mix,
        out_hidden=b(o_hidden),
        out_probs=b(o_probs),
        status=b(o_status),
        alloc=M.alloc,
        stream=M.stream(),
    )
    M.sync()
    return (
        M.host(o_hidden, bits, (T, H)),
        M.host(o_probs, np.uint32, (T, K)),
        M.host(o_status, np.int64, (_abi.UNPERMUTE_STATUS_LEN,)),
    )


def check_unpermute(M, name, rows, rowmap, rm, probs, E, weighted, mix, misalign=0):
    if ONLY and ONLY not in f"unpermute {name}":
        return True
    t0 = time.time()
    T = rm.shape[0]
    (exp, exp_probs), status = _oracle.unpermute(rows, rowmap, rm, probs, T, E, mix, weighted)
    got, got_probs, got_status = device_unpermute(
        M, rows, rowmap, rm, probs, E, weighted, mix, misalign
    )
    bits = BITS[rows.dtype.itemsize]
    bad = []
    if not np.array_equal(got_status, status):
        bad.append(f"status {got_status} != {status}")
    if not np.array_equal(got_probs, exp_probs.view(np.uint32)):
        bad.append("probs")
    if not np.array_equal(got, exp.view(bits)):
        n = int((got != exp.view(bits)).sum())
        bad.append(f"hidden ({n} elements)")
    log(
        f"  unpermute {name:44s} {'OK' if not bad else 'FAIL ' + '; '.join(bad)}"
        f"  ({time.time() - t0:.1f}s)"
    )
    return not bad


def unzipped(rng, T, K, E, dtype, H, scale=1.0, R=None):
    rm = routing(rng, T, K, E, fill=0.9)
    c = counts_of(rm, E)
    R = int(c.sum()) + 7 if R is None else R
    rowmap = np.full((T, E), -1, np.int32)
    free = rng.permutation(R)
    i = 0
    for t in range(T):
        for e in rm[t]:
            if e >= 0 and rowmap[t, e] < 0 and i < R:
                rowmap[t, e] = free[i]
                i += 1
    rows = (rng.standard_normal((R, H)) * scale).astype(dtype)
    return rows, rowmap, rm, rng.random(R, dtype=np.float32)


def correctness(M, sim):
    rng = np.random.default_rng(2024)
    ok = True
    bf16, fp8 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn
    s = (lambda big, small: small) if sim else (lambda big, small: big)
    log("correctness (bit for bit against moe_numba._oracle):")

    # permute
    T, K, E, H = s(300, 20), s(8, 3), s(64, 6), s(7168, 16)
    rm = routing(rng, T, K, E)
    probs = rng.random((T, K), dtype=np.float32)
    ok &= check_permute(
        M,
        f"bf16 T{T} H{H} K{K} E{E} A128",
        hidden_of(rng, T, H, bf16),
        None,
        rm,
        probs,
        E,
        counts_of(rm, E),
        s(128, 4),
    )
    T, K, E, H, S = s(200, 20), s(4, 2), s(32, 5), s(7168, 32), s(56, 2)
    rm = routing(rng, T, K, E, np.int64)
    probs = rng.random((T, K), dtype=np.float32)
    ok &= check_permute(
        M,
        f"fp8+f32 scale T{T} H{H} S{S} int64 routing",
        hidden_of(rng, T, H, fp8),
        rng.random((T, S), dtype=np.float32),
        rm,
        probs,
        E,
        counts_of(rm, E),
        s(128, 4),
    )
    T, K, E, H = s(1000, 30), s(8, 4), s(128, 9), 5
    rm = routing(rng, T, K, E, np.int64, fill=0.7)
    rm[3, 0], rm[17, 1], rm[5, :2] = E + 4, -9, [1, 1]
    tpe = counts_of(rm, E)
    tpe[0] += 9
    tpe[2] = max(0, tpe[2] - 2)
    ok &= check_permute(
        M,
        f"bf16 H5 malformed + capacity mismatch E{E}",
        hidden_of(rng, T, H, bf16),
        None,
        rm,
        rng.random((T, K), dtype=np.float32),
        E,
        tpe,
        3,
    )
    T, K, E, H = s(3000, 40), s(64, 6), s(1024, 10), 3
    rm = routing(rng, T, K, E)
    ok &= check_permute(
        M,
        f"f32 H3 K{K} E{E} A16",
        hidden_of(rng, T, H, np.float32),
        None,
        rm,
        rng.random((T, K), dtype=np.float32),
        E,
        counts_of(rm, E),
        16,
    )
    T, K, E, H = s(600, 40), s(80, 6), s(2500, 11), 8
    rm = routing(rng, T, K, E, fill=0.9)
    ok &= check_permute(
        M,
        f"bf16 H8 K{K}>DMAX E{E}>ETILE",
        hidden_of(rng, T, H, bf16),
        None,
        rm,
        rng.random((T, K), dtype=np.float32),
        E,
        counts_of(rm, E),
        8,
    )
    T, K, E, H = s(512, 40), s(8, 3), s(64, 5), s(256, 8)
    rm = routing(rng, T, K, E, fill=0.8)
    pr = rng.random((T, K), dtype=np.float32)
    need = int((-(-counts_of(rm, E) // 16) * 16).sum())
    for rows in (need // 2, need + 300, 0):
        ok &= check_permute(
            M,
            f"bf16 override R={rows} (needed {need})",
            hidden_of(rng, T, H, bf16),
            None,
            rm,
            pr,
            E,
            None,
            16,
            override=rows,
        )
    ok &= check_permute(
        M,
        "do_gather=False, no indices",
        hidden_of(rng, T, H, bf16),
        None,
        rm,
        pr,
        E,
        counts_of(rm, E),
        16,
        do_gather=False,
        indices=False,
    )
    ok &= check_permute(
        M,
        "8-byte-aligned pointers (no 16-byte words)",
        hidden_of(rng, T, s(64, 8), bf16),
        rng.random((T, 4), dtype=np.float32),
        rm,
        pr,
        E,
        counts_of(rm, E),
        16,
        misalign=8,
    )
    rm1 = np.full((s(100, 10), 4), -1, np.int32)
    rm1[::3, 2] = 0
    ok &= check_permute(
        M,
        "E=1, K>E with -1 slots",
        hidden_of(rng, rm1.shape[0], 2, bf16),
        None,
        rm1,
        rng.random(rm1.shape, dtype=np.float32),
        1,
        counts_of(rm1, 1),
        1,
    )
    ok &= check_permute(
        M,
        "T=0 with capacity",
        hidden_of(rng, 0, 4, bf16),
        None,
        np.zeros((0, 2), np.int32),
        np.zeros((0, 2), np.float32),
        3,
        [2, 0, 1],
        4,
    )

    # unpermute
    for dt in (bf16, np.float16, np.float32):
        for weighted in (True, False):
            for mix in (True, False):
                T, K, E, H = s(200, 8), s(8, 3), s(16, 5), s(520, 8)
                rows, rowmap, rm, pr = unzipped(rng, T, K, E, dt, H, scale=20.0)
                ok &= check_unpermute(
                    M,
                    f"{np.dtype(dt).name} H{H} weighted={weighted} mix={mix}",
                    rows,
                    rowmap,
                    rm,
                    pr,
                    E,
                    weighted,
                    mix,
                )
    T, K, E, H = s(128, 8), s(8, 3), s(64, 6), s(7168, 16)
    rows, rowmap, rm, pr = unzipped(rng, T, K, E, bf16, H)
    ok &= check_unpermute(M, f"bf16 H{H} E{E} weighted", rows, rowmap, rm, pr, E, True, True)
    for dt, H in ((np.float16, 5), (bf16, 3), (np.float32, 3), (bf16, 6)):
        rows, rowmap, rm, pr = unzipped(rng, s(100, 8), 4, 9, dt, H)
        ok &= check_unpermute(
            M, f"{np.dtype(dt).name} H{H} (narrow words)", rows, rowmap, rm, pr, 9, True, True
        )
    rows, rowmap, rm, pr = unzipped(rng, s(100, 8), 4, 9, bf16, s(64, 8))
    ok &= check_unpermute(
        M, "bf16 8-byte-aligned pointers", rows, rowmap, rm, pr, 9, True, True, misalign=8
    )
    # special values
    for dt in (np.float16, bf16, np.float32):
        rows, rowmap, rm, pr = unzipped(rng, s(64, 6), 4, 8, dt, s(40, 8))
        info = ml_dtypes.finfo(dt)
        flat = rows.reshape(-1)
        for step, v in (
            (5, info.smallest_subnormal),
            (7, info.max),
            (11, np.inf),
            (13, -np.inf),
            (17, np.nan),
            (19, -info.tiny * 3),
        ):
            flat[step % 4 :: step] = np.asarray(v, dt)
        for weighted, mix in ((True, True), (False, True), (True, False)):
            ok &= check_unpermute(
                M,
                f"{np.dtype(dt).name} inf/nan/subnormal w={weighted} m={mix}",
                rows,
                rowmap,
                rm,
                pr,
                8,
                weighted,
                mix,
            )
    # malformed, list overflow (E > LMAX with every entry valid)
    T, E, R, H = s(40, 6), s(300, 7), s(500, 30), s(16, 4)
    rows = rng.standard_normal((R, H)).astype(bf16)
    rowmap = np.where(rng.random((T, E)) < 0.5, rng.integers(0, R, (T, E)), -1).astype(np.int32)
    rowmap[1] = rng.integers(0, R, E)  # every expert valid: more rows than the shared list
    rowmap[3, 4], rowmap[2, 5] = R + 1, -4
    rm = rng.integers(-1, E, (T, 5)).astype(np.int64)
    rm[6 % T, 1] = E + 3
    ok &= check_unpermute(
        M,
        f"malformed rowmap/routing, E={E} list overflow",
        rows,
        rowmap,
        rm,
        rng.random(R, dtype=np.float32),
        E,
        True,
        True,
    )
    ok &= check_unpermute(
        M,
        "R=0",
        np.zeros((0, 5), np.float16),
        np.full((4, 3), -1, np.int32),
        rng.integers(-1, 3, (4, 2)).astype(np.int32),
        np.zeros(0, np.float32),
        3,
        True,
        True,
    )
    log("correctness:", "ALL OK" if ok else "FAILURES")
    return ok


# ------------------------------------------------------------------------------------------
# benchmarks (torch only)


class Bench:
    def __init__(self, M):
        self.M = M
        self.torch = M.torch
        self.results = {}

    def time_ms(self, fn, iters=20, warm=3):
        torch = self.torch
        for _ in range(warm):
            fn()
        times = []
        for _ in range(iters):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        return statistics.median(times)

    def time_b2b_ms(self, fn, iters=20, warm=3):
        """Per call, back to back (the GPU never waits for the host between calls)."""
        torch = self.torch
        for _ in range(warm):
            fn()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / iters

    def copy_roofline(self):
        torch = self.torch
        n = 2 << 30
        src = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
        dst = torch.empty_like(src)
        ms = self.time_ms(lambda: dst.copy_(src), iters=20)  # noqa: F821 (ruff and del)
        gbs = 2 * n / ms / 1e6
        del src, dst
        log(f"copy roofline: {gbs:.0f} GB/s ({ms:.3f} ms for 2 x {n / 2**30:.0f} GiB)")
        self.copy = gbs
        self.results["copy_GBps"] = gbs
        return gbs

    def inputs(self, T, H, K, E, dtype, S=0, seed=0):
        torch = self.torch
        g = torch.Generator(device="cuda").manual_seed(seed)
        if dtype == "fp8":
            hidden = torch.randint(0, 256, (T, H), dtype=torch.uint8, device="cuda", generator=g)
            esize = 1
        else:
            hidden = torch.randn((T, H), device="cuda", generator=g).to(torch.bfloat16)
            esize = 2
        scores = torch.rand((T, E), device="cuda", generator=g)
        rm = scores.topk(K, dim=1).indices.to(torch.int32).contiguous()
        probs = torch.rand((T, K), device="cuda", generator=g)
        counts = torch.bincount(rm.reshape(-1).long(), minlength=E).to(torch.int64)
        scale = torch.rand((T, S), device="cuda", generator=g) if S else None
        return hidden, esize, scale, rm, probs, counts

    def permute_call(self, hidden, esize, scale, rm, probs, counts, E, A, R, outs=None):
        M, torch = self.M, self.torch
        T, H = hidden.shape
        K = rm.shape[1]
        if outs is None:
            outs = dict(
                hidden=torch.empty((R, H * esize), dtype=torch.uint8, device="cuda"),
                scale=(
                    torch.empty((R, scale.shape[1]), dtype=torch.float32, device="cuda")
                    if scale is not None
                    else None
                ),
                rowmap=torch.empty((T, E), dtype=torch.int32, device="cuda"),
                probs=torch.empty(R, dtype=torch.float32, device="cuda"),
                indices=torch.empty(R, dtype=torch.int32, device="cuda"),
                status=torch.empty(_abi.PERMUTE_STATUS_LEN, dtype=torch.int64, device="cuda"),
            )
        b = M.buf
        PM.permute(
            b(hidden),
            None if scale is None else b(scale),
            b(rm),
            b(probs),
            None if counts is None else b(counts),
            num_tokens=T,
            topk=K,
            num_experts=E,
            alignment=A,
            num_rows=R,
            hidden_row_bytes=H * esize,
            scale_row_bytes=0 if scale is None else scale.shape[1] * 4,
            routemap_itemsize=4,
            out_hidden=b(outs["hidden"]),
            out_scale=None if scale is None else b(outs["scale"]),
            out_rowmap=b(outs["rowmap"]),
            out_probs=b(outs["probs"]),
            out_indices=b(outs["indices"]),
            status=b(outs["status"]),
            alloc=M.alloc,
            stream=M.stream(),
        )
        M.keep.clear()
        return outs

    def bench_permute(self, label, T, H, K, E, A, dtype="bf16", S=0, verify=True):
        hidden, esize, scale, rm, probs, counts = self.inputs(T, H, K, E, dtype, S)
        c = counts.cpu().numpy()
        R = int((-(-c // A) * A).sum())
        outs = self.permute_call(hidden, esize, scale, rm, probs, counts, E, A, R)
        if verify:
            self.verify_permute(hidden, esize, scale, rm, probs, c, E, A, R, outs)
        ms = self.time_ms(
            lambda: self.permute_call(hidden, esize, scale, rm, probs, counts, E, A, R, outs)
        )
        b2b = self.time_b2b_ms(
            lambda: self.permute_call(hidden, esize, scale, rm, probs, counts, E, A, R, outs)
        )
        nbytes = (T + R) * H * esize + (T + R) * S * 4
        gbs = nbytes / ms / 1e6
        g2 = nbytes / b2b / 1e6
        log(
            f"permute   {label:40s} R={R:7d} {ms * 1e3:8.1f} us {gbs:6.0f} GB/s "
            f"{100 * gbs / self.copy:5.1f}% of copy | back to back {b2b * 1e3:7.1f} us "
            f"{100 * g2 / self.copy:5.1f}%"
        )
        self.results[f"permute {label}"] = dict(
            us=ms * 1e3,
            GBps=gbs,
            pct=100 * gbs / self.copy,
            R=R,
            bytes=nbytes,
            b2b_us=b2b * 1e3,
            b2b_pct=100 * g2 / self.copy,
        )
        return outs, (hidden, esize, scale, rm, probs, counts, R)

    def verify_permute(self, hidden, esize, scale, rm, probs, c, E, A, R, outs):
        """rowmap / probs / indices / status against the oracle (do_gather=False); the rows
        against the source rows they name, padding rows zero (torch, on the GPU)."""
        torch = self.torch
        self.M.sync()
        T = hidden.shape[0]
        rm_h = rm.cpu().numpy()
        (exp, status) = _oracle.permute(
            np.zeros((T, 1), np.uint8), None, rm_h, probs.cpu().numpy(), E, c, A, False, True
        )
        bad = []
        if not np.array_equal(outs["rowmap"].cpu().numpy(), exp[1]):
            bad.append("rowmap")
        if not np.array_equal(outs["probs"].cpu().numpy().view(np.uint32), exp[2].view(np.uint32)):
            bad.append("probs")
        if not np.array_equal(outs["indices"].cpu().numpy(), exp[4]):
            bad.append("indices")
        if not np.array_equal(outs["status"].cpu().numpy(), status):
            bad.append("status")
        rowmap = outs["rowmap"].long()
        t_idx, e_idx = torch.nonzero(rowmap >= 0, as_tuple=True)
        rows = rowmap[t_idx, e_idx]
        hid = hidden.view(torch.uint8).reshape(T, -1)
        if not torch.equal(outs["hidden"][rows], hid[t_idx]):
            bad.append("hidden rows")
        filled = torch.zeros(R, dtype=torch.bool, device="cuda")
        filled[rows] = True
        if bool(outs["hidden"][~filled].any()):
            bad.append("padding not zero")
        if scale is not None:
            if not torch.equal(outs["scale"][rows], scale[t_idx]):
                bad.append("scale rows")
            if bool(outs["scale"][~filled].ne(0).any()):
                bad.append("scale padding")
        log(f"  verify: {'OK' if not bad else 'FAIL ' + ', '.join(bad)}")
        self.results.setdefault("verify_failures", []).extend(bad)

    def unpermute_call(
        self,
        rows,
        rowmap,
        rm,
        probs,
        E,
        out=None,
        out_probs=None,
        status=None,
        weighted=True,
        mix=True,
    ):
        M, torch = self.M, self.torch
        T, K = rm.shape
        R, H = rows.shape
        if out is None:
            out = torch.empty((T, H), dtype=torch.bfloat16, device="cuda")
            out_probs = torch.empty((T, K), dtype=torch.float32, device="cuda")
            status = torch.empty(_abi.UNPERMUTE_STATUS_LEN, dtype=torch.int64, device="cuda")
        b = M.buf
        UP.unpermute(
            b(rows),
            b(rowmap),
            b(rm),
            b(probs),
            num_tokens=T,
            num_rows=R,
            hidden=H,
            num_experts=E,
            topk=K,
            data_type=_abi.DATA_BFLOAT16,
            routemap_itemsize=4,
            weighted=weighted,
            mix_precision=mix,
            out_hidden=b(out),
            out_probs=b(out_probs),
            status=b(status),
            alloc=M.alloc,
            stream=M.stream(),
        )
        M.keep.clear()
        return out, out_probs, status

    def bench_unpermute(self, label, outs, inputs, weighted=True, mix=True, verify=True):
        torch = self.torch
        hidden, esize, scale, rm, probs, counts, R = inputs
        T, H = hidden.shape
        E = outs["rowmap"].shape[1]
        rows = outs["hidden"].view(torch.bfloat16).reshape(R, H)
        rowmap, rprobs = outs["rowmap"], outs["probs"]
        out, out_probs, status = self.unpermute_call(
            rows, rowmap, rm, rprobs, E, weighted=weighted, mix=mix
        )
        if verify:
            self.verify_unpermute(
                rows, rowmap, rm, rprobs, E, out, out_probs, status, weighted, mix
            )
        ms = self.time_ms(
            lambda: self.unpermute_call(
                rows, rowmap, rm, rprobs, E, out, out_probs, status, weighted, mix
            )
        )
        b2b = self.time_b2b_ms(
            lambda: self.unpermute_call(
                rows, rowmap, rm, rprobs, E, out, out_probs, status, weighted, mix
            )
        )
        routed = int((rowmap >= 0).sum())
        nbytes = (routed + T) * H * 2
        gbs = nbytes / ms / 1e6
        g2 = nbytes / b2b / 1e6
        log(
            f"unpermute {label:40s}          {ms * 1e3:8.1f} us {gbs:6.0f} GB/s "
            f"{100 * gbs / self.copy:5.1f}% of copy | back to back {b2b * 1e3:7.1f} us "
            f"{100 * g2 / self.copy:5.1f}%"
        )
        self.results[f"unpermute {label}"] = dict(
            us=ms * 1e3,
            GBps=gbs,
            pct=100 * gbs / self.copy,
            bytes=nbytes,
            b2b_us=b2b * 1e3,
            b2b_pct=100 * g2 / self.copy,
        )

    def verify_unpermute(
        self, rows, rowmap, rm, rprobs, E, out, out_probs, status, weighted, mix, ntok=48
    ):
        """A sample of tokens against the oracle, bit for bit."""
        torch = self.torch
        self.M.sync()
        T = rm.shape[0]
        rng = np.random.default_rng(7)
        toks = np.sort(rng.choice(T, min(ntok, T), replace=False))
        rmap = rowmap.cpu().numpy()[toks]
        used = np.unique(rmap[rmap >= 0])
        sub_rows = rows[torch.from_numpy(used).cuda()].view(torch.int16).cpu().numpy()
        sub_rows = sub_rows.view(ml_dtypes.bfloat16)
        remap = np.full(rows.shape[0], -1, np.int64)
        remap[used] = np.arange(used.size)
        sub_rowmap = np.where(rmap >= 0, remap[np.maximum(rmap, 0)], -1).astype(np.int32)
        sub_probs = rprobs.cpu().numpy()[used]
        (exp, exp_probs), _ = _oracle.unpermute(
            sub_rows, sub_rowmap, rm.cpu().numpy()[toks], sub_probs, len(toks), E, mix, weighted
        )
        got = out.view(torch.int16).cpu().numpy()[toks].view(np.uint16)
        bad = []
        if not np.array_equal(got, exp.view(np.uint16)):
            bad.append(f"hidden ({int((got != exp.view(np.uint16)).sum())} elements)")
        if not np.array_equal(out_probs.cpu().numpy()[toks], exp_probs):
            bad.append("probs")
        if not (status.cpu().numpy() == -1).all():
            bad.append("status")
        verdict = "OK" if not bad else "FAIL " + ", ".join(bad)
        log(f"  verify ({len(toks)} tokens vs oracle): {verdict}")
        self.results.setdefault("verify_failures", []).extend(bad)

    def small_calls(self, T=256, H=7168, K=8, E=64, A=128, n=300):
        """Host time per call (outputs allocated per call as the API does), no sync inside."""
        torch = self.torch
        hidden, esize, scale, rm, probs, counts = self.inputs(T, H, K, E, "bf16")
        c = counts.cpu().numpy()
        R = int((-(-c // A) * A).sum())
        for override in (False, True):
            cap = None if override else counts
            for _ in range(20):
                self.permute_call(hidden, esize, scale, rm, probs, cap, E, A, R)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                outs = self.permute_call(hidden, esize, scale, rm, probs, cap, E, A, R)
            host = (time.perf_counter() - t0) / n * 1e6
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / n * 1e6
            key = f"small permute T{T} {'override' if override else 'capacity'}"
            log(f"{key:44s} host {host:6.1f} us/call, with GPU {wall:6.1f} us/call")
            self.results[key] = dict(host_us=host, wall_us=wall)
        rows = outs["hidden"].view(torch.bfloat16).reshape(R, H)
        for weighted in (True, False):
            for _ in range(20):
                self.unpermute_call(rows, outs["rowmap"], rm, outs["probs"], E, weighted=weighted)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                self.unpermute_call(rows, outs["rowmap"], rm, outs["probs"], E, weighted=weighted)
            host = (time.perf_counter() - t0) / n * 1e6
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / n * 1e6
            key = f"small unpermute T{T} weighted={weighted}"
            log(f"{key:44s} host {host:6.1f} us/call, with GPU {wall:6.1f} us/call")
            self.results[key] = dict(host_us=host, wall_us=wall)
        # through the public API, if it is there
        try:
            import moe_numba

            tpe = [int(x) for x in c]
            hb = hidden
            for _ in range(10):
                moe_numba.moe_permute(hb, None, rm, probs, E, tpe, A, validate=False)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                res = moe_numba.moe_permute(hb, None, rm, probs, E, tpe, A, validate=False)
            host = (time.perf_counter() - t0) / n * 1e6
            torch.cuda.synchronize()
            log(f"{'API moe_permute T256 validate=False':44s} host {host:6.1f} us/call")
            self.results["API small permute"] = host
            for _ in range(10):
                moe_numba.moe_unpermute(
                    res[0], res[1], rm, res[2], T, E, using_weighted_combine=True, validate=False
                )
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                moe_numba.moe_unpermute(
                    res[0], res[1], rm, res[2], T, E, using_weighted_combine=True, validate=False
                )
            host = (time.perf_counter() - t0) / n * 1e6
            torch.cuda.synchronize()
            log(f"{'API moe_unpermute T256 weighted validate=False':44s} host {host:6.1f} us/call")
            self.results["API small unpermute"] = host
        except Exception as error:  # the API is the lead's; report, don't fail
            log(f"API small calls not measured: {type(error).__name__}: {error}")


def per_kernel(B, fn, iters=10):
    """Median device time of each kernel launch inside ``fn`` (events around every launch)."""
    from moe_numba.kernels import _launch

    torch = B.torch
    original = _launch.Launcher.__call__
    records = []

    def call(self, kernel, grid, block, args, shmem=0):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        original(self, kernel, grid, block, args, shmem)
        b.record()
        records.append((kernel.name, a, b))

    fn()
    _launch.Launcher.__call__ = call
    try:
        for _ in range(iters):
            fn()
    finally:
        _launch.Launcher.__call__ = original
    torch.cuda.synchronize()
    times = {}
    for name, a, b in records:
        times.setdefault(name, []).append(a.elapsed_time(b) * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def diagnostics(M, B):
    torch = B.torch
    log("diagnostics:")
    T, H, K, E, A = 16384, 7168, 8, 64, 128
    # write-heavy baselines
    n = 2 * 135168 * H
    buf = torch.empty(n, dtype=torch.uint8, device="cuda")
    ms = B.time_ms(lambda: buf.zero_())  # noqa: F821
    log(
        f"  baseline torch zero_ {n / 2**30:.2f} GiB: {n / ms / 1e6:.0f} GB/s "
        f"({100 * n / ms / 1e6 / B.copy:.1f}% of copy)"
    )
    hidden = torch.randn((T, H), device="cuda").to(torch.bfloat16)
    out = torch.empty((T, K, H), dtype=torch.bfloat16, device="cuda")
    ms = B.time_ms(lambda: out.copy_(hidden.unsqueeze(1).expand(-1, K, -1)))  # noqa: F821
    nb = T * H * 2 * (K + 1)
    log(
        f"  baseline torch broadcast copy 1 read : {K} writes: {nb / ms / 1e6:.0f} GB/s "
        f"({100 * nb / ms / 1e6 / B.copy:.1f}% of copy)"
    )
    idx = torch.randint(0, T, (T * K,), device="cuda")
    flat = out.view(T * K, H)
    ms = B.time_ms(lambda: torch.index_select(hidden, 0, idx, out=flat))  # noqa: F821
    log(
        f"  baseline torch index_select rows (1:1, random rows): {nb / ms / 1e6:.0f} GB/s "
        f"equiv-counted, {2 * T * K * H * 2 / ms / 1e6:.0f} GB/s moved"
    )
    del buf, out, flat
    # per-kernel times and block sizes
    hidden, esize, scale, rm, probs, counts = B.inputs(T, H, K, E, "bf16")
    c = counts.cpu().numpy()
    R = int((-(-c // A) * A).sum())
    outs = B.permute_call(hidden, esize, scale, rm, probs, counts, E, A, R)
    nbytes = (T + R) * H * 2
    for bd, prefetch in ((128, True), (128, False), (256, True)):
        PM.GATHER_BD = bd
        PM.PREFETCH = prefetch
        t = per_kernel(
            B, lambda: B.permute_call(hidden, esize, scale, rm, probs, counts, E, A, R, outs)
        )
        g = [v for k, v in t.items() if k.startswith("gather")][0]
        log(
            f"  permute GATHER_BD={bd}: "
            + ", ".join(f"{k} {v:.1f} us" for k, v in t.items())
            + f"; gather alone {nbytes / g / 1e3:.0f} GB/s "
            f"({100 * nbytes / g / 1e3 / B.copy:.1f}%)"
        )
    PM.GATHER_BD = 128
    PM.PREFETCH = True
    rows = outs["hidden"].view(torch.bfloat16).reshape(R, H)
    routed = int((outs["rowmap"] >= 0).sum())
    ub = (routed + T) * H * 2
    for bd in (128, 256):
        UP.COMBINE_BD = bd
        for weighted in (True, False):
            t = per_kernel(
                B,
                lambda: B.unpermute_call(
                    rows, outs["rowmap"], rm, outs["probs"], E, weighted=weighted
                ),
            )  # noqa: B023
            g = [v for k, v in t.items() if k.startswith("combine")][0]
            log(
                f"  unpermute COMBINE_BD={bd} weighted={weighted}: "
                + ", ".join(f"{k} {v:.1f} us" for k, v in t.items())
                + f"; combine alone {ub / g / 1e3:.0f} GB/s ({100 * ub / g / 1e3 / B.copy:.1f}%)"
            )
    UP.COMBINE_BD = 128
    del outs, rows
    # host cost of the backend alone (outputs preallocated), and where it goes
    import cProfile
    import pstats

    T = 256
    hidden, esize, scale, rm, probs, counts = B.inputs(T, H, K, E, "bf16")
    c = counts.cpu().numpy()
    R = int((-(-c // A) * A).sum())
    outs = B.permute_call(hidden, esize, scale, rm, probs, counts, E, A, R)
    rows = outs["hidden"].view(torch.bfloat16).reshape(R, H)
    uo = B.unpermute_call(rows, outs["rowmap"], rm, outs["probs"], E)
    calls = {
        "permute (outputs preallocated)": lambda: B.permute_call(
            hidden, esize, scale, rm, probs, counts, E, A, R, outs
        ),
        "unpermute (outputs preallocated)": lambda: B.unpermute_call(
            rows, outs["rowmap"], rm, outs["probs"], E, *uo
        ),
        "torch.empty x1": lambda: torch.empty(R, dtype=torch.float32, device="cuda"),
        "cuCtxGetDevice": __import__("cuda.bindings.driver", fromlist=["x"]).cuCtxGetDevice,
    }
    for name, fn in calls.items():
        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(500):
            fn()
        host = (time.perf_counter() - t0) / 500 * 1e6
        torch.cuda.synchronize()
        log(f"  host {name:36s} {host:6.1f} us/call")
    for name in ("permute (outputs preallocated)", "unpermute (outputs preallocated)"):
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(300):
            calls[name]()
        prof.disable()
        torch.cuda.synchronize()
        import io

        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
        log(f"  profile {name} (300 calls):")
        for line in text.getvalue().splitlines()[6:26]:
            log("    " + line)


def benchmarks(M, args):
    B = Bench(M)
    B.copy_roofline()
    if args.diag:
        diagnostics(M, B)
    outs, inputs = B.bench_permute("bf16 T16384 H7168 K8 E64 A128", 16384, 7168, 8, 64, 128)
    B.bench_unpermute("bf16 T16384 H7168 K8 E64 weighted", outs, inputs)
    B.bench_unpermute(
        "bf16 T16384 H7168 K8 E64 unweighted", outs, inputs, weighted=False, verify=False
    )
    del outs, inputs
    B.bench_permute(
        "fp8+f32 scale T16384 H7168 S56 K8 E64", 16384, 7168, 8, 64, 128, dtype="fp8", S=56
    )
    B.bench_permute("bf16 T4096 H7168 K8 E256 A128", 4096, 7168, 8, 256, 128)
    for E in (8, 1024):
        outs, inputs = B.bench_permute(f"bf16 T16384 H7168 K8 E{E} A16", 16384, 7168, 8, E, 16)
        if E == 1024:
            B.bench_unpermute(f"bf16 T16384 H7168 K8 E{E} weighted", outs, inputs)
        del outs, inputs
    B.small_calls()
    for module in (PM, UP):  # resources of every kernel launched
        for (_, key), kernel in module._KERNELS.items():
            for k in kernel._by_device.values():
                a = k.attributes
                log(
                    f"kernel {kernel.name:28s} {key!s:24s} regs {a.num_regs:3d} "
                    f"local {a.local_size_bytes} B shared {a.shared_size_bytes} B"
                )
    return B.results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--sim", action="store_true", help="checks only, tiny, in the simulator")
    parser.add_argument("--skip-check", action="store_true")
    parser.add_argument("--skip-bench", action="store_true")
    parser.add_argument(
        "--diag", action="store_true", help="baselines, per-kernel times, host profile"
    )
    parser.add_argument("--only", default="", help="run only the checks whose name has this")
    args = parser.parse_args()
    global ONLY
    ONLY = args.only
    results = {}
    ok = True
    if args.sim:
        for name, value in dict(
            CT=32,
            ETILE=4,
            COUNT_BITS=4,
            COUNT_BD=16,
            SCAN_BD=64,
            GATHER_BD=16,
            MIN_BD=8,
            PAD_ROWS=8,
            DMAX=4,
            RMT=256,
            NC_TARGET=2,
        ).items():
            setattr(PM, name, value)
        for name, value in dict(COMBINE_BD=16, MIN_BD=8, LMAX=4).items():
            setattr(UP, name, value)
        from numba.cuda.simulator import kernelapi

        kernelapi.FakeCUDAModule.fma = lambda self, a, b, c: np.float32(
            _oracle.fma_float32(a, b, c)
        )  # the simulator's fma rounds twice
        M = SimMemory()
    else:
        import torch

        M = TorchMemory()
        log(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    t0 = time.time()
    if not args.skip_check:
        try:
            ok = correctness(M, args.sim)
        except Exception:
            log(traceback.format_exc())
            ok = False
        log(f"checks took {time.time() - t0:.0f}s")
    results["correct"] = ok
    if not args.sim and not args.skip_bench:
        try:
            results.update(benchmarks(M, args))
        except Exception:
            log(traceback.format_exc())
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu_check.json"), "w") as f:
            json.dump(results, f, indent=1, default=str)
        with open(os.path.join(args.out, "gpu_check.log"), "w") as f:
            f.write("\n".join(LOG) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
