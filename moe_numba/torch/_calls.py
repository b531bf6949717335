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
from .._contract import check_permute_metadata, check_unpermute_metadata, with_capacities
from . import _autograd, _ops


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


# per op: its implementation, the autograd Function of it, the custom op
_PERMUTE = (_ops.permute_eager, _autograd.EagerPermute, _ops.permute)
_UNPERMUTE = (_ops.unpermute_eager, _autograd.EagerUnpermute, _ops.unpermute)


def _implementation(arrays, differentiable, eager, recorded, op):
    """The function that runs a call: the custom op ``op`` while something traces it
    (``torch.compile``, fake or functional tensors); else its own implementation ``eager``,
    or, when autograd records the call (a differentiable input requires a gradient), the
    ``torch.autograd.Function`` ``recorded`` made of the same functions. Skipping the
    dispatcher saves host time on every untraced call, in training and in serving."""
    if torch.compiler.is_compiling():
        return op
    if any(type(x) is not torch.Tensor for x in arrays if x is not None):
        return op
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in differentiable):
        return recorded.apply
    return eager


def _checked(calls, arrays, scalars, check_metadata):
    """The plan of a call, its metadata checked as for every other array kind."""
    _, plan = _api._prepare(calls, arrays, scalars, check_metadata)
    _check_all_tensors(arrays)
    return plan


def moe_permute(arrays, scalars, tokens_per_expert):
    """:func:`moe_numba.moe_permute` on torch tensors, through ``moe_numba::permute``.

    ``arrays`` and ``scalars`` are what the CPU and GPU paths check (``PermuteArrays`` and
    the dict of the other checked arguments by name).
    """
    num_experts = scalars["num_experts"]
    padding_alignment = scalars["padding_alignment"]
    override_buffer_size = scalars["override_buffer_size"]
    return_expert_indices = scalars["return_expert_indices"]
    if not torch.compiler.is_compiling():
        plan = _checked(_api._permute_calls, arrays, scalars, check_permute_metadata)
        plan = with_capacities(plan, tokens_per_expert)
        if plan.capacities is not None:  # the checked counts, as the ints the schema takes
            tokens_per_expert = plan.capacities.tolist()
    if override_buffer_size >= 0:  # ignored by the contract, so kept out of the schema
        tokens_per_expert = None
    differentiable = (arrays.hidden_states, arrays.expert_prob_topk)
    outputs = _implementation(arrays, differentiable, *_PERMUTE)(
        *arrays,
        num_experts,
        tokens_per_expert,
        padding_alignment,
        scalars["do_gather"],
        scalars["using_ue8m0_scale"],
        return_expert_indices,
        override_buffer_size,
        scalars["validate"],
    )
    return outputs if return_expert_indices else outputs[:4]


def moe_unpermute(arrays, scalars):
    """:func:`moe_numba.moe_unpermute` on torch tensors, through ``moe_numba::unpermute``
    (``arrays`` and ``scalars`` as the CPU and GPU paths check them)."""
    if not torch.compiler.is_compiling():
        _checked(_api._unpermute_calls, arrays, scalars, check_unpermute_metadata)
    differentiable = (arrays.hidden_states_unzipped, arrays.token_prob_unzipped)
    return _implementation(arrays, differentiable, *_UNPERMUTE)(*arrays, *scalars.values())
