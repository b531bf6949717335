"""One run of the bench: its cases in order, progress on stderr, each case's rows of the table
as soon as it is timed (and the JSON rewritten), then the comparison and the plot."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from . import records
from .report import print_comparison, print_table


@dataclass(frozen=True)
class Settings:
    """A run, its options checked (``python -m benchmarks bench`` builds it).

    Attributes
    ----------
    target : CpuTarget or CudaTarget
        Where to run (:mod:`.target`).
    cases : list of Case
        The shapes, in order.
    repeat : int
        Timed repetitions per measurement.
    json : str or None
        Where to save the results.
    previous : tuple or None
        ``(path, results)`` of an earlier run to compare with.
    plot : str or None
        Where to save the plot.
    peers : PeerBench or None
        Time the peers' ops beside moe-numba's (:mod:`.peers`), loaded.
    """

    target: object
    cases: list
    repeat: int
    json: str | None = None
    previous: tuple | None = None
    plot: str | None = None
    peers: object = None


def run(settings):
    """Time every case of ``settings`` and report; returns the exit status (0, or with
    peers 1 when a peer's output differs from moe-numba's)."""
    target, cases = settings.target, settings.cases
    print(
        f"backend: {target.description}; {len(cases)} shape(s), "
        f"{settings.repeat} timed repetitions each",
        file=sys.stderr,
    )
    if target.device == "cuda":
        from . import cuda as backend
        from .timers import CudaTimer as Timer
    else:
        from . import cpu as backend
        from .timers import WallTimer as Timer
    timer = Timer(settings.repeat)
    peers = settings.peers
    bench_case = backend.bench_case if peers is None else peers.bench_case

    results = []
    began = time.perf_counter()
    for i, case in enumerate(cases, 1):
        print(
            f"[{i}/{len(cases)}] {case.label()} ({time.perf_counter() - began:.0f} s so far)",
            file=sys.stderr,
            flush=True,
        )
        found = bench_case(case, target, timer)
        print_table(found, header=not results)
        if peers is not None:
            peers.print_notes(case)
        sys.stdout.flush()
        results += found
        if settings.json:  # after every shape, so that a run cut short keeps what it measured
            records.save(settings.json, target.description, results)
    if settings.previous:
        print_comparison(results, settings.previous[1], settings.previous[0])
    if settings.plot:
        from .plot import plot

        plot(results, settings.plot, target.description)
    return 0 if peers is None else peers.status()
