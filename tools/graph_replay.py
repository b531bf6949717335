"""GPU time of a small permute and weighted unpermute, launched eagerly and replayed from one
CUDA graph (docs/lab-notes.rst, "Launches from C, staged capacities").

Run on a machine with a GPU and torch::

    python tools/graph_replay.py [--tokens 256]

bf16, H = 7168, K = 8, E = 64, ``validate=False``, padding alignments 16 and 1. For each:
the GPU time per step of the two calls launched eagerly (``tokens_per_expert`` given, the
calls replaying their recording as a user's do) and of one graph that captured them (the
permute with ``override_buffer_size`` at the padded row count of the same counts: a graph
cannot take new counts from the host), each the median of 7 batches of 50 enqueued behind a
held stream (``python -m benchmarks bench``'s timer), and whether the graph's outputs equal
the eager calls' bit for bit.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from _cli import parser, positive_int

import moe_numba

# benchmarks/ is no installed package: this checkout's, appended after any installed moe_numba
sys.path.append(str(Path(__file__).resolve().parents[1]))
from benchmarks.timers import CudaTimer  # noqa: E402

DEVICE = torch.device("cuda", 0)
H, K, E = 7168, 8, 64


def _inputs(T, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    routes = torch.topk(torch.rand(T, E, device=DEVICE, generator=g), K, dim=1).indices.int()
    probs = torch.softmax(torch.rand(T, K, device=DEVICE, generator=g), 1)
    x = torch.randn(T, H, device=DEVICE, generator=g).bfloat16()
    counts = torch.bincount(routes.flatten().long(), minlength=E).tolist()
    return x, routes, probs, counts


def _step(x, routes, probs, T, counts, A, rows=-1):
    """The permute (with ``counts``, or with ``rows`` as its buffer size when >= 0) and the
    weighted unpermute of its rows: ``(permute outputs, unpermute outputs)``."""
    permuted = moe_numba.moe_permute(
        x,
        None,
        routes,
        probs,
        E,
        None if rows >= 0 else counts,
        A,
        override_buffer_size=rows,
        validate=False,
    )
    out_rows, rowmap, row_probs, _ = permuted
    combined = moe_numba.moe_unpermute(
        out_rows, rowmap, routes, row_probs, T, E, using_weighted_combine=True, validate=False
    )
    return permuted, combined


def _bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def _same(a, b):
    return all(
        (x is None and y is None) or torch.equal(_bits(x), _bits(y))
        for x, y in zip(a, b, strict=True)
    )


def measure(T, A):
    """``(eager µs, graph µs, same outputs, held)`` for one alignment."""
    x, routes, probs, counts = _inputs(T)
    rows = sum(-(-c // A) * A for c in counts)
    timer = CudaTimer(7, batch=50)
    eager = _step(x, routes, probs, T, counts, A)
    for _ in range(3):
        _step(x, routes, probs, T, counts, A)
    eager_us = timer.gpu_us(lambda: _step(x, routes, probs, T, counts, A))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # (warm-up off the capturing stream, as torch advises)
        for _ in range(3):
            _step(x, routes, probs, T, counts, A, rows)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _step(x, routes, probs, T, counts, A, rows)
    graph.replay()
    torch.cuda.synchronize()
    same = _same(eager[0], captured[0]) and _same(eager[1], captured[1])
    graph_us = timer.gpu_us(graph.replay)
    return eager_us, graph_us, same, timer.hold_timeouts == 0


def main(argv=None):
    options = parser(__doc__)
    options.add_argument("--tokens", type=positive_int, default=256, help="T (default: 256)")
    args = options.parse_args(argv)
    print(f"T={args.tokens} H={H} K={K} E={E} bf16")
    print("   A   eager us   graph us   graph outputs")
    ok = True
    for A in (16, 1):
        eager_us, graph_us, same, held = measure(args.tokens, A)
        ok = ok and same
        mark = "" if held else "  (a hold gave up: host time included)"
        print(
            f"{A:4d} {eager_us:10.1f} {graph_us:10.1f}   "
            f"{'equal to eager' if same else 'DIFFER from eager'}{mark}",
            flush=True,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
