"""Autograd of the custom ops (docs/training.rst): first and higher derivatives.

Each op's gradient is a formula here (its ``setup_context`` and ``backward``), registered on
its custom op; every backward computes with the ops themselves (:data:`GRADIENTS`), so
``torch.compile`` traces them, ``create_graph=True`` records them, and double backward works:
the backward ops are linear in their gradient inputs (bilinear with the rows and
probabilities of a weighted combine), and their own gradients are the forward and backward
ops again. The gradient of a sort is the inverse sort.

A direct call (:mod:`._route`: torch would do nothing else with it) that autograd records
runs through the op's :data:`DIRECT` function: a ``torch.autograd.Function`` of the op's
implementation with the same ``setup_context`` and the same backward, which calls the ops
directly unless autograd records the backward itself (``create_graph=True``), which then goes
through the custom ops.

``setup_context`` saves only what the backward needs:

- permute: the row map and the routing map (the gradients are a combine and a gather by
  them);
- unpermute: the row map and the routing map; the row probabilities when the combine is
  weighted; the ``[R, H]`` rows only when the combine is weighted and the probabilities
  require a gradient (the dot products of the probability gradient);
- sort: the inverse order, and the rows each output position got (sizes on the device) or
  the sizes in output order (host sizes).

Gradients of outputs that do not reach the loss arrive as None (grads are not materialised),
and the backward ops skip what nothing needs. Every backward returns one gradient per
argument of the custom op (:func:`._custom_ops.arguments`): None for the scalars.
"""

import torch

from .._contract import UnpermuteArrays, UnpermuteScalars
from .._contract_backward import (
    PermuteBackwardArrays,
    PermuteBackwardScalars,
    UnpermuteBackwardArrays,
    UnpermuteBackwardScalars,
)
from .._contract_sort import SortArrays, SortScalars, inverse_order
from ..ops import PERMUTE, PERMUTE_BACKWARD, SORT_CHUNKS, UNPERMUTE, UNPERMUTE_BACKWARD
from . import _direct
from ._bridge import FLOAT8, asked_outputs, stand_ins
from ._custom_ops import CUSTOM_OPS, arguments, split


def through_custom_ops(op, arrays, scalars, capacities=None):
    """``op``'s outputs NamedTuple through its custom op (what autograd and the compiler
    see)."""
    tensors = CUSTOM_OPS[op](*arguments(op, arrays, scalars, capacities))
    return asked_outputs(op, tensors, arrays, scalars)


def _contiguous(grad):
    # autograd hands over expanded or strided gradients (e.g. of a sum); the ops need rows
    return None if grad is None else grad.contiguous()


def _no_gradients(op):
    return [None] * (len(op.arrays._fields) + len(op.scalars._fields) + op.capacities)


# ------------------------------------------------------------------------------------------
# permute


def _permute_setup_context(ctx, inputs, output, needs_input_grad=None):
    # (needs_input_grad: the flags of ``inputs``, when ctx's cover more arguments)
    needs_input_grad = needs_input_grad or ctx.needs_input_grad
    arrays, scalars, _ = split(PERMUTE, inputs)
    hidden_unzipped, rowmap, _, scale_unzipped, expert_indices, expert_offsets = output
    rows_have_gradient = arrays.hidden_states.dtype not in FLOAT8  # float8 rows have none
    ctx.set_materialize_grads(False)
    no_gradient = (rowmap, scale_unzipped, expert_indices, expert_offsets)
    # (one call: each call replaces the set of the previous one)
    ctx.mark_non_differentiable(*no_gradient, *(() if rows_have_gradient else (hidden_unzipped,)))
    ctx.rows_grad = needs_input_grad[0] and scalars.do_gather and rows_have_gradient
    ctx.probs_grad = needs_input_grad[3]
    ctx.validate = scalars.validate
    ctx.save_for_backward(rowmap, arrays.expert_routemap_topk)


def _permute_backward(ctx, grad_rows, _rowmap, grad_probs, _scale, _indices, _offsets, ops):
    grad_rows = _contiguous(grad_rows) if ctx.rows_grad else None
    grad_probs = _contiguous(grad_probs) if ctx.probs_grad else None
    grads = _no_gradients(PERMUTE)
    if grad_rows is None and grad_probs is None:
        return tuple(grads)
    rowmap, routemap = ctx.saved_tensors
    arrays = PermuteBackwardArrays(grad_rows, grad_probs, rowmap, routemap)
    grad_hidden, grad_slots = ops(PERMUTE_BACKWARD, arrays, PermuteBackwardScalars(ctx.validate))
    grads[0], grads[3] = grad_hidden, grad_slots
    return tuple(grads)


