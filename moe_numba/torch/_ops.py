"""The torch custom ops ``moe_numba::permute``, ``unpermute``, ``permute_backward`` and
``unpermute_backward``: implementations and fake kernels.

Each implementation prepares its call in the core (:mod:`moe_numba._core`) and runs it on its
tensors' device (:func:`run_on_tensors`): CUDA tensors go to the GPU backend as they are; CPU
tensors cross to the Cython backend as NumPy views, and the outputs are torch tensors that the
backend wrote through NumPy views (:mod:`._bridge`). The fake kernels (also the ops' meta
kernels) give the shapes of docs/training.rst (the row count is ``override_buffer_size``, or
``sum_e ceil(n_e / A) * A``) and, when the call's ints are not traced, run the contract's
metadata checks, so that ``torch.compile`` reports a bad call while it traces.

A schema has a fixed number of outputs: the optional ones (``expert_indices``,
``expert_offsets``, absent gradients) are always returned, empty when not asked for;
:mod:`._calls` and :mod:`._autograd` drop them.
"""

# no ``from __future__ import annotations``: torch reads the schemas from the annotations
from collections.abc import Sequence

import torch
from torch import Tensor

from .. import _core
from .._capacities import capacities_from, padded_rows
from .._contract import (
    PermuteArrays,
    UnpermuteArrays,
    check_permute_metadata,
    check_unpermute_metadata,
)
from .._contract_backward import PermuteBackwardArrays, UnpermuteBackwardArrays
from ._bridge import TorchAllocator, check_dtypes, metadata, to_numpy


def _absent(like):
    """The stand-in for an output that was not asked for: an empty float32 tensor."""
    return like.new_empty((0,), dtype=torch.float32)


def _on_cpu(tensor):
    return tensor.device.type == "cpu"


# ------------------------------------------------------------------------------------------
# permute


