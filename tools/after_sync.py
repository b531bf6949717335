"""Host time of one call after different kinds of wait (docs/lab-notes.rst, "Host time
after a sync"): is the extra time after a sync ours, or the host's?

Run on a machine with a GPU and torch::

    python tools/after_sync.py

T = 256, A = 16 (the shapes and pieces of tools/host_time.py). Each figure is the median
host time of 200 calls, each made right after the wait of its column; "GPU busy" is
host_time's busy measurement.
"""

from __future__ import annotations

import statistics
import time

import host_time
import torch
from _cli import parser


def spin(us):
    """Busy-wait ``us`` microseconds in Python."""
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


def after(fn, wait, n=200):
    """Median µs of ``fn()`` right after ``wait()``, over ``n`` calls."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(n):
        wait()
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(samples) * 1e6


def waits():
    """The waits, by column name."""
    stream = torch.cuda.current_stream()

    def query_spin():
        while not stream.query():
            pass

    def gpu_sleep_then_query_spin():
        torch.cuda._sleep(200_000)  # (about 100 µs of GPU time)
        query_spin()

    return {
        "sync": torch.cuda.synchronize,
        "sync, spin 300us": lambda: (torch.cuda.synchronize(), spin(300)),
        "spin on query()": query_spin,
        "GPU sleep, spin on query()": gpu_sleep_then_query_spin,
        "sync, sleep 300us": lambda: (torch.cuda.synchronize(), time.sleep(300e-6)),
    }


def main(argv=None):
    parser(__doc__).parse_args(argv)  # (no options: --help, and a refusal of any other)
    T, A = 256, 16
    inputs = host_time.case(T, A)
    ops = host_time.operations(T, A, *inputs)
    x, routes, probs, counts, _, _ = inputs
    parts = host_time.pieces(A, x, routes, probs, counts)
    calls = {
        "permute": ops["permute"],
        "unpermute": ops["unpermute"],
        "small add_": parts["small add_"],
        "torch.empty (300, H)": parts["torch.empty (300, H) bf16"],
        "launch": parts["launch"],
        "call_key": parts["call_key"],
    }
    columns = waits()
    print(f"{'µs':22s} {'GPU busy':>10s} " + " ".join(f"{c:>27s}" for c in columns))
    for name, fn in calls.items():
        row = " ".join(f"{after(fn, wait):27.1f}" for wait in columns.values())
        print(f"{name:22s} {host_time.timed(fn):10.1f} {row}", flush=True)


if __name__ == "__main__":
    main()
