"""The bench on the CPU backend: wall time per call against moe_cpu's parallel copy, and
against the vectorised NumPy implementation (:mod:`._numpy`)."""

from __future__ import annotations

import dataclasses

from . import _numpy
from ._cases import make_inputs
from ._target import CpuTarget
from ._timers import WallTimer
from ._workload import operations, time_operations


def bench_case(case, repeat):
    """Results of the permute and the weighted unpermute of ``case``: ``repeat`` timed calls
    each, and a third as many (at least 3) of the NumPy baseline."""
    target = CpuTarget()
    results = time_operations(case, operations(case, target), target, WallTimer(repeat))
    x = make_inputs(case)
    permuted = _numpy.permute(x.hidden, x.routemap, x.probs, x.counts, case.alignment)
    rows, rowmap, row_probs = permuted
    baselines = {
        "permute": lambda: _numpy.permute(x.hidden, x.routemap, x.probs, x.counts, case.alignment),
        "unpermute weighted": lambda: _numpy.unpermute(rows, rowmap, x.routemap, row_probs),
    }
    timer = WallTimer(max(3, repeat // 3))
    return [dataclasses.replace(r, numpy_us=timer.time(baselines[r.op])["wall"]) for r in results]
