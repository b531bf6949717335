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
    differentiable = (arrays.hidden_states, arrays.expert_prob_topk)
    run = _implementation(arrays, differentiable, *_PERMUTE)
    if run is _ops.permute_eager:  # nothing traces or records the call: run its plan
        # (every array is a torch.Tensor: _implementation returns the op otherwise)
        backend, plan = _api.planned_permute(arrays, scalars, tokens_per_expert)
        return _ops.permute_planned(backend, plan, arrays, scalars["validate"])
    override_buffer_size = scalars["override_buffer_size"]
    if not torch.compiler.is_compiling():
        _, plan = _checked(_api.planned_permute, arrays, scalars, tokens_per_expert)
        if plan.capacities is not None:  # the checked counts, as the ints the schema takes
            tokens_per_expert = plan.capacities.tolist()
    if override_buffer_size >= 0:  # ignored by the contract, so kept out of the schema
        tokens_per_expert = None
    outputs = run(
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
    return outputs if return_expert_indices else outputs[:4]


def moe_unpermute(arrays, scalars):
    """:func:`moe_numba.moe_unpermute` on torch tensors, through ``moe_numba::unpermute``
    (``arrays`` and ``scalars`` as the CPU and GPU paths check them)."""
    differentiable = (arrays.hidden_states_unzipped, arrays.token_prob_unzipped)
    run = _implementation(arrays, differentiable, *_UNPERMUTE)
    if run is _ops.unpermute_eager:  # nothing traces or records the call: run its plan
        backend, plan = _api.planned_unpermute(arrays, scalars)  # (tensors only, as above)
        return _ops.unpermute_planned(backend, plan, arrays, scalars["validate"])
    if not torch.compiler.is_compiling():
        _checked(_api.planned_unpermute, arrays, scalars)
    return run(*arrays, *scalars.values())
