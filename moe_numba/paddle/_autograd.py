"""Autograd of the ops on Paddle tensors: ``paddle.autograd.PyLayer`` classes whose backward
is this project's gradient ops (docs/gradients.rst), on every place.

A layer's ``forward`` runs the op through :func:`._front.call`; its ``backward`` runs the
gradient op the same way. Only what the backward needs is saved:

- permute: the row map and the routing map;
- unpermute: the row map and the routing map; the row probabilities when the combine is
  weighted; the ``[R, H]`` rows only when the combine is weighted and the probabilities
  require a gradient (the dot products of the probability gradient);
- sort: the rows each output position got (the sizes of the inverse sort).

Gradients are not materialised: an output that does not reach the loss hands the backward
None, and the gradient ops skip what nothing needs. The gradient ops are not differentiable
themselves (no double backward).

Only the differentiable inputs (rows and probabilities) are the layers' tensor arguments: the
others (maps, scales, sizes) travel with the scalars in one object (:class:`_Others`; Paddle
counts the tensors inside a tuple argument as inputs too), outside the graph. ``backward``
returns one gradient per tensor argument, and an input that requires a gradient always gets
a tensor, zeros where the op gives none (float8 rows, an unused output): Paddle's backward
pass crashes (a segmentation fault in the gradient node of a cast, say) when it meets None
for such an input, and ``paddle.topk``'s indices require a gradient.
"""

import paddle
from paddle.autograd import PyLayer

from .._contract import PermuteArrays, UnpermuteArrays
from .._contract_backward import (
    PermuteBackwardArrays,
    PermuteBackwardScalars,
    UnpermuteBackwardArrays,
    UnpermuteBackwardScalars,
)
from .._contract_sort import SortArrays, SortScalars, host_values, inverse_order
from ..ops import PERMUTE, PERMUTE_BACKWARD, SORT_CHUNKS, UNPERMUTE, UNPERMUTE_BACKWARD
from . import _front
from ._bridge import HOST

_FLOAT8 = frozenset(
    dtype for dtype, numpy_dtype in HOST.to_numpy.items() if numpy_dtype.name.startswith("float8")
)


class _Others:
    """A call's arguments other than the differentiable tensors, as one PyLayer argument."""

    def __init__(self, *values):
        self.values = values


def _contiguous(grad):
    # (Paddle may hand over strided gradients, e.g. of a slice; the ops need rows)
    return grad if grad is None or grad.is_contiguous() else grad.contiguous()


def _requires_grad(x):
    return x is not None and not x.stop_gradient


def _remember_inputs(ctx, *inputs):
    """What :func:`_gradients` needs of the layer's tensor arguments (not the tensors)."""
    ctx.inputs = tuple(
        (_requires_grad(x), list(x.shape), x.dtype, x.place) if x is not None else None
        for x in inputs
    )


def _mark_constant(ctx, *outputs):
    """Mark the outputs that have no gradient: each of ``outputs`` is one (an integer or
    float8 one), or ``(output, whether it has one)``; None outputs are skipped."""
    constant = []
    for entry in outputs:
        output, differentiable = entry if isinstance(entry, tuple) else (entry, False)
        if output is not None and not differentiable:
            constant.append(output)
    ctx.mark_non_differentiable(*constant)


def _gradients(ctx, *grads):
    """``backward``'s gradients, one per tensor argument of ``forward`` (``grads`` gives one
    per argument, None where the op gives none): None for an argument that wants none,
    zeros for one that wants one the op does not give."""
    out = []
    for grad, meta in zip(grads, ctx.inputs, strict=True):
        if meta is None:
            continue
        requires, shape, dtype, place = meta
        if grad is None and requires:
            grad = paddle.zeros(shape, dtype=dtype, device=place)
        out.append(grad if requires else None)
    return tuple(out)


class _Permute(PyLayer):
    @staticmethod
    def forward(ctx, hidden_states, expert_prob_topk, others):
        scale, routemap, scalars, capacities = others.values
        arrays = PermuteArrays(hidden_states, scale, routemap, expert_prob_topk)
        outputs = _front.outputs(PERMUTE, arrays, scalars, capacities).result()
        rows, rowmap, row_probs = outputs[:3]
        float8 = hidden_states.dtype in _FLOAT8  # float8 rows have no gradient
        ctx.set_materialize_grads(False)
        _remember_inputs(ctx, hidden_states, expert_prob_topk)
        ctx.rows_grad = _requires_grad(hidden_states) and scalars.do_gather and not float8
        ctx.probs_grad = _requires_grad(expert_prob_topk)
        _mark_constant(
            ctx, (rows, ctx.rows_grad), (row_probs, ctx.probs_grad), rowmap, *outputs[3:]
        )
        ctx.validate = scalars.validate
        ctx.save_for_backward(rowmap, routemap)
        return outputs

    @staticmethod
    def backward(ctx, grad_rows, _grad_rowmap, grad_probs, *_others):
        grad_rows = _contiguous(grad_rows) if ctx.rows_grad else None
        grad_probs = _contiguous(grad_probs) if ctx.probs_grad else None
        if grad_rows is None and grad_probs is None:
            return _gradients(ctx, None, None)
        rowmap, routemap = ctx.saved_tensor()
        arrays = PermuteBackwardArrays(grad_rows, grad_probs, rowmap, routemap)
        scalars = PermuteBackwardScalars(ctx.validate)
        return _gradients(ctx, *_front.outputs(PERMUTE_BACKWARD, arrays, scalars))


