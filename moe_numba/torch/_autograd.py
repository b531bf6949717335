"""Autograd of the custom ops (docs/training.rst): first and higher derivatives.

The gradients are registered on the custom ops, and each backward calls custom ops, so
``torch.compile`` traces them, ``create_graph=True`` records them, and double backward
works: the backward ops are linear in their gradient inputs (bilinear with the rows and
probabilities of a weighted combine), and their own gradients are the forward and backward
ops again (:func:`_permute_backward_backward`, :func:`_unpermute_backward_backward`).

A direct call (:mod:`._route`: torch would do nothing else with it) that autograd records
runs through :class:`DirectPermute` or :class:`DirectUnpermute`: ``torch.autograd.Function``
classes made of the ops' implementations, the same ``setup_context`` and the same backward.
Their backward calls the backward op's implementation directly unless autograd records the
backward itself (``create_graph=True``), which then goes through the custom op.

``setup_context`` saves only what the backward needs:

- permute: the row map and the routing map (the gradients are a combine and a gather by
  them);
- unpermute: the row map and the routing map; the row probabilities when the combine is
  weighted; the ``[R, H]`` rows only when the combine is weighted and the probabilities
  require a gradient (the dot products of the probability gradient).

Gradients of outputs that do not reach the loss arrive as None (grads are not materialised),
and the backward ops skip what nothing needs.
"""

import torch

from .. import _core
from . import _direct, _ops, _replay
from ._bridge import FLOAT8

_PERMUTE_INPUTS = 13  # arguments of moe_numba::permute
_UNPERMUTE_INPUTS = 9  # arguments of moe_numba::unpermute


def _contiguous(grad):
    # autograd hands over expanded or strided gradients (e.g. of a sum); the ops need rows
    return None if grad is None else grad.contiguous()


def _permute_setup_context(ctx, inputs, output, needs_input_grad=None):
    # (needs_input_grad: the flags of ``inputs``, when ctx's cover more arguments)
    needs_input_grad = needs_input_grad or ctx.needs_input_grad
    hidden_states, *_, do_gather, _, _, _, validate, _ = inputs
    hidden_unzipped, rowmap, _, scale_unzipped, expert_indices, expert_offsets = output
    rows_have_gradient = hidden_states.dtype not in FLOAT8  # float8 rows have none
    ctx.set_materialize_grads(False)
    no_gradient = (rowmap, scale_unzipped, expert_indices, expert_offsets)
    # (one call: each call replaces the set of the previous one)
    ctx.mark_non_differentiable(*no_gradient, *(() if rows_have_gradient else (hidden_unzipped,)))
    ctx.rows_grad = needs_input_grad[0] and do_gather and rows_have_gradient
    ctx.probs_grad = needs_input_grad[3]
    ctx.validate = validate
    ctx.save_for_backward(rowmap, inputs[2])


def _permute_backward(
    ctx,
    grad_rows,
    _rowmap,
    grad_probs,
    _scale,
    _indices,
    _offsets,
    backward_op=_ops.permute_backward,
):
    grad_rows = _contiguous(grad_rows) if ctx.rows_grad else None
    grad_probs = _contiguous(grad_probs) if ctx.probs_grad else None
    grads = [None] * _PERMUTE_INPUTS
    if grad_rows is None and grad_probs is None:
        return tuple(grads)
    rowmap, routemap = ctx.saved_tensors
    grad_hidden, grad_slots = backward_op(grad_rows, grad_probs, rowmap, routemap, ctx.validate)
    if grad_rows is not None:
        grads[0] = grad_hidden
    if grad_probs is not None:
        grads[3] = grad_slots
    return tuple(grads)


def _unpermute_setup_context(ctx, inputs, output, needs_input_grad=None):
    needs_input_grad = needs_input_grad or ctx.needs_input_grad  # (as for the permute)
    rows, rowmap, routemap, probs, _, _, _, weighted, validate = inputs
    ctx.set_materialize_grads(False)
    ctx.rows_grad = needs_input_grad[0]
    ctx.probs_grad = needs_input_grad[3]
    ctx.weighted = weighted
    ctx.validate = validate
    ctx.num_rows = rows.shape[0]
    ctx.probs_shape = probs.shape
    ctx.save_for_backward(
        rowmap,
        routemap,
        probs if weighted else None,
        rows if weighted and ctx.probs_grad else None,
    )


