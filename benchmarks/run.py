"""One run of the bench: its cases in order, progress on stderr, each case's rows of the table
as soon as it is timed (and the record rewritten), then the comparison and the plot."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

from . import environment, records
from .compare import print_comparison
from .report import print_table


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
        Where to write the record; None: under ``benchmarks/results/`` on a GPU
        (:func:`.records.default_path`), nowhere on the CPU.
    previous : Record or None
        An earlier run's record to compare with.
    plot : str or None
        Where to save the plot.
    peers : PeerBench or None
        Time the peers' ops beside moe-numba's (:mod:`.peers`), loaded.
    what : str
        What the record calls the run (``bench``, ``sweep``, ``peers``).
    argv : list of str
        The command line after ``python -m benchmarks`` (for the record).
    """

    target: object
    cases: list
    repeat: int
    json: str | None = None
    previous: object = None
    plot: str | None = None
    peers: object = None
    what: str = "bench"
    argv: list = field(default_factory=list)


def record_path(settings, header):
    """Where the run of ``settings`` writes its record (None: nowhere)."""
    if settings.json:
        return settings.json
    return records.default_path(header) if settings.target.device == "cuda" else None


def run(settings):
    """Time every case of ``settings`` and report; returns the exit status (0, or with
    peers 1 when a peer's output differs from moe-numba's)."""
    target, cases = settings.target, settings.cases
    print(
        f"backend: {target.description}; {len(cases)} shape(s), "
        f"{settings.repeat} timed repetitions each",
        file=sys.stderr,
    )
    header = environment.header(settings.what, target.device, settings.argv, target.description)
    path = record_path(settings, header)
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
        if path:  # after every shape, so that a run cut short keeps what it measured
            records.save_results(path, header, results)
    if path:
        print(f"record: {path}", file=sys.stderr)
    if settings.previous:
        print()
        print_comparison(settings.previous, [r.record() for r in results], "this run")
    if settings.plot:
        from .plot import plot

        plot(results, settings.plot, target.description)
    return 0 if peers is None else peers.status()
