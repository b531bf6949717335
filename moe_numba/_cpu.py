"""The CPU backend: outputs from ``moe_cpu``'s caching allocator, then its Cython stages.

Imported on the first call with NumPy arrays. Both backends (this module and :mod:`._gpu`)
offer one function per op (:mod:`.ops`), named as the op: ``op(plan, arrays, empty=...) ->
(outputs, status)``, where ``outputs`` is the op's outputs NamedTuple (:mod:`._outputs`) and
``status`` its status words (:mod:`.abi`) when ``plan.validate`` is true, else None.
"""

from __future__ import annotations

import numpy as np

import moe_cpu

from . import abi
from ._contract import UnpermuteArrays
from ._outputs import (
    PermuteBackwardOutputs,
    permute_outputs,
    sort_outputs,
    unpermute_backward_outputs,
    unpermute_outputs,
)

# moe_cpu is compiled apart from this package: it must agree on the numbers they exchange
abi.check_tables("moe_cpu", moe_cpu.STATUS_SLOTS, moe_cpu.DATA_TYPES)


def _as_bytes(x):
    """A C-contiguous NumPy array as ``uint8 [rows, row_bytes]`` (the rows' raw bytes)."""
    return x.view(np.uint8).reshape(x.shape[0], x.shape[1] * x.dtype.itemsize)


def _kernel_view(x, plan):
    """float32 rows as they are, 16-bit rows as their uint16 bit patterns."""
    return x if plan.data_type == abi.DATA_FLOAT32 else x.view(np.uint16)


def permute(plan, arrays, empty=moe_cpu.empty):
    """Run ``moe_permute`` on NumPy arrays.

    Parameters
    ----------
    plan : PermutePlan
        The call's plan, with its capacities.
    arrays : PermuteArrays
        The call's NumPy arrays.
    empty : callable, optional
        ``empty(shape, dtype)`` allocates each output and the status words (tests pass one
        that fills them with garbage).

    Returns
    -------
    outputs : PermuteOutputs
    status : numpy.ndarray or None
        The status words when ``plan.validate`` is true.
    """
    out = permute_outputs(plan, empty)
    status = empty((abi.PERMUTE_STATUS_LEN,), np.int64)
    moe_cpu.permute(
        _as_bytes(arrays.hidden_states) if plan.do_gather else None,
        _as_bytes(arrays.scale) if plan.gather_scale else None,
        arrays.expert_routemap_topk,
        arrays.expert_prob_topk,
        plan.capacities,
        _as_bytes(out.hidden) if plan.do_gather else None,
        _as_bytes(out.scale) if plan.gather_scale else None,
        out.rowmap,
        out.probs,
        out.indices,
        out.offsets,
        status,
        alignment=plan.alignment,
        validate=plan.validate,
    )
    return out, (status if plan.validate else None)


def unpermute(plan, arrays, empty=moe_cpu.empty):
    """Run ``moe_unpermute`` on NumPy arrays (parameters and returns as :func:`permute`)."""
    out = unpermute_outputs(plan, empty)
    hidden, slot_probs = out
    status = empty((abi.UNPERMUTE_STATUS_LEN,), np.int64)
    moe_cpu.unpermute(
        _kernel_view(arrays.hidden_states_unzipped, plan),
        arrays.zipped_expertwise_rowmap,
        arrays.expert_routemap_topk,
        arrays.token_prob_unzipped.reshape(-1),
        _kernel_view(hidden, plan),
        slot_probs,
        status,
        data_type=plan.data_type,
        weighted=plan.weighted,
        mix_precision=plan.mix_precision,
    )
    return out, (status if plan.validate else None)


# The gradient ops (docs/gradients.rst), the same interface. Their status slots are in
# moe_cpu.STATUS_SLOTS too, checked above.


def permute_backward(plan, arrays, empty=moe_cpu.empty):
    """Run ``moe_permute_backward`` on NumPy arrays (parameters and returns as
    :func:`permute`; ``plan`` is a ``BackwardPlan``).

    The data gradient is the unweighted combine of :func:`unpermute`; both stages check the
    same two maps and write the same status slots.
    """
    grad_rows, grad_probs, rowmap, routemap = arrays
    hidden = probs = status = None
    if plan.grad_hidden:
        combine = UnpermuteArrays(grad_rows, rowmap, routemap, np.zeros(plan.num_rows, np.float32))
        combine_plan = plan.combine_plan._replace(validate=True)
        (hidden, _), status = unpermute(combine_plan, combine, empty)
    if plan.grad_prob:
        probs = empty((plan.num_tokens, plan.topk), np.float32)
        status = empty((abi.UNPERMUTE_STATUS_LEN,), np.int64)
        moe_cpu.permute_backward_probs(grad_probs, rowmap, routemap, probs, status)
    return PermuteBackwardOutputs(hidden, probs), (status if plan.validate else None)


def _bytes_or_none(x):
    return None if x is None else _as_bytes(x)


def unpermute_backward(plan, arrays, empty=moe_cpu.empty):
    """Run ``moe_unpermute_backward`` on NumPy arrays (parameters and returns as
    :func:`permute`; ``plan`` is a ``BackwardPlan``)."""
    out = unpermute_backward_outputs(plan, empty)
    rows, probs = out
    status = empty((abi.UNPERMUTE_BACKWARD_STATUS_LEN,), np.int64)
    row_probs = arrays.token_prob_unzipped
    moe_cpu.unpermute_backward(
        _bytes_or_none(arrays.grad_hidden_states),
        arrays.grad_expert_prob_topk,
        _bytes_or_none(arrays.hidden_states_unzipped) if plan.dot else None,
        arrays.zipped_expertwise_rowmap,
        arrays.expert_routemap_topk,
        None if row_probs is None else row_probs.reshape(-1),
        _bytes_or_none(rows),
        probs,
        status,
        data_type=plan.data_type if plan.grad_hidden else abi.DATA_FLOAT32,  # no rows: unused
        weighted=plan.weighted,
        num_rows=plan.num_rows,
    )
    return out, (status if plan.validate else None)


def sort_chunks(plan, arrays, empty=moe_cpu.empty):
    """Run ``moe_sort_chunks`` on NumPy arrays (host sizes only: the plan holds them).

    Parameters and results as for :func:`permute`; the status words are those of the
    sizes, which :func:`~._contract_sort.check_sort_metadata` has already checked: None.
    """
    out = sort_outputs(plan, empty)
    status = empty((abi.SORT_STATUS_LEN,), np.int64)
    moe_cpu.sort_chunks(
        _as_bytes(arrays.x),
        plan.sizes,
        plan.order,
        arrays.probs,
        _as_bytes(out.y),
        out.probs,
        out.lengths,
        status,
    )
    return out, None