def _unpermute_backward(ctx, grad_out, grad_slots, backward_op=_ops.unpermute_backward):
    wanted_out = ctx.rows_grad or (ctx.probs_grad and ctx.weighted)
    grad_out = _contiguous(grad_out) if wanted_out else None
    grad_slots = _contiguous(grad_slots) if ctx.probs_grad else None
    grads = [None] * _UNPERMUTE_INPUTS
    if grad_out is None and grad_slots is None:
        return tuple(grads)
    rowmap, routemap, probs, rows = ctx.saved_tensors
    grad_rows, grad_probs = backward_op(
        grad_out,
        grad_slots,
        rows if grad_out is not None else None,
        rowmap,
        routemap,
        probs,
        ctx.weighted,
        ctx.num_rows,
        ctx.validate,
    )
    if ctx.rows_grad and grad_out is not None:
        grads[0] = grad_rows
    if ctx.probs_grad:
        grads[3] = grad_probs.view(ctx.probs_shape)
    return tuple(grads)


torch.library.register_autograd(
    "moe_numba::permute", _permute_backward, setup_context=_permute_setup_context
)
torch.library.register_autograd(
    "moe_numba::unpermute", _unpermute_backward, setup_context=_unpermute_setup_context
)


def _permute_backward_setup_context(ctx, inputs, output):
    grad_rows, grad_probs, rowmap, routemap, validate = inputs
    ctx.set_materialize_grads(False)
    ctx.grad_rows = ctx.needs_input_grad[0]
    ctx.grad_probs = ctx.needs_input_grad[1]
    ctx.num_rows = (grad_rows if grad_rows is not None else grad_probs).shape[0]
    ctx.validate = validate
    ctx.save_for_backward(rowmap, routemap)


def counted_slots(rowmap, routemap):
    """``[T, K]`` bool: the slots that filled a row (an id in [0, E) with a row, and the first
    slot of the token to name that expert), as ``moe_permute`` counts them."""
    num_experts = rowmap.shape[1]
    ids = routemap.long()
    named = (ids >= 0) & (ids < num_experts)
    rows = rowmap.gather(1, ids.clamp(0, max(num_experts - 1, 0)))
    repeated = (ids[:, :, None] == ids[:, None, :]).tril(-1).any(2)
    return named & (rows >= 0) & ~repeated


def _permute_backward_backward(ctx, grad_grad_hidden, grad_grad_probs):
    """The gradient of ``moe_permute_backward``: it is linear, and its adjoint is the permute's
    gather by the same row map (the rows: every mapped row gets its token's row; the
    probabilities: every row gets its counted slot's value)."""
    rowmap, routemap = ctx.saved_tensors
    wants_rows = ctx.grad_rows and grad_grad_hidden is not None
    wants_probs = ctx.grad_probs and grad_grad_probs is not None
    grads = [None] * 5
    if not (wants_rows or wants_probs):
        return tuple(grads)
    slots = None
    if wants_probs:
        counted = counted_slots(rowmap, routemap)
        slots = torch.where(counted, grad_grad_probs.contiguous(), 0.0)
    rows, probs = _ops.unpermute_backward(
        grad_grad_hidden.contiguous() if wants_rows else None,
        slots,
        None,
        rowmap,
        routemap,
        None,
        False,
        ctx.num_rows,
        ctx.validate,
    )
    if wants_rows:
        grads[0] = rows
    if wants_probs:
        grads[1] = probs
    return tuple(grads)


def _unpermute_backward_setup_context(ctx, inputs, output):
    grad_out, grad_slots, rows, rowmap, routemap, probs, weighted, num_rows, validate = inputs
    ctx.set_materialize_grads(False)
    ctx.needs = ctx.needs_input_grad
    ctx.weighted = weighted
    ctx.num_rows = num_rows
    ctx.validate = validate
    ctx.has_grad_out = grad_out is not None
    ctx.has_rows = rows is not None
    ctx.has_probs = probs is not None
    ctx.probs_shape = None if probs is None else probs.shape
    ctx.save_for_backward(grad_out, rows, rowmap, routemap, probs)