# ------------------------------------------------------------------------------------------
# unpermute


def _unpermute_setup_context(ctx, inputs, output, needs_input_grad=None):
    needs_input_grad = needs_input_grad or ctx.needs_input_grad  # (as for the permute)
    arrays, scalars, _ = split(UNPERMUTE, inputs)
    rows, probs = arrays.hidden_states_unzipped, arrays.token_prob_unzipped
    weighted = scalars.using_weighted_combine
    ctx.set_materialize_grads(False)
    ctx.rows_grad = needs_input_grad[0]
    ctx.probs_grad = needs_input_grad[3]
    ctx.weighted = weighted
    ctx.validate = scalars.validate
    ctx.num_rows = rows.shape[0]
    ctx.probs_shape = probs.shape
    ctx.save_for_backward(
        arrays.zipped_expertwise_rowmap,
        arrays.expert_routemap_topk,
        probs if weighted else None,
        rows if weighted and ctx.probs_grad else None,
    )


def _unpermute_backward(ctx, grad_out, grad_slots, ops):
    wanted_out = ctx.rows_grad or (ctx.probs_grad and ctx.weighted)
    grad_out = _contiguous(grad_out) if wanted_out else None
    grad_slots = _contiguous(grad_slots) if ctx.probs_grad else None
    grads = _no_gradients(UNPERMUTE)
    if grad_out is None and grad_slots is None:
        return tuple(grads)
    rowmap, routemap, probs, rows = ctx.saved_tensors
    arrays = UnpermuteBackwardArrays(
        grad_out, grad_slots, rows if grad_out is not None else None, rowmap, routemap, probs
    )
    scalars = UnpermuteBackwardScalars(ctx.weighted, ctx.num_rows, ctx.validate)
    grad_rows, grad_probs = ops(UNPERMUTE_BACKWARD, arrays, scalars)
    if ctx.rows_grad and grad_out is not None:
        grads[0] = grad_rows
    if ctx.probs_grad:
        grads[3] = grad_probs.view(ctx.probs_shape)
    return tuple(grads)


# ------------------------------------------------------------------------------------------
# the gradient ops' own gradients (double backward)


def _permute_backward_setup_context(ctx, inputs, output, needs_input_grad=None):
    arrays, scalars, _ = split(PERMUTE_BACKWARD, inputs)
    needs = needs_input_grad or ctx.needs_input_grad
    grad_rows, grad_probs = arrays.grad_hidden_states_unzipped, arrays.grad_token_prob_unzipped
    ctx.set_materialize_grads(False)
    ctx.grad_rows = needs[0]
    ctx.grad_probs = needs[1]
    ctx.num_rows = (grad_rows if grad_rows is not None else grad_probs).shape[0]
    ctx.validate = scalars.validate
    ctx.save_for_backward(arrays.zipped_expertwise_rowmap, arrays.expert_routemap_topk)


def counted_slots(rowmap, routemap):
    """``[T, K]`` bool: the slots that filled a row (an id in [0, E) with a row, and the first
    slot of the token to name that expert), as ``moe_permute`` counts them."""
    num_experts = rowmap.shape[1]
    ids = routemap.long()
    named = (ids >= 0) & (ids < num_experts)
    rows = rowmap.gather(1, ids.clamp(0, max(num_experts - 1, 0)))
    repeated = (ids[:, :, None] == ids[:, None, :]).tril(-1).any(2)
    return named & (rows >= 0) & ~repeated