def permute_eager(
    hidden_states: Tensor,
    scale: Tensor | None,
    expert_routemap_topk: Tensor,
    expert_prob_topk: Tensor,
    num_experts: int,
    tokens_per_expert: Sequence[int] | None,
    padding_alignment: int,
    do_gather: bool,
    using_ue8m0_scale: bool,
    return_expert_indices: bool,
    override_buffer_size: int,
    validate: bool,
    return_expert_offsets: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``moe_permute`` (see :func:`moe_numba.moe_permute`); ``expert_indices`` and
    ``expert_offsets`` always last, each empty unless asked for."""
    arrays = PermuteArrays(hidden_states, scale, expert_routemap_topk, expert_prob_topk)
    check_dtypes(arrays)
    scalars = _core.permute_scalars(
        num_experts,
        padding_alignment,
        do_gather,
        using_ue8m0_scale,
        return_expert_indices,
        override_buffer_size,
        validate,
        return_expert_offsets,
    )
    backend, plan = _core.planned_permute(arrays, scalars, tokens_per_expert)
    outputs = run_on_tensors(_core.run_permute, backend, plan, arrays, validate)
    return op_outputs(outputs, plan, hidden_states)


def op_outputs(outputs, plan, like):
    """The op's six outputs from ``moe_permute``'s (``plan``: the call's): ``expert_indices``
    and ``expert_offsets`` always last, an empty int32 stand-in on ``like``'s device for each
    one not asked for (two tensors: an op's outputs may not alias each other)."""
    indices, offsets = plan.return_expert_indices, plan.return_expert_offsets
    if indices and offsets:
        return outputs
    head, asked = outputs[:4], iter(outputs[4:])
    return (
        *head,
        next(asked) if indices else like.new_empty((0,), dtype=torch.int32),
        next(asked) if offsets else like.new_empty((0,), dtype=torch.int32),
    )


def run_on_tensors(run, backend, plan, arrays, validate):
    """``run(backend, plan, arrays, validate[, empty])`` (an op of :mod:`moe_numba._core` on a
    checked plan) on tensors: CUDA tensors as they are; CPU tensors as NumPy views, the
    outputs allocated by torch. The first tensor decides the device; outputs that are None
    stay None."""
    like = next(x for x in arrays if x is not None)
    if not _on_cpu(like):
        return tuple(run(backend, plan, arrays, validate))
    allocate = TorchAllocator()
    outputs = run(backend, plan, arrays._make(map(to_numpy, arrays)), validate, allocate)
    return tuple(None if x is None else allocate.tensor(x) for x in outputs)


# the public functions call the same implementation directly when torch would do nothing else
# with the call (see _route); autograd then records it through _autograd's Function
permute = torch.library.custom_op("moe_numba::permute", mutates_args=())(permute_eager)


def _concrete(*values):
    """Whether no value is a traced (symbolic) int: then the fake kernels run the contract's
    checks, which would otherwise specialise the graph to each value."""
    return not any(isinstance(v, torch.SymInt) for v in values)


@permute.register_fake
def _(
    hidden_states,
    scale,
    expert_routemap_topk,
    expert_prob_topk,
    num_experts,
    tokens_per_expert,
    padding_alignment,
    do_gather,
    using_ue8m0_scale,
    return_expert_indices,
    override_buffer_size,
    validate,
    return_expert_offsets,
):
    counts = () if tokens_per_expert is None else tuple(tokens_per_expert)
    if _concrete(num_experts, padding_alignment, override_buffer_size, *counts):
        arrays = PermuteArrays(hidden_states, scale, expert_routemap_topk, expert_prob_topk)
        check_dtypes(arrays)
        check_permute_metadata(
            metadata(arrays),
            num_experts=num_experts,
            padding_alignment=padding_alignment,
            do_gather=do_gather,
            using_ue8m0_scale=using_ue8m0_scale,
            return_expert_indices=return_expert_indices,
            override_buffer_size=override_buffer_size,
            validate=validate,
            return_expert_offsets=return_expert_offsets,
        )
        if override_buffer_size < 0:
            capacities_from(tokens_per_expert, num_experts)
    if override_buffer_size >= 0:
        num_rows = override_buffer_size
    else:
        num_rows = padded_rows(counts, padding_alignment)
    num_tokens, hidden = hidden_states.shape
    new = hidden_states.new_empty
    gather_scale = do_gather and scale is not None
    return (
        new((num_rows if do_gather else 0, hidden)),
        new((num_tokens, num_experts), dtype=torch.int32),
        new((num_rows,), dtype=torch.float32),
        scale.new_empty((num_rows, scale.shape[1])) if gather_scale else _absent(hidden_states),
        new((num_rows if return_expert_indices else 0,), dtype=torch.int32),
        new((num_experts if return_expert_offsets else 0,), dtype=torch.int32),
    )


# ------------------------------------------------------------------------------------------
# unpermute


def unpermute_eager(
    hidden_states_unzipped: Tensor,
    zipped_expertwise_rowmap: Tensor,
    expert_routemap_topk: Tensor,
    token_prob_unzipped: Tensor,
    total_zipped_tokens: int,
    num_experts: int,
    using_mix_precision: bool,
    using_weighted_combine: bool,
    validate: bool,
) -> tuple[Tensor, Tensor]:
    """``moe_unpermute`` (see :func:`moe_numba.moe_unpermute`)."""
    arrays = UnpermuteArrays(
        hidden_states_unzipped,
        zipped_expertwise_rowmap,
        expert_routemap_topk,
        token_prob_unzipped,
    )
    check_dtypes(arrays)
    scalars = _core.unpermute_scalars(
        total_zipped_tokens, num_experts, using_mix_precision, using_weighted_combine, validate
    )
    backend, plan = _core.planned_unpermute(arrays, scalars)
    return run_on_tensors(_core.run_unpermute, backend, plan, arrays, validate)


unpermute = torch.library.custom_op("moe_numba::unpermute", mutates_args=())(unpermute_eager)


@unpermute.register_fake
def _(
    hidden_states_unzipped,
    zipped_expertwise_rowmap,
    expert_routemap_topk,
    token_prob_unzipped,
    total_zipped_tokens,
    num_experts,
    using_mix_precision,
    using_weighted_combine,
    validate,
):
    if _concrete(total_zipped_tokens, num_experts):
        arrays = UnpermuteArrays(
            hidden_states_unzipped,
            zipped_expertwise_rowmap,
            expert_routemap_topk,
            token_prob_unzipped,
        )
        check_dtypes(arrays)
        check_unpermute_metadata(
            metadata(arrays),
            total_zipped_tokens=total_zipped_tokens,
            num_experts=num_experts,
            using_mix_precision=using_mix_precision,
            using_weighted_combine=using_weighted_combine,
            validate=validate,
        )
    hidden = hidden_states_unzipped.shape[1]
    topk = expert_routemap_topk.shape[1]
    return (
        hidden_states_unzipped.new_empty((total_zipped_tokens, hidden)),
        token_prob_unzipped.new_empty((total_zipped_tokens, topk), dtype=torch.float32),
    )


# ------------------------------------------------------------------------------------------
# gradients (docs/gradients.rst): the core's gradient ops, the same rules on every device


def _absent_for_none(outputs, arrays):
    """The op's outputs with an empty stand-in for each absent gradient."""
    like = next(x for x in arrays if x is not None)
    return tuple(_absent(like) if x is None else x for x in outputs)


def permute_backward_eager(
    grad_hidden_states_unzipped: Tensor | None,
    grad_token_prob_unzipped: Tensor | None,
    zipped_expertwise_rowmap: Tensor,
    expert_routemap_topk: Tensor,
    validate: bool,
) -> tuple[Tensor, Tensor]:
    """``moe_permute_backward`` (docs/gradients.rst); an absent gradient comes back as an empty
    float32 tensor."""
    arrays = PermuteBackwardArrays(
        grad_hidden_states_unzipped,
        grad_token_prob_unzipped,
        zipped_expertwise_rowmap,
        expert_routemap_topk,
    )
    check_dtypes(arrays)
    backend, plan = _core.planned_permute_backward(arrays, {"validate": validate})
    outputs = run_on_tensors(_core.run_permute_backward, backend, plan, arrays, validate)
    return _absent_for_none(outputs, arrays)


permute_backward = torch.library.custom_op("moe_numba::permute_backward", mutates_args=())(
    permute_backward_eager
)


@permute_backward.register_fake
def _(
    grad_hidden_states_unzipped,
    grad_token_prob_unzipped,
    zipped_expertwise_rowmap,
    expert_routemap_topk,
    validate,
):
    num_tokens = zipped_expertwise_rowmap.shape[0]
    grad_rows = grad_hidden_states_unzipped
    if grad_rows is None:
        grad_hidden = _absent(zipped_expertwise_rowmap)
    else:
        grad_hidden = grad_rows.new_empty((num_tokens, grad_rows.shape[1]))
    if grad_token_prob_unzipped is None:
        grad_probs = _absent(zipped_expertwise_rowmap)
    else:
        grad_probs = expert_routemap_topk.new_empty(expert_routemap_topk.shape, dtype=torch.float32)
    return grad_hidden, grad_probs


def unpermute_backward_eager(
    grad_hidden_states: Tensor | None,
    grad_expert_prob_topk: Tensor | None,
    hidden_states_unzipped: Tensor | None,
    zipped_expertwise_rowmap: Tensor,
    expert_routemap_topk: Tensor,
    token_prob_unzipped: Tensor | None,
    using_weighted_combine: bool,
    num_rows: int,
    validate: bool,
) -> tuple[Tensor, Tensor]:
    """``moe_unpermute_backward`` (docs/gradients.rst); an absent gradient comes back as an empty
    float32 tensor."""
    arrays = UnpermuteBackwardArrays(
        grad_hidden_states,
        grad_expert_prob_topk,
        hidden_states_unzipped,
        zipped_expertwise_rowmap,
        expert_routemap_topk,
        token_prob_unzipped,
    )
    check_dtypes(arrays)
    scalars = dict(
        using_weighted_combine=using_weighted_combine, num_rows=num_rows, validate=validate
    )
    backend, plan = _core.planned_unpermute_backward(arrays, scalars)
    outputs = run_on_tensors(_core.run_unpermute_backward, backend, plan, arrays, validate)
    return _absent_for_none(outputs, arrays)


unpermute_backward = torch.library.custom_op("moe_numba::unpermute_backward", mutates_args=())(
    unpermute_backward_eager
)


@unpermute_backward.register_fake
def _(
    grad_hidden_states,
    grad_expert_prob_topk,
    hidden_states_unzipped,
    zipped_expertwise_rowmap,
    expert_routemap_topk,
    token_prob_unzipped,
    using_weighted_combine,
    num_rows,
    validate,
):
    like = zipped_expertwise_rowmap
    if grad_hidden_states is None:
        grad_rows = _absent(like)
    else:
        grad_rows = grad_hidden_states.new_empty((num_rows, grad_hidden_states.shape[1]))
    if grad_hidden_states is None and grad_expert_prob_topk is None:
        grad_probs = _absent(like)
    else:
        grad_probs = like.new_empty((num_rows,), dtype=torch.float32)
    return grad_rows, grad_probs
