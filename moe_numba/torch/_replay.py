"""Untraced calls on torch CUDA tensors, repeated from a recording of the same call key.

Most of a small call's host time goes to the Python between the arguments and the driver:
dispatch, the cached checks and plans, buffer wrappers, the launch plan's lookups. None of it
changes while the call's key repeats, so the first call of a key with ``validate=False`` is
recorded (:class:`moe_numba._gpu.RecordedCall`) and every later one replays it: it allocates
the recorded outputs (``new_empty``) and scratch (an address from torch's caching allocator,
given back after the launches) and hands their addresses and the inputs' to one C launch
sequence (:mod:`moe_numba.runtime._recording`). The direct route (:mod:`._direct`) asks the
op's replays first and records. The key, the lookup and the replay run compiled
(:mod:`._replay_c`, built with the C launcher; without it nothing is recorded).

The key holds everything that the checks, the plan and the launches read: per tensor its
shape, dtype, device and the low four bits of its address (the copies' word widths follow
alignment), and it is contiguous (the checks require it, so its strides follow from its
shape); every scalar argument by value and exact type (``True`` is not ``1`` here), the
capacities included. Any other call takes the full path, which checks everything: arrays
that are not all contiguous CUDA ``torch.Tensor`` objects, a call that takes the custom op
(:mod:`._route`), ``validate=True``, capacities that are not a
list or tuple of ints, a key met for the first time (recorded); and so does a replay that
finds another current device. A call that autograd records replays inside its autograd
``Function`` (:mod:`._autograd`), whose forward runs with grad mode off.

A training step passes new capacities every call, so a permute's key (which holds them) is
met once. The GPU backend stages capacities met for the first time
(:mod:`moe_numba.runtime._staged`) and gives repeated ones a device copy; a recording of a
call whose capacities were staged is kept under the "rows key": the call's key with the
capacities' row count in their place (the kernels' grids and the outputs' shapes depend on
the counts only through it). A call whose key misses is looked up again by its rows key, and
such a replay stages its own counts, after checking them as the full path does (a list or
tuple of ``num_experts`` ints >= 0); not while the stream is being captured into a CUDA
graph, which would read the pinned block at every replay of the graph. Capacities equal to
those the replay staged last take the full path instead: repeated (fixed) capacities then
get a device copy and a recording under their own key. A graph may also outlive a replay
and the device copy of its capacities, so a replay that holds one does not run while the
stream is being captured either: the full path keeps a graph's capacities for good
(:func:`moe_numba.runtime._staged.kept_words`).
"""

from __future__ import annotations

from .._cache import on_clear
from ..ops import OPS

try:  # (built with the C launcher: without it nothing is recorded)
    from ._replay_c import ReplayedOp
except ImportError:
    ReplayedOp = None


class _Unrecorded:
    """An op's stand-in for :class:`ReplayedOp` where the extension is not built: its calls
    run without a recording and none is replayed."""

    runs = 0

    def __init__(self, op, run):
        self._run = run

    def __call__(self, arrays, scalars, tokens_per_expert=None):
        return None

    def outputs(self, arrays, scalars, tokens_per_expert=None):
        return None

    def clear(self):
        """Nothing is recorded, so nothing to forget."""

    def run(self, backend, plan, arrays, scalars, tokens_per_expert=None):
        return self._run(backend, plan, arrays, None)


def _recorded_run(op):
    """``run`` of :class:`ReplayedOp`: the backend's method of ``op``, its outputs."""

    def run(backend, plan, arrays, call):
        return getattr(backend, op.name)(plan, arrays, call=call)[0]

    return run


_Op = _Unrecorded if ReplayedOp is None else ReplayedOp
# (moe_sort_chunks's scalars hold sequences, which no replay key takes: its calls always take
# the full path)
REPLAYS = {op: _Op(op, _recorded_run(op)) for op in OPS}


@on_clear
def clear():
    """Forget every op's replays: the next calls record anew (one of the clears of
    :func:`moe_numba.clear`, registered when the torch integration loads)."""
    for replays in REPLAYS.values():
        replays.clear()