def _unpermute_backward_backward(ctx, grad_grad_rows, grad_grad_probs):
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
    grads = [None] * 9

    def combine(x, p, weighted):
        if p is None:
            p = x.new_zeros((x.shape[0],), dtype=torch.float32)
        return _ops.unpermute(
            x, rowmap, routemap, p.reshape(-1), num_tokens, num_experts, True, weighted, False
        )

    if needs[0]:  # dY
        total = None
        if a is not None:
            total = combine(a, probs if ctx.weighted else None, ctx.weighted)[0]
        if dot and b is not None:
            term = combine(rows, b, True)[0]
            total = term if total is None else total + term
        grads[0] = total
    if needs[1] and b is not None:  # the slot probabilities' gradient
        grads[1] = combine(b.new_zeros((ctx.num_rows, 1)), b, False)[1]
    if needs[2] and dot and b is not None:  # the rows of the dot product
        grads[2] = _ops.unpermute_backward(
            grad_out, None, None, rowmap, routemap, b, True, ctx.num_rows, ctx.validate
        )[0]
    if needs[5] and ctx.weighted and ctx.has_grad_out and a is not None:  # the probabilities
        probs_grad = _ops.unpermute_backward(
            grad_out, None, a, rowmap, routemap, probs, True, ctx.num_rows, ctx.validate
        )[1]
        grads[5] = probs_grad.view(ctx.probs_shape)
    return tuple(grads)


torch.library.register_autograd(
    "moe_numba::permute_backward",
    _permute_backward_backward,
    setup_context=_permute_backward_setup_context,
)
torch.library.register_autograd(
    "moe_numba::unpermute_backward",
    _unpermute_backward_backward,
    setup_context=_unpermute_backward_setup_context,
)


def _direct_function(name, of_plan, setup_context, backward, backward_op, direct_backward):
    """A ``torch.autograd.Function`` of an op's implementation, its ``setup_context`` and its
    backward: ``apply(backend, plan, *inputs)`` with the call's checked plan and the op's
    arguments. The backward calls ``direct_backward`` (the backward op's implementation), or
    the backward custom op ``backward_op`` when autograd records the backward
    (``create_graph=True``).

    Its ``forward`` takes ``ctx`` and runs ``setup_context`` itself: with a separate
    ``setup_context``, ``Function.apply`` binds the arguments through ``inspect.signature``
    on every call, which costs more host time than the rest of the call's Python."""

    def forward(ctx, backend, plan, *inputs):
        output = of_plan(backend, plan, *inputs)
        setup_context(ctx, inputs, output, ctx.needs_input_grad[2:])
        return output

    def backward_of_plan(ctx, *grads):
        op = backward_op if torch.is_grad_enabled() else direct_backward
        return (None, None, *backward(ctx, *grads, backward_op=op))

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


def _permute_of_plan(backend, plan, *inputs):
    """The op's outputs for its arguments ``inputs``: a replay where the call key was recorded
    (grad mode is off inside a Function's forward, so the replays take it), else the direct
    route's run, which records the call."""
    arrays = _ops.PermuteArrays(*inputs[:4])
    num_experts, counts, alignment, *flags = inputs[4:]
    values = (num_experts, alignment, *flags)  # (in the order of _core.PERMUTE_SCALARS)
    scalars = _core.permute_scalars(*values)
    outputs = _replay.PERMUTE(arrays, values, counts)
    if outputs is None:
        outputs = _direct.permute(backend, plan, arrays, scalars, counts)
    return _ops.op_outputs(outputs, plan, arrays.hidden_states)


def _unpermute_of_plan(backend, plan, *inputs):
    """As :func:`_permute_of_plan`, for the unpermute."""
    arrays = _ops.UnpermuteArrays(*inputs[:4])
    values = inputs[4:]
    outputs = _replay.UNPERMUTE(arrays, values)
    if outputs is None:
        return _direct.unpermute(backend, plan, arrays, _core.unpermute_scalars(*values))
    return outputs


DirectPermute = _direct_function(
    "DirectPermute",
    _permute_of_plan,
    _permute_setup_context,
    _permute_backward,
    _ops.permute_backward,
    _direct.permute_backward_of,
)
DirectUnpermute = _direct_function(
    "DirectUnpermute",
    _unpermute_of_plan,
    _unpermute_setup_context,
    _unpermute_backward,
    _ops.unpermute_backward,
    _direct.unpermute_backward_of,
)