def _permute_backward_backward(ctx, grad_grad_hidden, grad_grad_probs, ops):
    """The gradient of ``moe_permute_backward``: it is linear, and its adjoint is the permute's
    gather by the same row map (the rows: every mapped row gets its token's row; the
    probabilities: every row gets its counted slot's value)."""
    rowmap, routemap = ctx.saved_tensors
    wants_rows = ctx.grad_rows and grad_grad_hidden is not None
    wants_probs = ctx.grad_probs and grad_grad_probs is not None
    grads = _no_gradients(PERMUTE_BACKWARD)
    if not (wants_rows or wants_probs):
        return tuple(grads)
    slots = None
    if wants_probs:
        counted = counted_slots(rowmap, routemap)
        slots = torch.where(counted, grad_grad_probs.contiguous(), 0.0)
    arrays = UnpermuteBackwardArrays(
        grad_grad_hidden.contiguous() if wants_rows else None, slots, None, rowmap, routemap, None
    )
    scalars = UnpermuteBackwardScalars(False, ctx.num_rows, ctx.validate)
    rows, probs = ops(UNPERMUTE_BACKWARD, arrays, scalars)
    if wants_rows:
        grads[0] = rows
    if wants_probs:
        grads[1] = probs
    return tuple(grads)


def _unpermute_backward_setup_context(ctx, inputs, output, needs_input_grad=None):
    arrays, scalars, _ = split(UNPERMUTE_BACKWARD, inputs)
    grad_out, _, rows, rowmap, routemap, probs = arrays
    ctx.set_materialize_grads(False)
    ctx.needs = needs_input_grad or ctx.needs_input_grad
    ctx.weighted = scalars.using_weighted_combine
    ctx.num_rows = scalars.num_rows
    ctx.validate = scalars.validate
    ctx.has_grad_out = grad_out is not None
    ctx.has_rows = rows is not None
    ctx.probs_shape = None if probs is None else probs.shape
    ctx.save_for_backward(grad_out, rows, rowmap, routemap, probs)


def _unpermute_backward_backward(ctx, grad_grad_rows, grad_grad_probs, ops):
    """The gradient of ``moe_unpermute_backward``, by its inputs: the row gradient
    ``dXu[r] = w_r dY[t]`` and the probability gradient ``dp[r] = <dY[t], Xu[r]> +
    sum_k g[t, k]`` are linear in ``dY`` and ``g`` and bilinear in ``(dY, Xu)`` and
    ``(dY, p)``, so each input's gradient is an unpermute (a combine by the row map) or an
    unpermute backward (a gather by it)."""
    grad_out, rows, rowmap, routemap, probs = ctx.saved_tensors
    needs = ctx.needs
    a = None if grad_grad_rows is None else grad_grad_rows.contiguous()
    b = None if grad_grad_probs is None else grad_grad_probs.contiguous()
    num_tokens, num_experts = rowmap.shape
    dot = ctx.weighted and ctx.has_grad_out and ctx.has_rows  # the forward's dot-product term
    grads = _no_gradients(UNPERMUTE_BACKWARD)

    def combine(x, p, weighted):
        if p is None:
            p = x.new_zeros((x.shape[0],), dtype=torch.float32)
        arrays = UnpermuteArrays(x, rowmap, routemap, p.reshape(-1))
        scalars = UnpermuteScalars(num_tokens, num_experts, True, weighted, validate=False)
        return ops(UNPERMUTE, arrays, scalars)

    def gather(dy, rows_in, p):
        arrays = UnpermuteBackwardArrays(dy, None, rows_in, rowmap, routemap, p)
        scalars = UnpermuteBackwardScalars(True, ctx.num_rows, ctx.validate)
        return ops(UNPERMUTE_BACKWARD, arrays, scalars)

    if needs[0]:  # dY
        total = None
        if a is not None:
            total = combine(a, probs if ctx.weighted else None, ctx.weighted).hidden
        if dot and b is not None:
            term = combine(rows, b, True).hidden
            total = term if total is None else total + term
        grads[0] = total
    if needs[1] and b is not None:  # the slot probabilities' gradient
        grads[1] = combine(b.new_zeros((ctx.num_rows, 1)), b, False).probs
    if needs[2] and dot and b is not None:  # the rows of the dot product
        grads[2] = gather(grad_out, None, b).grad_rows
    if needs[5] and ctx.weighted and ctx.has_grad_out and a is not None:  # the probabilities
        grads[5] = gather(grad_out, a, probs).grad_probs.view(ctx.probs_shape)
    return tuple(grads)


# ------------------------------------------------------------------------------------------
# sort


