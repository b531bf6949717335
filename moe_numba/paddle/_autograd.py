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

``PyLayer.backward`` returns one gradient per tensor argument of ``forward``, in order (None
arguments and other objects take no place); the call's other arguments travel as one object.
"""

import paddle
from paddle.autograd import PyLayer

from .._contract import PermuteArrays, UnpermuteArrays
from .._contract_backward import PermuteBackwardArrays, UnpermuteBackwardArrays
from .._contract_sort import SortArrays, inverse_order
from . import _front
from ._bridge import HOST, TENSOR

_FLOAT8 = frozenset(
    dtype for dtype, numpy_dtype in HOST.to_numpy.items() if numpy_dtype.name.startswith("float8")
)


def _contiguous(grad):
    # (Paddle may hand over strided gradients, e.g. of a slice; the ops need rows)
    return grad if grad is None or grad.is_contiguous() else grad.contiguous()


def _wanted(grad, needed):
    return _contiguous(grad) if needed else None


def _requires_grad(x):
    return x is not None and not x.stop_gradient


def _tensors(*args):
    """The positions of the tensors among ``args`` (forward's arguments)."""
    return tuple(i for i, x in enumerate(args) if isinstance(x, TENSOR))


def _gradients(ctx, grads):
    """What ``backward`` returns: per tensor argument of ``forward`` its entry of ``grads``
    (a dict by argument position), None where absent."""
    return tuple(grads.get(i) for i in ctx.tensors)


class _Permute(PyLayer):
    @staticmethod
    def forward(ctx, hidden_states, scale, expert_routemap_topk, expert_prob_topk, call):
        scalars, capacities = call
        arrays = PermuteArrays(hidden_states, scale, expert_routemap_topk, expert_prob_topk)
        outputs = _front.call("permute", arrays, scalars, capacities)
        rows, rowmap = outputs[:2]
        float8 = hidden_states.dtype in _FLOAT8  # float8 rows have no gradient
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(rowmap, *outputs[3:], *((rows,) if float8 else ()))
        ctx.rows_grad = _requires_grad(hidden_states) and scalars["do_gather"] and not float8
        ctx.probs_grad = _requires_grad(expert_prob_topk)
        ctx.validate = scalars["validate"]
        ctx.tensors = _tensors(hidden_states, scale, expert_routemap_topk, expert_prob_topk)
        ctx.save_for_backward(rowmap, expert_routemap_topk)
        return outputs

    @staticmethod
    def backward(ctx, grad_rows, _grad_rowmap, grad_probs, *_others):
        grad_rows = _wanted(grad_rows, ctx.rows_grad)
        grad_probs = _wanted(grad_probs, ctx.probs_grad)
        rowmap, routemap = ctx.saved_tensor()
        arrays = PermuteBackwardArrays(grad_rows, grad_probs, rowmap, routemap)
        if grad_rows is None and grad_probs is None:
            return _gradients(ctx, {})
        grad_hidden, grad_slots = _front.call(
            "permute_backward", arrays, {"validate": ctx.validate}
        )
        return _gradients(ctx, {0: grad_hidden, 3: grad_slots})


class _Unpermute(PyLayer):
    @staticmethod
    def forward(ctx, rows, zipped_expertwise_rowmap, expert_routemap_topk, probs, scalars):
        arrays = UnpermuteArrays(rows, zipped_expertwise_rowmap, expert_routemap_topk, probs)
        outputs = _front.call("unpermute", arrays, scalars)
        weighted = scalars["using_weighted_combine"]
        ctx.set_materialize_grads(False)
        ctx.rows_grad = _requires_grad(rows)
        ctx.probs_grad = _requires_grad(probs)
        ctx.weighted = weighted
        ctx.validate = scalars["validate"]
        ctx.num_rows = rows.shape[0]
        ctx.probs_shape = list(probs.shape)
        ctx.save_for_backward(
            zipped_expertwise_rowmap,
            expert_routemap_topk,
            probs if weighted else None,
            rows if weighted and ctx.probs_grad else None,
        )
        return outputs

    @staticmethod
    def backward(ctx, grad_out, grad_slots):
        grad_out = _wanted(grad_out, ctx.rows_grad or (ctx.probs_grad and ctx.weighted))
        grad_slots = _wanted(grad_slots, ctx.probs_grad)
        if grad_out is None and grad_slots is None:
            return None, None, None, None
        rowmap, routemap, probs, rows = ctx.saved_tensor()
        arrays = UnpermuteBackwardArrays(
            grad_out, grad_slots, rows if grad_out is not None else None, rowmap, routemap, probs
        )
        scalars = {
            "using_weighted_combine": ctx.weighted,
            "num_rows": ctx.num_rows,
            "validate": ctx.validate,
        }
        grad_rows, grad_probs = _front.call("unpermute_backward", arrays, scalars)
        if not ctx.probs_grad or grad_probs is None:
            grad_probs = None
        else:
            grad_probs = grad_probs.reshape(ctx.probs_shape)
        return (grad_rows if ctx.rows_grad else None), None, None, grad_probs


class _SortChunks(PyLayer):
    @staticmethod
    def forward(ctx, x, probs, device_sizes, scalars):
        y, probs_y, lengths = _front.call(
            "sort_chunks", SortArrays(x, probs, device_sizes), scalars
        )
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(lengths)
        ctx.inverse = inverse_order(scalars["order"])
        ctx.rows = (x.shape[0], x.dtype, x.place)
        ctx.probs_grad = _requires_grad(probs)
        ctx.tensors = _tensors(x, probs, device_sizes)
        ctx.save_for_backward(lengths)
        return y, probs_y, lengths

    @staticmethod
    def backward(ctx, grad_y, *grads):
        grad_probs = _wanted(grads[0], ctx.probs_grad) if len(grads) == 2 else None
        if grad_y is None and grad_probs is None:
            return _gradients(ctx, {})
        if grad_y is None:  # (a zero-width stand-in: the sort reads no rows of it)
            num_rows, dtype, place = ctx.rows
            grad_y = paddle.empty([num_rows, 0], dtype=dtype, device=place)
        (lengths,) = ctx.saved_tensor()
        arrays, host_sizes = _front.sort_arrays(_contiguous(grad_y), lengths, grad_probs)
        scalars = {"split_sizes": host_sizes, "order": ctx.inverse, "validate": False}
        grad_x, grad_p, _ = _front.call("sort_chunks", arrays, scalars)
        return _gradients(ctx, {0: grad_x, 1: grad_p})


def permute(arrays, scalars, capacities):
    """``moe_permute``'s tuple, recorded by autograd (gradients of ``hidden_states`` and
    ``expert_prob_topk``)."""
    return _Permute.apply(*arrays, (scalars, capacities))


def unpermute(arrays, scalars):
    """``moe_unpermute``'s pair, recorded by autograd (gradients of
    ``hidden_states_unzipped`` and ``token_prob_unzipped``)."""
    return _Unpermute.apply(*arrays, scalars)


def sort_chunks(arrays, scalars):
    """``moe_sort_chunks``'s pair, recorded by autograd (gradients of ``x`` and ``probs``)."""
    y, probs_y, _ = _SortChunks.apply(*arrays, scalars)
    return y, probs_y
