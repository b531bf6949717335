"""Host time per call of the four ops on torch CUDA tensors, with the GPU busy and right after
a sync, and what the pieces of a small permute cost (docs/lab-notes.rst, "Host time per
call, piece by piece").

Run on a machine with a GPU and torch::

    python tools/host_time.py

bf16 rows, H = 7168, K = 8, E = 64, ``validate=False``. "busy": the host time per call of
``n`` back-to-back calls behind a ``torch.cuda._sleep`` long enough to keep the GPU busy for
all of them, the best of 5 rounds; "after a sync": the median over ``n`` calls each right after
``torch.cuda.synchronize()``, the best of 2 rounds. "permute, new counts" passes another
``tokens_per_expert`` list in every call, as a training step does. Every piece is timed the
busy way. The pieces call the library's internals; they are what the table names, not a
public interface.
"""

from __future__ import annotations

import itertools
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from _cli import parser

import moe_numba

# benchmarks/ is no installed package: this checkout's, appended after any installed moe_numba
sys.path.append(str(Path(__file__).resolve().parents[1]))
from benchmarks.hold import HOLD  # noqa: E402

DEVICE = torch.device("cuda", 0)
H, K, E = 7168, 8, 64
SHAPES = ((256, 16), (256, 1), (16384, 128), (16384, 1))  # (T, padding alignment)


def timed(fn, n=200, rounds=5, busy=True):
    """Microseconds of host time per call of ``fn`` (see the module docstring)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(rounds):
        if busy:
            torch.cuda._sleep(int(2e9 * n * 400e-6))  # (about 400 us of GPU time per call)
            start = time.perf_counter()
            for _ in range(n):
                fn()
            best.append((time.perf_counter() - start) / n)
            torch.cuda.synchronize()
        else:
            samples = []
            for _ in range(n):
                torch.cuda.synchronize()
                start = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - start)
            best.append(statistics.median(samples))
    return min(best) * 1e6


def case(T, A):
    """The inputs of one shape, and a permute's outputs for the ops that take them."""
    g = torch.Generator(device=DEVICE).manual_seed(0)
    routes = torch.topk(torch.rand(T, E, device=DEVICE, generator=g), K, dim=1).indices.int()
    probs = torch.softmax(torch.rand(T, K, device=DEVICE, generator=g), 1)
    x = torch.randn(T, H, device=DEVICE, generator=g).bfloat16()
    counts = torch.bincount(routes.flatten().long(), minlength=E).tolist()
    permuted = moe_numba.moe_permute(x, None, routes, probs, E, counts, A, validate=False)
    dy = torch.randn(T, H, device=DEVICE, generator=g).bfloat16()
    return x, routes, probs, counts, permuted, dy


def _new_counts(counts, n=1000):
    """An endless supply of count lists, each new (``n`` shuffles of ``counts``, in turn): a
    training step's ``tokens_per_expert`` differs from the last one's, so nothing that is
    remembered per value (the capacities' plan, their upload) is found."""
    rng = np.random.default_rng(0)
    lists = [rng.permutation(counts).tolist() for _ in range(n)]
    return itertools.cycle(lists)


def operations(T, A, x, routes, probs, counts, permuted, dy):
    rows, rowmap, row_probs, _ = permuted
    R = rows.shape[0]
    fresh = _new_counts(counts)
    return {
        "permute": lambda: moe_numba.moe_permute(
            x, None, routes, probs, E, counts, A, validate=False
        ),
        "permute, validate": lambda: moe_numba.moe_permute(x, None, routes, probs, E, counts, A),
        "permute, new counts": lambda: moe_numba.moe_permute(
            x, None, routes, probs, E, next(fresh), A, validate=False
        ),
        "unpermute": lambda: moe_numba.moe_unpermute(
            rows, rowmap, routes, row_probs, T, E, using_weighted_combine=True, validate=False
        ),
        "permute_bwd": lambda: moe_numba.moe_permute_backward(
            rows, row_probs, rowmap, routes, validate=False
        ),
        "unpermute_bwd": lambda: moe_numba.moe_unpermute_backward(
            dy,
            None,
            rows,
            rowmap,
            routes,
            row_probs,
            using_weighted_combine=True,
            num_rows=R,
            validate=False,
        ),
    }