def _sort_setup_context(ctx, inputs, output, needs_input_grad=None):
    arrays, scalars, _ = split(SORT_CHUNKS, inputs)
    needs = needs_input_grad or ctx.needs_input_grad
    ctx.set_materialize_grads(False)
    ctx.num_rows = arrays.x.shape[0]
    order = tuple(scalars.order)
    ctx.inverse = list(inverse_order(order))
    ctx.probs_grad = arrays.probs is not None and needs[1]
    lengths = output[2]
    ctx.mark_non_differentiable(lengths)
    if arrays.split_sizes is None:  # host sizes: the inverse's sizes are known here
        ctx.sizes_back = [scalars.host_split_sizes[c] for c in order]
        ctx.save_for_backward(None)
    else:  # sizes on the device: the rows each position got, no host read
        ctx.sizes_back = None
        ctx.save_for_backward(lengths)


def _sort_backward(ctx, grad_y, grad_probs, _lengths, ops):
    grads = _no_gradients(SORT_CHUNKS)
    if grad_probs is not None and not ctx.probs_grad:
        grad_probs = None
    if grad_y is None and grad_probs is None:
        return tuple(grads)
    # (absent row gradients: rows of no bytes, only the probabilities move)
    rows = grad_probs.new_empty((ctx.num_rows, 0)) if grad_y is None else grad_y.contiguous()
    probs = _contiguous(grad_probs)
    (lengths,) = ctx.saved_tensors
    arrays = SortArrays(rows, probs, lengths)
    scalars = SortScalars(ctx.inverse, ctx.sizes_back, False)
    grad_x, grad_p, _ = ops(SORT_CHUNKS, arrays, scalars)
    grads[0] = None if grad_y is None else grad_x
    grads[1] = None if probs is None else grad_p
    return tuple(grads)


# op -> (its setup_context, its backward)
GRADIENTS = {
    PERMUTE: (_permute_setup_context, _permute_backward),
    UNPERMUTE: (_unpermute_setup_context, _unpermute_backward),
    PERMUTE_BACKWARD: (_permute_backward_setup_context, _permute_backward_backward),
    UNPERMUTE_BACKWARD: (_unpermute_backward_setup_context, _unpermute_backward_backward),
    SORT_CHUNKS: (_sort_setup_context, _sort_backward),
}


def _registered_backward(backward):
    def registered(ctx, *grads):
        return backward(ctx, *grads, ops=through_custom_ops)

    return registered


for _op, (_setup, _backward) in GRADIENTS.items():
    torch.library.register_autograd(
        f"moe_numba::{_op.name}", _registered_backward(_backward), setup_context=_setup
    )


def _direct_function(op, setup_context, backward):
    """A ``torch.autograd.Function`` of ``op``'s implementation, its ``setup_context`` and its
    backward: ``apply(backend, plan, *inputs)`` with the call's checked plan and the custom
    op's arguments (:func:`._custom_ops.arguments`). The backward calls the ops directly, or
    through their custom ops when autograd records the backward (``create_graph=True``).

    Its ``forward`` takes ``ctx`` and runs ``setup_context`` itself: with a separate
    ``setup_context``, ``Function.apply`` binds the arguments through ``inspect.signature``
    on every call, which costs more host time than the rest of the call's Python."""

    def forward(ctx, backend, plan, *inputs):
        arrays, scalars, capacities = split(op, inputs)
        # (grad mode is off inside a Function's forward, so a recorded key replays here)
        replayed = _direct.REPLAYS[op].outputs(arrays, scalars, capacities)
        if replayed is None:
            outputs = _direct.run(op, backend, plan, arrays, scalars, capacities)
        else:
            outputs = op.outputs._make(replayed)
        output = stand_ins(outputs, next(x for x in arrays if x is not None))
        setup_context(ctx, inputs, output, ctx.needs_input_grad[2:])
        return output

    def backward_of_plan(ctx, *grads):
        ops = through_custom_ops if torch.is_grad_enabled() else _direct.outputs
        return (None, None, *backward(ctx, *grads, ops=ops))

    name = "Direct" + op.name.title().replace("_", "")
    return type(
        name,
        (torch.autograd.Function,),
        {
            "__doc__": f"{name}: the custom op's functions, without the dispatcher.",
            "__module__": __name__,
            "forward": staticmethod(forward),
            "backward": staticmethod(backward_of_plan),
        },
    )


DIRECT = {op: _direct_function(op, *formula) for op, formula in GRADIENTS.items()}
"""Each op's ``torch.autograd.Function`` for direct calls that autograd records."""
