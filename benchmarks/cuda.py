"""The bench on a GPU: each operation with and without validation, in the three modes of
:class:`.timers.CudaTimer`, against a device copy of the same bytes."""

from __future__ import annotations

import sys

from .workload import operations, time_operations


def bench_case(case, target, timer):
    """Results of the permute and the weighted unpermute of ``case`` on ``target`` (a
    :class:`.target.CudaTarget`), each with ``validate=True`` and ``validate=False``, timed
    by ``timer`` (a :class:`.timers.CudaTimer`).

    A warning goes to stderr when a batch outlasted the stream hold (its GPU time then
    includes host time).
    """
    before = timer.hold_timeouts
    ops = operations(case, target, validates=(True, False))
    results = time_operations(case, ops, target, timer)
    warn_hold_timeouts(case, timer.hold_timeouts - before)
    return results


def warn_hold_timeouts(case, timeouts):
    """Say on stderr that ``timeouts`` timed batches of ``case`` outlasted the stream hold
    (their GPU times then include host time), if any did."""
    if timeouts:
        print(
            f"warning: {case.label()}: {timeouts} timed batch(es) took the host longer to "
            "enqueue than the stream hold lasts; their GPU times include host time",
            file=sys.stderr,
        )