def pieces(A, x, routes, probs, counts):
    """The pieces of a permute call (T of ``x``), and a few torch calls to compare with."""
    # (the library's internals: imported here, so that tools/host_time_ab.py can time a tree
    # of another commit through operations() alone)
    from moe_numba import _core, _gpu
    from moe_numba._capacities import with_capacities
    from moe_numba._contract import PermuteArrays, PermuteScalars
    from moe_numba._dispatch import call_key
    from moe_numba._outputs import permute_outputs
    from moe_numba.kernels._family import NoKey
    from moe_numba.ops import PERMUTE
    from moe_numba.runtime import _launch

    arrays = PermuteArrays(x, None, routes, probs)
    scalars = PermuteScalars(num_experts=E, padding_alignment=A, validate=False)
    _, plan = _core.prepare(PERMUTE, arrays, scalars, counts)
    backend = _gpu.gpu_backend()
    call = _gpu._Call(x)
    flag = torch.zeros(4, dtype=torch.int32, device=DEVICE)
    launcher = _launch.Launcher(torch._C._cuda_getCurrentRawStream(0))
    hold, hold_args = HOLD.get(NoKey()), HOLD.args({"flag": flag.data_ptr(), "spins": 0})
    return {
        "call_key": lambda: call_key(arrays, scalars),
        "prepare (permute)": lambda: _core.prepare(PERMUTE, arrays, scalars, counts),
        "with_capacities (a new plan)": lambda: with_capacities(
            plan._replace(capacities=None, num_rows=-1), counts
        ),
        "gpu backend permute": lambda: backend.permute(plan, arrays),
        "permute_outputs": lambda: permute_outputs(plan, call.empty),
        "torch.empty (300, H) bf16": lambda: torch.empty(
            (300, H), dtype=torch.bfloat16, device=DEVICE
        ),
        "torch.empty (0,)": lambda: torch.empty((0,), dtype=torch.float32, device=DEVICE),
        "small add_": lambda: probs.add_(0),
        # the bench's holding kernel with no spins: a launch of 2 arguments
        "launch": lambda: launcher(hold, 1, 32, hold_args, dependent=True),
    }


def main(argv=None):
    parser(__doc__).parse_args(argv)  # (no options: --help, and a refusal of any other)
    from moe_numba.runtime import get_runtime

    runtime = get_runtime()
    print(f"launches through the driver (ctypes): {runtime.driver is not None}")
    for T, A in SHAPES:
        inputs = case(T, A)
        for name, fn in operations(T, A, *inputs).items():
            if A == 1 and name not in ("permute", "permute, new counts"):
                continue
            busy, after_sync = timed(fn), timed(fn, busy=False, rounds=2)
            print(
                f"T={T:5d} A={A:3d} {name:19s} host us: GPU busy {busy:6.1f}, "
                f"after a sync {after_sync:6.1f}",
                flush=True,
            )
        if (T, A) == SHAPES[0]:
            x, routes, probs, counts, _, _ = inputs
            parts = pieces(A, x, routes, probs, counts)
            for name, fn in parts.items():
                print(f"    {name:30s} {timed(fn):6.2f} us", flush=True)
            # the same through cuda.core (nothing recorded with the driver is replayed)
            with runtime.use_driver(None):
                permute = operations(T, A, *inputs)["permute"]
                print(f"    {'launch, cuda.core':30s} {timed(parts['launch']):6.2f} us")
                print(f"    {'whole permute, cuda.core':30s} {timed(permute):6.2f} us")


if __name__ == "__main__":
    main()
