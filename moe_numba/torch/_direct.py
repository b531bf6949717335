"""The direct route: an op's implementation on its checked plan, without the dispatcher.

Taken only when torch would do nothing else with the call (:mod:`._route`). On CUDA tensors
with ``validate=False`` a call whose key was recorded replays its recording
(:mod:`._replay`), and a key met for the first time is recorded; any other call runs the
core on the tensors (:func:`._bridge.run_on_tensors`), exactly as the custom op's
implementation does.
"""

import torch

from .. import _core
from ._bridge import check_dtypes, run_on_tensors
from ._replay import REPLAYS


def check_all_tensors(arrays):
    """With one torch tensor among the arrays, every array must be one (the custom ops take
    tensors only; mixing kinds would leave the outputs' kind undefined), of a dtype moe-numba
    serves."""
    check_dtypes(arrays)
    _check_kinds(arrays)


def _check_kinds(arrays):
    """The second half of :func:`check_all_tensors`: every array a tensor."""
    named = {name: x for name, x in arrays._asdict().items() if x is not None}
    tensor = next(name for name, x in named.items() if isinstance(x, torch.Tensor))
    for name, x in named.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"{tensor} is a torch.Tensor but {name} is a "
                f"{type(x).__module__}.{type(x).__name__}: pass every array as a torch tensor "
                "(on one device), or none"
            )


def prepare(op, arrays, scalars, capacities=None):
    """(backend, plan) of a call on tensors, checked as for every array kind."""
    check_dtypes(arrays)  # (first: the core would name the bits' dtype, not torch's)
    backend, plan = _core.prepare(op, arrays, scalars, capacities)
    _check_kinds(arrays)
    return backend, plan


def run(op, backend, plan, arrays, scalars, capacities=None):
    """``op``'s outputs NamedTuple of a checked call: recorded for a replay where it may be
    (CUDA tensors, ``validate=False``), else the core's run on the tensors."""
    if not plan.validate and plan.runs and next(x for x in arrays if x is not None).is_cuda:
        return REPLAYS[op].run(backend, plan, arrays, scalars, capacities)
    return run_on_tensors(op, backend, plan, arrays)


def outputs(op, arrays, scalars, capacities=None):
    """``op``'s outputs NamedTuple of a call that autograd does not record: its replay, else
    its checked plan run (and recorded)."""
    replayed = REPLAYS[op].outputs(arrays, scalars, capacities)
    if replayed is not None:
        return op.outputs._make(replayed)
    if op.host_values is not None:
        arrays, scalars = op.host_values(arrays, scalars)
    backend, plan = prepare(op, arrays, scalars, capacities)
    return run(op, backend, plan, arrays, scalars, capacities)
