"""The public functions on torch tensors: each call takes one of three routes.

================  ===========================================  ==================================
route             taken when                                   what it is
================  ===========================================  ==================================
replay            plain eager execution                        the recorded launches of the
                  (:func:`._route.eager`), the call key        call key, with the new addresses
                  recorded (plain CUDA tensors,                (:mod:`._replay`)
                  ``validate=False``), autograd not recording
direct            torch would do nothing else with the call    the op's implementation on its
                  (:func:`._route.eager`, ``plain_tensors``)   checked plan; autograd records it
                                                               through a ``Function`` made of
                                                               the op's own autograd functions
custom op         anything else: ``jit.trace``, ``make_fx``,   ``torch.ops.moe_numba.*``: torch
                  ``torch.export``, ``torch.compile``,         sees the op; its fake kernel gives
                  ``torch.func``, forward AD, dispatch and     shapes, its registered autograd
                  function modes, tensor subclasses, meta      the gradients
                  tensors
================  ===========================================  ==================================

Every route gives the same bits and the same errors: the direct route and the custom op's
implementation check a call's metadata in the core, as for every other array kind; the fake
kernels run the same checks on traced tensors.
"""

import torch

from .. import _core
from .._capacities import capacities_from
from . import _direct, _ops, _replay, _sort_chunks
from ._autograd import DirectPermute, DirectUnpermute
from ._direct import check_all_tensors
from ._route import eager, plain_tensors, refuse_unsupported

_grad_enabled = torch.is_grad_enabled
_Tensor = torch.Tensor
_compiling = torch.compiler.is_compiling


def _recorded(arrays, differentiable):
    """Whether autograd records a call: grad mode on and an input of ``differentiable``
    (indices into ``arrays``) requires a gradient."""
    if not _grad_enabled():
        return False
    for i in differentiable:
        x = arrays[i]
        if type(x) is _Tensor and x.requires_grad:  # (the direct route's tensors are plain)
            return True
    return False


def permute(arrays, values, tokens_per_expert):
    """:func:`moe_numba.moe_permute` on torch tensors (``arrays``: its PermuteArrays;
    ``values``: its scalar arguments, in the order of ``_core.PERMUTE_SCALARS``)."""
    fast = eager()  # (then the replay, else the direct route, may skip the dispatcher)
    if fast:
        outputs = _replay.PERMUTE(arrays, values, tokens_per_expert)  # (None if recorded)
        if outputs is not None:
            return outputs
    if fast and plain_tensors(arrays):
        recorded = _recorded(arrays, (0, 3))
        scalars = _core.permute_scalars(*values)
        backend, plan = _direct.planned_permute(arrays, scalars, tokens_per_expert)
        if not recorded:
            return _direct.permute(backend, plan, arrays, scalars, tokens_per_expert)
        outputs = DirectPermute.apply(backend, plan, *arrays, *_op_scalars(values, plan.capacities))
    else:
        refuse_unsupported("moe_permute", arrays)
        check_all_tensors(arrays)
        capacities = None
        if values[5] < 0:  # (the schema takes a list of ints; dynamo's may be traced)
            capacities = (
                tokens_per_expert if _compiling() else capacities_from(tokens_per_expert, values[0])
            )
        outputs = _ops.permute(*arrays, *_op_scalars(values, capacities))
    return _asked(outputs, values)


def _asked(outputs, values):
    """``moe_permute``'s tuple from the op's six outputs: ``expert_indices`` and
    ``expert_offsets`` only where asked for (``values``: the call's scalars)."""
    indices, offsets = values[4], values[7]
    if indices and offsets:
        return outputs
    if not (indices or offsets):
        return outputs[:4]
    return (*outputs[:4], outputs[4] if indices else outputs[5])


def _op_scalars(values, capacities):
    """The custom op's scalar arguments: ``tokens_per_expert`` as the checked ints (None
    under ``override_buffer_size``, which the contract ignores them for)."""
    (num_experts, alignment, do_gather, ue8m0, indices, override, validate, offsets) = values
    if override >= 0 or capacities is None:
        counts = None
    elif isinstance(capacities, (list, tuple)):
        counts = list(capacities)
    else:
        counts = capacities.tolist()
    return (num_experts, counts, alignment, do_gather, ue8m0, indices, override, validate, offsets)


def unpermute(arrays, values):
    """:func:`moe_numba.moe_unpermute` on torch tensors (``values`` in the order of
    ``_core.UNPERMUTE_SCALARS``)."""
    fast = eager()
    if fast:
        outputs = _replay.UNPERMUTE(arrays, values)  # (None if autograd records the call)
        if outputs is not None:
            return outputs
    if fast and plain_tensors(arrays):
        recorded = _recorded(arrays, (0, 3))
        scalars = _core.unpermute_scalars(*values)
        backend, plan = _direct.planned_unpermute(arrays, scalars)
        if recorded:
            return DirectUnpermute.apply(backend, plan, *arrays, *values)
        return _direct.unpermute(backend, plan, arrays, scalars)
    refuse_unsupported("moe_unpermute", arrays)
    check_all_tensors(arrays)
    return _ops.unpermute(*arrays, *values)


def permute_backward(arrays, values):
    """:func:`moe_numba.moe_permute_backward` on torch tensors."""
    fast = eager()
    if fast:
        outputs = _replay.PERMUTE_BACKWARD(arrays, values)  # (None if autograd records it)
        if outputs is not None:
            return outputs
    if fast and plain_tensors(arrays) and not _recorded(arrays, (0, 1)):
        return _direct.permute_backward(arrays, values)
    refuse_unsupported("moe_permute_backward", arrays)
    check_all_tensors(arrays)
    grad_rows, grad_probs = arrays[0], arrays[1]
    if grad_rows is None and grad_probs is None:
        return None, None
    hidden, probs = _ops.permute_backward(*arrays, *values)
    return (None if grad_rows is None else hidden), (None if grad_probs is None else probs)


def unpermute_backward(arrays, values):
    """:func:`moe_numba.moe_unpermute_backward` on torch tensors."""
    fast = eager()
    if fast:
        outputs = _replay.UNPERMUTE_BACKWARD(arrays, values)  # (None if autograd records it)
        if outputs is not None:
            return outputs
    if fast and plain_tensors(arrays) and not _recorded(arrays, (0, 1, 2, 5)):
        return _direct.unpermute_backward(arrays, values)
    refuse_unsupported("moe_unpermute_backward", arrays)
    check_all_tensors(arrays)
    grad_out, grad_slots = arrays[0], arrays[1]
    if grad_out is None and grad_slots is None:
        return None, None
    rows, probs = _ops.unpermute_backward(*arrays, *values)
    return (None if grad_out is None else rows), probs


sort_chunks = _sort_chunks.sort_chunks
