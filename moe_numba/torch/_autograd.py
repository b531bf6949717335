"""Autograd of ``moe_numba::permute`` and ``moe_numba::unpermute`` (docs/training.rst).

The gradients are registered on the custom ops, and their backward functions call the
backward custom ops, so ``torch.compile`` traces them too. A call that nothing traces runs
the same functions without the dispatcher: :class:`EagerPermute` and
:class:`EagerUnpermute` are ``torch.autograd.Function`` classes made of the ops' implementations,
their ``setup_context`` and their backward with the backward ops' implementations (the same
bits, less host time per call).
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

from . import _ops
from ._bridge import FLOAT8

_PERMUTE_INPUTS = 12  # arguments of moe_numba::permute
_UNPERMUTE_INPUTS = 9  # arguments of moe_numba::unpermute


def _contiguous(grad):
    # autograd hands over expanded or strided gradients (e.g. of a sum); the ops need rows
    return None if grad is None else grad.contiguous()


def _permute_setup_context(ctx, inputs, output, needs_input_grad=None):
    # (needs_input_grad: the flags of ``inputs``, when ctx's cover more arguments)
    needs_input_grad = needs_input_grad or ctx.needs_input_grad
    hidden_states, *_, do_gather, _, _, _, validate = inputs
    hidden_unzipped, rowmap, _, scale_unzipped, expert_indices = output
    rows_have_gradient = hidden_states.dtype not in FLOAT8  # float8 rows have none
    ctx.set_materialize_grads(False)
    no_gradient = (rowmap, scale_unzipped, expert_indices)
    # (one call: each call replaces the set of the previous one)
    ctx.mark_non_differentiable(*no_gradient, *(() if rows_have_gradient else (hidden_unzipped,)))
    ctx.rows_grad = needs_input_grad[0] and do_gather and rows_have_gradient
    ctx.probs_grad = needs_input_grad[3]
    ctx.validate = validate
    ctx.save_for_backward(rowmap, inputs[2])


def _permute_backward(
    ctx, grad_rows, _rowmap, grad_probs, _scale, _indices, backward_op=_ops.permute_backward
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


def _eager_function(name, of_plan, setup_context, backward, backward_op):
    """A ``torch.autograd.Function`` of an op's implementation, its ``setup_context`` and its
    backward with the backward op's implementation: ``apply(backend, plan, *inputs)`` with
    the call's checked plan and the op's arguments.

    Its ``forward`` takes ``ctx`` and runs ``setup_context`` itself: with a separate
    ``setup_context``, ``Function.apply`` binds the arguments through ``inspect.signature``
    on every call, which costs more host time than the rest of the call's Python."""

    def forward(ctx, backend, plan, *inputs):
        output = of_plan(backend, plan, *inputs)
        setup_context(ctx, inputs, output, ctx.needs_input_grad[2:])
        return output

    def backward_of_plan(ctx, *grads):
        return (None, None, *backward(ctx, *grads, backward_op=backward_op))

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


EagerPermute = _eager_function(
    "EagerPermute",
    _ops.permute_of_plan,
    _permute_setup_context,
    _permute_backward,
    _ops.permute_backward_eager,
)
EagerUnpermute = _eager_function(
    "EagerUnpermute",
    _ops.unpermute_of_plan,
    _unpermute_setup_context,
    _unpermute_backward,
    _ops.unpermute_backward_eager,
)
