"""``moe_permute`` / ``moe_unpermute`` called with torch tensors: checks, then the custom ops.

:func:`moe_numba.moe_permute` and :func:`moe_numba.moe_unpermute` hand every call with a
torch tensor among its arrays to these functions. In eager mode the call's metadata is
checked first, by the same code and with the same errors as for any other array kind; then
the op's implementation runs (through a ``torch.autograd.Function`` when autograd records
the call). While ``torch.compile`` traces, the
custom ops' fake kernels run those checks instead (on the traced tensors), so the traced code
here is only the op call.
"""

import torch

from .. import _api
from . import _autograd, _ops, _replay


def _check_all_tensors(arrays):
    """With one torch tensor among the arrays, every array must be one (the custom ops take
    tensors only; mixing kinds would leave the outputs' kind undefined)."""
    named = {name: x for name, x in arrays._asdict().items() if x is not None}
    tensor = next(name for name, x in named.items() if isinstance(x, torch.Tensor))
    for name, x in named.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(
                f"{tensor} is a torch.Tensor but {name} is a "
                f"{type(x).__module__}.{type(x).__name__}: pass every array as a torch tensor "
                "(on one device), or none"
            )


# how a call runs (see _route)
_OP, _EAGER, _RECORDED = "op", "eager", "recorded"


def _route(arrays, differentiable):
    """How a call runs: ``_OP``, through the custom op, while something traces it
    (``torch.compile``, fake or functional tensors); else ``_EAGER``, the op's implementation
    on the checked plan, or, when autograd records the call (a differentiable input requires
    a gradient), ``_RECORDED``, a ``torch.autograd.Function`` made of the same functions
    (:mod:`._autograd`). Skipping the dispatcher saves host time on every untraced call, in
    training and in serving."""
    if torch.compiler.is_compiling():
        return _OP
    if any(type(x) is not torch.Tensor for x in arrays if x is not None):
        return _OP
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in differentiable):
        return _RECORDED
    return _EAGER


def _replayable(arrays, scalars):
    """Whether an eager call may be recorded for a replay (:mod:`._replay`): on CUDA
    tensors, with ``validate=False``."""
    return scalars["validate"] is False and arrays[0] is not None and arrays[0].is_cuda


def _checked(planned, arrays, *args):
    """(backend, plan) of a call (``planned(arrays, *args)``), its metadata checked as for
    every other array kind, and every array a tensor."""
    backend, plan = planned(arrays, *args)
    _check_all_tensors(arrays)
    return backend, plan


def moe_permute(arrays, scalars, tokens_per_expert):
    """:func:`moe_numba.moe_permute` on torch tensors, through ``moe_numba::permute``.

    ``arrays`` and ``scalars`` are what the CPU and GPU paths check (``PermuteArrays`` and
    the dict of the other checked arguments by name).
    """
    return_expert_indices = scalars["return_expert_indices"]
    route = _route(arrays, (arrays.hidden_states, arrays.expert_prob_topk))
    if route == _EAGER:  # (every array is a torch.Tensor: _route gives _OP otherwise)
        backend, plan = _api.planned_permute(arrays, scalars, tokens_per_expert)
        if _replayable(arrays, scalars):
            return _replay.PERMUTE.run(backend, plan, arrays, scalars, tokens_per_expert)
        return _ops.permute_planned(backend, plan, arrays, scalars["validate"])
    override_buffer_size = scalars["override_buffer_size"]
    if not torch.compiler.is_compiling():
        backend, plan = _checked(_api.planned_permute, arrays, scalars, tokens_per_expert)
        if route == _OP and plan.capacities is not None:  # the checked ints the schema takes
            tokens_per_expert = plan.capacities.tolist()
    if override_buffer_size >= 0:  # ignored by the contract, so kept out of the schema
        tokens_per_expert = None
    inputs = (
        *arrays,
        scalars["num_experts"],
        tokens_per_expert,
        scalars["padding_alignment"],
        scalars["do_gather"],
        scalars["using_ue8m0_scale"],
        return_expert_indices,
        override_buffer_size,
        scalars["validate"],
    )
    if route == _RECORDED:
        outputs = _autograd.EagerPermute.apply(backend, plan, *inputs)
    else:
        outputs = _ops.permute(*inputs)
    return outputs if return_expert_indices else outputs[:4]


def moe_unpermute(arrays, scalars):
    """:func:`moe_numba.moe_unpermute` on torch tensors, through ``moe_numba::unpermute``
    (``arrays`` and ``scalars`` as the CPU and GPU paths check them)."""
    route = _route(arrays, (arrays.hidden_states_unzipped, arrays.token_prob_unzipped))
    if route == _EAGER:  # (tensors only, as above)
        backend, plan = _api.planned_unpermute(arrays, scalars)
        if _replayable(arrays, scalars):
            return _replay.UNPERMUTE.run(backend, plan, arrays, scalars)
        return _ops.unpermute_planned(backend, plan, arrays, scalars["validate"])
    if torch.compiler.is_compiling():
        return _ops.unpermute(*arrays, *scalars.values())
    backend, plan = _checked(_api.planned_unpermute, arrays, scalars)
    if route == _RECORDED:
        return _autograd.EagerUnpermute.apply(backend, plan, *arrays, *scalars.values())
    return _ops.unpermute(*arrays, *scalars.values())
