"""The bench on the CPU backend: wall time per call against moe_cpu's parallel copy, and
against the vectorised NumPy implementation (:mod:`.numpy_baseline`)."""

from __future__ import annotations

import dataclasses

from . import numpy_baseline
from .cases import make_inputs
from .timers import WallTimer
from .workload import operations, time_operations


def bench_case(case, target, timer):
    """Results of the permute and the weighted unpermute of ``case`` on ``target`` (a
    :class:`.target.CpuTarget`), timed by ``timer`` (a :class:`.timers.WallTimer`), and
    of the NumPy baseline, with a third as many repetitions (at least 3)."""
    results = time_operations(case, operations(case, target), target, timer)
    x = make_inputs(case)

    def numpy_permute():
        return numpy_baseline.permute(x.hidden, x.routemap, x.probs, x.counts, case.alignment)

    rows, rowmap, row_probs = numpy_permute()
    baselines = {
        "permute": numpy_permute,
        "unpermute weighted": lambda: numpy_baseline.unpermute(rows, rowmap, x.routemap, row_probs),
    }
    baseline_timer = WallTimer(max(3, timer.repeat // 3))
    return [
        dataclasses.replace(r, numpy_us=baseline_timer.time(baselines[r.op])["wall"])
        for r in results
    ]