class _Unpermute(PyLayer):
    @staticmethod
    def forward(ctx, rows, probs, others):
        rowmap, routemap, scalars = others.values
        arrays = UnpermuteArrays(rows, rowmap, routemap, probs)
        outputs = _front.outputs(UNPERMUTE, arrays, scalars).result()
        weighted = scalars.using_weighted_combine
        ctx.set_materialize_grads(False)
        _remember_inputs(ctx, rows, probs)
        ctx.rows_grad = _requires_grad(rows)
        ctx.probs_grad = _requires_grad(probs)
        combined, slot_probs = outputs
        combined_grad = ctx.rows_grad or (weighted and ctx.probs_grad)
        _mark_constant(ctx, (combined, combined_grad), (slot_probs, ctx.probs_grad))
        ctx.weighted = weighted
        ctx.scalars = UnpermuteBackwardScalars(weighted, rows.shape[0], scalars.validate)
        ctx.save_for_backward(
            rowmap,
            routemap,
            probs if weighted else None,
            rows if weighted and ctx.probs_grad else None,
        )
        return outputs

    @staticmethod
    def backward(ctx, grad_out, grad_slots):
        wanted_out = ctx.rows_grad or (ctx.probs_grad and ctx.weighted)
        grad_out = _contiguous(grad_out) if wanted_out else None
        grad_slots = _contiguous(grad_slots) if ctx.probs_grad else None
        if grad_out is None and grad_slots is None:
            return _gradients(ctx, None, None)
        rowmap, routemap, probs, rows = ctx.saved_tensor()
        arrays = UnpermuteBackwardArrays(
            grad_out, grad_slots, rows if grad_out is not None else None, rowmap, routemap, probs
        )
        grad_rows, grad_probs = _front.outputs(UNPERMUTE_BACKWARD, arrays, ctx.scalars)
        if grad_probs is not None:
            grad_probs = grad_probs.reshape(ctx.inputs[1][1])  # ([R] or [R, 1], as given)
        return _gradients(ctx, grad_rows, grad_probs)


class _SortChunks(PyLayer):
    @staticmethod
    def forward(ctx, x, probs, others):
        device_sizes, scalars = others.values
        y, probs_y, lengths = _front.outputs(
            SORT_CHUNKS, SortArrays(x, probs, device_sizes), scalars
        )
        ctx.set_materialize_grads(False)
        _remember_inputs(ctx, x, probs)
        ctx.probs_grad = _requires_grad(probs)
        _mark_constant(ctx, (y, _requires_grad(x)), (probs_y, ctx.probs_grad), lengths)
        ctx.inverse = inverse_order(scalars.order)
        ctx.save_for_backward(lengths)
        return y, probs_y, lengths

    @staticmethod
    def backward(ctx, grad_y, *grads):
        # (grads: the probabilities' gradient when probs were given, then the lengths')
        grad_probs = grads[0] if len(grads) == 2 and ctx.probs_grad else None
        if grad_y is None and grad_probs is None:
            return _gradients(ctx, None, None)
        if grad_y is None:  # (a zero-width stand-in: the sort reads no rows of it)
            _, shape, dtype, place = ctx.inputs[0]
            grad_y = paddle.empty([shape[0], 0], dtype=dtype, device=place)
        (lengths,) = ctx.saved_tensor()
        # (the rows each position got: on a GPU read there, on the CPU host sizes)
        arrays = SortArrays(_contiguous(grad_y), _contiguous(grad_probs), lengths)
        arrays, scalars = host_values(arrays, SortScalars(ctx.inverse, None, False))
        grad_x, grad_p, _ = _front.outputs(SORT_CHUNKS, arrays, scalars)
        return _gradients(ctx, grad_x, grad_p)


def _permute(arrays, scalars, capacities):
    """``moe_permute``'s tuple, recorded by autograd (gradients of ``hidden_states`` and
    ``expert_prob_topk``)."""
    hidden, scale, routemap, probs = arrays
    return _Permute.apply(hidden, probs, _Others(scale, routemap, scalars, capacities))


def _unpermute(arrays, scalars, capacities=None):
    """``moe_unpermute``'s pair, recorded by autograd (gradients of
    ``hidden_states_unzipped`` and ``token_prob_unzipped``)."""
    rows, rowmap, routemap, probs = arrays
    return _Unpermute.apply(rows, probs, _Others(rowmap, routemap, scalars))


def _sort_chunks(arrays, scalars, capacities=None):
    """``moe_sort_chunks``'s pair, recorded by autograd (gradients of ``x`` and ``probs``)."""
    x, probs, device_sizes = arrays
    y, probs_y, _ = _SortChunks.apply(x, probs, _Others(device_sizes, scalars))
    return y, probs_y


# op -> ``layer(arrays, scalars, capacities)``: its public result, recorded by autograd (the
# gradient ops are not differentiable here: no double backward)
LAYERS = {PERMUTE: _permute, UNPERMUTE: _unpermute, SORT_CHUNKS: _sort_chunks}
