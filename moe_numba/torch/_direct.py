"""The direct route: an op's implementation on its checked plan, without the dispatcher.

Taken only when torch would do nothing else with the call (:mod:`._route`). On CUDA tensors
with ``validate=False`` a call whose key was recorded replays its recording
(:mod:`._replay`), and a key met for the first time is recorded; any other call runs the
core on the tensors (:func:`._ops.run_on_tensors`), exactly as the custom op's implementation
does.
"""

import torch

from .. import _core
from .._contract_backward import PermuteBackwardArrays, UnpermuteBackwardArrays
from . import _replay
from ._bridge import check_dtypes
from ._ops import run_on_tensors


def check_all_tensors(arrays):
    """With one torch tensor among the arrays, every array must be one (the custom ops take
    tensors only; mixing kinds would leave the outputs' kind undefined), of a dtype moe-numba
    serves."""
    check_dtypes(arrays)
    _check_kinds(arrays)


def _check_kinds(arrays):
    """The first half of :func:`check_all_tensors`: every array a tensor."""
    named = {name: x for name, x in arrays._asdict().items() if x is not None}
    tensor = next(name for name, x in named.items() if isinstance(x, torch.Tensor))
    for name, x in named.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"{tensor} is a torch.Tensor but {name} is a "
                f"{type(x).__module__}.{type(x).__name__}: pass every array as a torch tensor "
                "(on one device), or none"
            )


def _replayable(arrays, validate):
    """Whether a call may be recorded for a replay: on CUDA tensors, with
    ``validate=False``."""
    like = next(x for x in arrays if x is not None)
    return validate is False and like.is_cuda


def _planned(planned, arrays, *arguments):
    """(backend, plan) of a call on tensors from the core's ``planned(arrays, *arguments)``,
    checked as for every array kind."""
    check_dtypes(arrays)  # (first: the core would name the bits' dtype, not torch's)
    backend, plan = planned(arrays, *arguments)
    _check_kinds(arrays)
    return backend, plan


def planned_permute(arrays, scalars, tokens_per_expert):
    """(backend, plan) of a permute on tensors, checked as for every array kind."""
    return _planned(_core.planned_permute, arrays, scalars, tokens_per_expert)


def planned_unpermute(arrays, scalars):
    """(backend, plan) of an unpermute on tensors, checked as for every array kind."""
    return _planned(_core.planned_unpermute, arrays, scalars)


def permute(backend, plan, arrays, scalars, tokens_per_expert):
    """``moe_permute``'s outputs (its tuple: the optional ones only where asked for) of a
    checked permute."""
    validate = scalars["validate"]
    if _replayable(arrays, validate):
        return _replay.PERMUTE.run(backend, plan, arrays, scalars, tokens_per_expert)
    return run_on_tensors(_core.run_permute, backend, plan, arrays, validate)


def unpermute(backend, plan, arrays, scalars):
    """The outputs of a checked unpermute."""
    validate = scalars["validate"]
    if _replayable(arrays, validate):
        return _replay.UNPERMUTE.run(backend, plan, arrays, scalars)
    return run_on_tensors(_core.run_unpermute, backend, plan, arrays, validate)


def permute_backward(arrays, values):
    """``moe_permute_backward``'s outputs (None for an absent gradient) on tensors, for a
    call whose replay was asked first (as for :func:`permute`)."""
    return _gradient(
        _replay.PERMUTE_BACKWARD,
        _core.PERMUTE_BACKWARD_SCALARS,
        _core.planned_permute_backward,
        _core.run_permute_backward,
        arrays,
        values,
    )


def unpermute_backward(arrays, values):
    """``moe_unpermute_backward``'s outputs (None for an absent gradient) on tensors, for a
    call whose replay was asked first."""
    return _gradient(
        _replay.UNPERMUTE_BACKWARD,
        _core.UNPERMUTE_BACKWARD_SCALARS,
        _core.planned_unpermute_backward,
        _core.run_unpermute_backward,
        arrays,
        values,
    )


def _gradient(replays, names, planned, run, arrays, values):
    """A gradient op on tensors that no replay repeated: its checked plan run (and
    recorded)."""
    scalars = dict(zip(names, values, strict=True))
    backend, plan = _planned(planned, arrays, scalars)
    validate = scalars["validate"]
    if plan.computes and _replayable(arrays, validate):
        return replays.run(backend, plan, arrays, scalars)
    return run_on_tensors(run, backend, plan, arrays, validate)


# the backward ops' signatures (what _autograd's Functions call when autograd does not record
# the backward)


def permute_backward_of(grad_rows, grad_probs, rowmap, routemap, validate):
    """:func:`permute_backward` with ``moe_numba::permute_backward``'s arguments: its
    replay, else its checked plan."""
    arrays = PermuteBackwardArrays(grad_rows, grad_probs, rowmap, routemap)
    values = (validate,)
    outputs = _replay.PERMUTE_BACKWARD(arrays, values)
    return permute_backward(arrays, values) if outputs is None else outputs


def unpermute_backward_of(grad_out, grad_slots, rows, rowmap, routemap, probs, *values):
    """:func:`unpermute_backward` with ``moe_numba::unpermute_backward``'s arguments: its
    replay, else its checked plan."""
    arrays = UnpermuteBackwardArrays(grad_out, grad_slots, rows, rowmap, routemap, probs)
    outputs = _replay.UNPERMUTE_BACKWARD(arrays, values)
    return unpermute_backward(arrays, values) if outputs is None else outputs
