"""GPU time of small calls against the row splits and the one-block count (docs/
lab-notes.rst, "Small calls on the GPU: rows split among warps and blocks").

Run on a machine with a GPU and torch::

    python tools/split_rows.py [SWEEP ...]   # SWEEP: parts, combine, one-block, scatter

bf16, H = 7168, K = 8, E = 64 unless a shape says, ``validate=False``; µs per call of 50
back-to-back calls behind a held stream (CUDA events, the median of 5 batches: ``python -m
benchmarks bench``'s timer).
Each setting's outputs are compared bit for bit with the first setting's ("DIFF" marks a
mismatch). The settings are fields of the kernels' :class:`moe_numba.kernels.Settings`, each
value in force for its calls (``use_settings``, which starts it with no launch plans and no
replays: a replay keeps the launches it recorded), and its calls then replay as a user's
would. "HOST" marks a figure for which the hold let the stream go before the host had
enqueued a batch: it then holds host time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from _cli import parser

import moe_numba
from moe_numba.kernels import use_settings

# benchmarks/ is no installed package: this checkout's, appended after any installed moe_numba
sys.path.append(str(Path(__file__).resolve().parents[1]))

DEVICE = torch.device("cuda", 0)
H, K, E = 7168, 8, 64


def gpu_us(fn, n=50, rounds=5):
    """``(µs, held)``: the GPU time per call of ``fn``, the median of ``rounds`` batches of
    ``n`` calls enqueued behind a held stream (the bench's timer,
    ``benchmarks/timers.py``), and whether every batch was enqueued
    before the hold gave up (else the figure holds host time)."""
    from benchmarks.timers import CudaTimer

    timer = CudaTimer(rounds, batch=n)
    for _ in range(3):
        fn()
    us = timer.gpu_us(fn)
    return us, timer.hold_timeouts == 0


def gpu_figure(fn):
    """:func:`gpu_us` as printed: the µs, marked "HOST" where a hold gave up."""
    us, held = gpu_us(fn)
    return f"{us:7.1f}{'' if held else ' HOST'}"


def _bits(t):
    return t.view(torch.int16) if t.dtype in (torch.bfloat16, torch.float16) else t


def same(a, b):
    """Whether two tuples of outputs hold the same bits."""
    return all(
        (x is None and y is None) or torch.equal(_bits(x), _bits(y))
        for x, y in zip(a, b, strict=True)
    )


def calls(T, A, E=E):
    """The permute, weighted unpermute, permute backward and unpermute backward (weighted,
    with the probabilities' gradient: the dot products; and unweighted) of one shape."""
    g = torch.Generator(device=DEVICE).manual_seed(T)
    routes = torch.topk(torch.rand(T, E, device=DEVICE, generator=g), K, dim=1).indices.int()
    probs = torch.softmax(torch.rand(T, K, device=DEVICE, generator=g), 1)
    x = torch.randn(T, H, device=DEVICE, generator=g).bfloat16()
    counts = torch.bincount(routes.flatten().long(), minlength=E).tolist()

    def permute():
        return moe_numba.moe_permute(x, None, routes, probs, E, counts, A, validate=False)

    rows, rowmap, row_probs, _ = permute()
    dy = torch.randn(T, H, device=DEVICE, generator=g).bfloat16()

    def unpermute_bwd(weighted):
        return moe_numba.moe_unpermute_backward(
            dy,
            None,
            rows if weighted else None,
            rowmap,
            routes,
            row_probs if weighted else None,
            using_weighted_combine=weighted,
            num_rows=rows.shape[0],
            validate=False,
        )

    return {
        "unpermute_bwd": lambda: unpermute_bwd(True),
        "unpermute_bwd_copy": lambda: unpermute_bwd(False),
        "permute": permute,
        "unpermute": lambda: moe_numba.moe_unpermute(
            rows, rowmap, routes, row_probs, T, E, using_weighted_combine=True, validate=False
        ),
        "permute_bwd": lambda: moe_numba.moe_permute_backward(
            rows, row_probs, rowmap, routes, validate=False
        ),
    }


def sweep(label, name, values, shapes, ops):
    """One line per shape ``(T, A)`` or ``(T, A, E)`` and op: the GPU time for each of
    ``values`` of the setting ``name`` (for a tuple of names, each value a tuple of
    theirs)."""
    names = name if isinstance(name, tuple) else (name,)
    print(f"{label}: {', '.join(names)} = " + ", ".join(map(str, values)))
    for T, A, *experts in shapes:
        fns = calls(T, A, *experts)
        for op in ops:
            ref, row = None, []
            for value in values:
                given = value if isinstance(name, tuple) else (value,)
                changes = dict(zip(names, given, strict=True))
                with use_settings(**changes):  # (launch plans and replays follow it)
                    out = fns[op]()
                    ref = out if ref is None else ref
                    row.append(gpu_figure(fns[op]) + ("" if same(out, ref) else " DIFF"))
            shape = f"T={T:5d} A={A:3d}" + "".join(f" E={e}" for e in experts)
            print(f"  {shape} {op:18s} " + " ".join(row), flush=True)


SWEEPS = ("parts", "combine", "scatter", "one-block")


def _sweep(name):
    """An argparse ``type``: a sweep's name (``choices`` would refuse the empty default)."""
    if name not in SWEEPS:
        raise argparse.ArgumentTypeError(f"{name!r} is no sweep; choose from {', '.join(SWEEPS)}")
    return name


def main(argv=None):
    options = parser(__doc__)
    options.add_argument(
        "sweeps", nargs="*", type=_sweep, metavar="SWEEP",
        help=f"one of {', '.join(SWEEPS)} (default: every one)",
    )  # fmt: skip
    names = options.parse_args(argv).sweeps
    large = ((4096, 128), (16384, 128))
    small = ((64, 16), (128, 16), (256, 16), (256, 1))
    sweeps = {
        "parts": lambda: sweep(
            "gather row parts",
            "token_warps",
            (1, 1024, 2048, 4096, 8192, 16384),
            ((64, 16), (256, 16), (256, 1), (1024, 16), (2048, 128), *large, (16384, 1)),
            ("permute",),
        ),
        "combine": lambda: sweep(
            "combine row parts",
            "token_blocks",
            (1, 256, 512, 1024, 2048, 4096),
            ((64, 16), (256, 16), (1024, 16), *large),
            ("unpermute", "permute_bwd"),
        ),
        # (1, 0): a warp per token for all its rows, the narrow dot batch (the plan of a
        # large call, and of every call before rows were shared); then rows shared, with
        # the wide dot batch up to 0, 1024 (the default) or any number of token workers
        "scatter": lambda: sweep(
            "unpermute backward's scatter workers",
            ("scatter_token_warps", "wide_dot_warps"),
            ((1, 0), (4096, 0), (4096, 1024), (4096, 1 << 30), (2048, 1024), (8192, 1024)),
            ((16, 1, 256), (16, 16), (64, 16), (256, 16), (1024, 16), (4096, 128), *large),
            ("unpermute_bwd", "unpermute_bwd_copy"),
        ),
        # 2048: one block up to T = 256 (K = 8); 0: every call counts in chunks
        "one-block": lambda: sweep(
            "one-block count",
            "one_block_slots",
            (2048, 1024, 0),
            small,
            ("permute",),
        ),
    }
    for name in names or sweeps:
        sweeps[name]()


if __name__ == "__main__":
    main()
