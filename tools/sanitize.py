"""Drive every GPU op over awkward inputs, for ``compute-sanitizer`` (memcheck, racecheck).

Run on a machine with a GPU and torch::

    compute-sanitizer --tool memcheck --error-exitcode 1 python tools/sanitize.py

Each case calls the public API with torch CUDA tensors and compares the result with the
NumPy oracle; the sanitizer watches every kernel for out-of-bounds or uninitialised accesses.
The inputs are small (the sanitizer slows kernels down a hundredfold) but cover odd widths,
float8 with scales, many experts and slots, empty calls, too small and too large buffers and
malformed routing.
"""

from __future__ import annotations

import sys

import ml_dtypes
import numpy as np
import torch
from _cli import parser

import moe_numba
from moe_numba import oracle
from moe_numba._transfer import to_device, to_host


def _routes(rng, T, K, E, bad=False):
    routes = np.full((T, K), -1, np.int32)
    for t in range(T):
        k = int(rng.integers(0, min(K, E) + 1))
        routes[t, :k] = rng.choice(E, size=k, replace=False)
    if bad:  # ids out of range and repeated experts, for validate=False
        routes.flat[rng.integers(0, routes.size, size=max(1, routes.size // 7))] = E + 3
        if K > 1 and T:
            routes[0, 1] = routes[0, 0]
    return routes


def permute_case(rng, T, H, K, E, A, dtype, *, override=-1, bad=False, indices=True):
    x = rng.standard_normal((T, H)).astype(np.float32).astype(dtype)
    routes = _routes(rng, T, K, E, bad)
    probs = rng.random((T, K)).astype(np.float32)
    scale = None
    if np.dtype(dtype).itemsize == 1:
        scale = rng.random((T, -(-H // 128))).astype(np.float32)
    counts = None
    if override < 0:
        counts = [sum(e in set(r.tolist()) for r in routes) for e in range(E)]
    args = (x, scale, routes, probs, E, counts, A)
    kwargs = dict(return_expert_indices=indices, override_buffer_size=override)
    want, _ = oracle.permute(*args, **kwargs)
    dev = [None if a is None else to_device(a, "torch") for a in args[:4]]
    got = moe_numba.moe_permute(*dev, *args[4:], **kwargs, validate=False)
    for w, g in zip(want, got, strict=True):
        assert np.array_equal(np.asarray(w).view(np.uint8), to_host(g).view(np.uint8))
    return got


def _rowmap(rng, routes, E, R, bad):
    rowmap = np.full((routes.shape[0], E), -1, np.int32)
    free = rng.permutation(R) if R else np.zeros(0, np.int64)
    n = 0
    for t in range(routes.shape[0]):
        for e in routes[t]:
            if 0 <= e < E and rowmap[t, e] < 0 and n < R:
                rowmap[t, e] = free[n]
                n += 1
    if bad and rowmap.size:
        rowmap.flat[0] = R + 5
    return rowmap


def unpermute_case(rng, T, H, K, E, R, dtype, weighted, mix, *, bad=False):
    rows = rng.standard_normal((R, H)).astype(np.float32).astype(dtype)
    routes = _routes(rng, T, K, E, bad)
    rowmap = _rowmap(rng, routes, E, R, bad)
    probs = rng.random(R).astype(np.float32)
    args = (rows, rowmap, routes, probs, T, E, mix, weighted)
    want, _ = oracle.unpermute(*args)
    dev = [to_device(a, "torch") for a in args[:4]]
    got = moe_numba.moe_unpermute(*dev, *args[4:], validate=False)
    for w, g in zip(want, got, strict=True):
        assert np.array_equal(np.asarray(w).view(np.uint8), to_host(g).view(np.uint8))


def _same(want, got):
    for w, g in zip(want, got, strict=True):
        assert (
            g is None if w is None else np.array_equal(w.view(np.uint8), to_host(g).view(np.uint8))
        )


def permute_backward_case(rng, T, H, K, E, R, dtype, *, bad=False, rows=True, probs=True):
    routes = _routes(rng, T, K, E, bad)
    args = [
        rng.standard_normal((R, H)).astype(np.float32).astype(dtype) if rows else None,
        rng.standard_normal(R).astype(np.float32) if probs else None,
        _rowmap(rng, routes, E, R, bad),
        routes,
    ]
    want, _ = oracle.permute_backward(*args)
    dev = [None if a is None else to_device(a, "torch") for a in args]
    _same(want, moe_numba.moe_permute_backward(*dev, validate=False))


def unpermute_backward_case(rng, T, H, K, E, R, dtype, weighted, *, bad=False, dy=True, g=True):
    routes = _routes(rng, T, K, E, bad)
    rowmap = _rowmap(rng, routes, E, R, bad)
    if bad and R and T > 1:  # a row named twice (or more)
        rowmap[0, E - 1] = rowmap[T - 1, E - 1] = R - 1
    args = [
        rng.standard_normal((T, H)).astype(np.float32).astype(dtype) if dy else None,
        rng.standard_normal((T, K)).astype(np.float32) if g else None,
        rng.standard_normal((R, H)).astype(np.float32).astype(dtype),
        rowmap,
        routes,
        rng.random(R).astype(np.float32),
    ]
    want, _ = oracle.unpermute_backward(*args, weighted, R)
    dev = [None if a is None else to_device(a, "torch") for a in args]
    got = moe_numba.moe_unpermute_backward(
        *dev, using_weighted_combine=weighted, num_rows=R, validate=False
    )
    _same(want, got)


def permute_cases(rng):
    bf16, e4m3 = ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn
    permute_case(rng, 37, 7, 3, 5, 4, bf16)  # odd H
    permute_case(rng, 64, 256, 8, 16, 16, e4m3)  # float8 + scales
    permute_case(rng, 50, 24, 24, 300, 8, np.float32)  # many experts and slots
    permute_case(rng, 40, 16, 40, 64, 2, np.float16)  # K = 40
    permute_case(rng, 0, 16, 4, 8, 4, bf16)  # T = 0
    permute_case(rng, 90, 33, 4, 8, 8, bf16, override=40)  # too small a buffer
    permute_case(rng, 90, 33, 4, 8, 8, bf16, override=2000)  # far more rows than needed
    permute_case(rng, 70, 40, 6, 9, 3, bf16, bad=True)  # malformed routing


def main(argv=None):
    parser(__doc__).parse_args(argv)  # (no options: --help, and a refusal of any other)
    permute_cases(np.random.default_rng(7))
    rng = np.random.default_rng(8)
    bf16 = ml_dtypes.bfloat16
    for dtype in (bf16, np.float16, np.float32):
        for weighted in (False, True):
            for mix in (False, True):
                unpermute_case(rng, 45, 19, 4, 7, 200, dtype, weighted, mix)
    unpermute_case(rng, 30, 8, 3, 5, 0, bf16, True, True)  # R = 0
    unpermute_case(rng, 30, 64, 3, 5, 90, bf16, True, True, bad=True)  # malformed rowmap
    for dtype in (bf16, np.float16, np.float32):  # the gradients
        permute_backward_case(rng, 45, 19, 4, 7, 200, dtype, bad=True)
        for weighted in (False, True):
            unpermute_backward_case(rng, 45, 19, 4, 7, 200, dtype, weighted, bad=True)
    permute_backward_case(rng, 30, 8, 3, 5, 90, bf16, rows=False)  # no row gradient
    permute_backward_case(rng, 30, 8, 3, 5, 90, bf16, probs=False)  # no probability gradient
    permute_backward_case(rng, 30, 8, 3, 5, 0, bf16)  # R = 0
    permute_backward_case(rng, 0, 8, 3, 5, 16, bf16)  # T = 0
    unpermute_backward_case(rng, 9, 2600, 4, 40, 300, bf16, True)  # rows in several batches
    unpermute_backward_case(rng, 30, 8, 3, 5, 90, bf16, True, dy=False)  # g only
    unpermute_backward_case(rng, 30, 8, 3, 5, 90, bf16, True, g=False)  # dY only
    unpermute_backward_case(rng, 30, 8, 3, 5, 0, bf16, True)  # R = 0
    unpermute_backward_case(rng, 0, 8, 3, 5, 16, bf16, True)  # T = 0: every row zero
    torch.cuda.synchronize()
    print("sanitize: every case matched the oracle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
