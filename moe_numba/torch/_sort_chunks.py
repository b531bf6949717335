"""``moe_sort_chunks`` on torch tensors: two differentiable custom ops.

- ``moe_numba::sort_chunks(x, split_sizes: int[], order: int[], probs)`` for sizes known on
  the host (what an expert-parallel layer has after its one read of the split sizes);
- ``moe_numba::sort_chunks_device(x, split_sizes: Tensor, order: int[], probs, validate)`` for
  sizes in a tensor on the device (no host round trip; CUDA-graph friendly). It also returns
  the rows each output position really got (``lengths``), so the backward needs no read
  either.

The gradient of a sort is the inverse sort: the chunk sizes in output order and the
inverse permutation, ``inverse[order[i]] = i``; ``probs`` gets the same treatment. Both
backward functions call the ops again, so the gradient is itself differentiable and traceable.
Unused outputs' gradients arrive as None (not materialised).
"""

# no ``from __future__ import annotations``: torch reads the schemas from the annotations
from collections.abc import Sequence

import torch
from torch import Tensor

from .. import _core
from .._contract_sort import SortArrays, check_sort_metadata, inverse_order
from ._bridge import TorchAllocator, check_dtypes, metadata, to_numpy
from ._direct import check_all_tensors
from ._ops import _absent, _concrete, _on_cpu
from ._route import refuse_unsupported


def _run(x, split_sizes, order, probs, validate):
    """The library's internal entry on CPU tensors (NumPy views, torch-allocated outputs) or
    CUDA tensors: ``(y, probs_y or an empty stand-in, lengths)``."""
    if _on_cpu(x):
        allocate = TorchAllocator()
        sizes = to_numpy(split_sizes) if isinstance(split_sizes, Tensor) else split_sizes
        out = _core.sort_chunks(
            to_numpy(x), sizes, order, to_numpy(probs), validate=validate, empty=allocate
        )
        outputs = tuple(None if a is None else allocate.tensor(a) for a in out)
    else:
        outputs = tuple(_core.sort_chunks(x, split_sizes, order, probs, validate=validate))
    y, probs_y, lengths = outputs
    return y, _absent(x) if probs_y is None else probs_y, lengths


def _fake(x, num_chunks, probs):
    return (
        x.new_empty(x.shape),
        _absent(x) if probs is None else probs.new_empty(probs.shape),
        x.new_empty((num_chunks,), dtype=torch.int64),
    )


def _fake_check(x, probs, device_sizes, order, host_sizes):
    """The contract's metadata checks on traced tensors, when every int is concrete."""
    if _concrete(*order, *(host_sizes or ())):
        arrays = SortArrays(x, probs, device_sizes)
        check_dtypes(arrays)
        check_sort_metadata(
            metadata(arrays),
            order=tuple(order),
            host_sizes=None if host_sizes is None else tuple(host_sizes),
            validate=True,
        )


@torch.library.custom_op("moe_numba::sort_chunks", mutates_args=())
def sort_chunks_op(
    x: Tensor, split_sizes: Sequence[int], order: Sequence[int], probs: Tensor | None
) -> tuple[Tensor, Tensor]:
    """``moe_sort_chunks`` with host sizes; ``probs_y`` is an empty stand-in without
    ``probs``."""
    return _run(x, split_sizes, order, probs, True)[:2]


@sort_chunks_op.register_fake
def _(x, split_sizes, order, probs):
    _fake_check(x, probs, None, order, split_sizes)
    return _fake(x, len(split_sizes), probs)[:2]


@torch.library.custom_op("moe_numba::sort_chunks_device", mutates_args=())
def sort_chunks_device_op(
    x: Tensor, split_sizes: Tensor, order: Sequence[int], probs: Tensor | None, validate: bool
) -> tuple[Tensor, Tensor, Tensor]:
    """``moe_sort_chunks`` with sizes in a tensor; also the rows of each output position."""
    return _run(x, split_sizes, order, probs, validate)


@sort_chunks_device_op.register_fake
def _(x, split_sizes, order, probs, validate):
    _fake_check(x, probs, split_sizes, order, None)
    return _fake(x, split_sizes.shape[0], probs)


def _setup(ctx, x, order, probs):
    ctx.set_materialize_grads(False)
    ctx.num_rows = x.shape[0]
    ctx.inverse = list(inverse_order(order))
    ctx.probs_grad = probs is not None and ctx.needs_input_grad[3]


def _gradient_inputs(ctx, grad_y, grad_probs):
    """The rows and probabilities to sort back; a zero-width stand-in for absent rows."""
    if grad_probs is not None and not ctx.probs_grad:
        grad_probs = None
    if grad_y is None:
        like = grad_probs
        grad_y = like.new_empty((ctx.num_rows, 0))
    else:
        grad_y = grad_y.contiguous()
    return grad_y, None if grad_probs is None else grad_probs.contiguous()


def _setup_host(ctx, inputs, output):
    x, split_sizes, order, probs = inputs
    _setup(ctx, x, order, probs)
    ctx.sizes_back = [split_sizes[c] for c in order]


def _backward_host(ctx, grad_y, grad_probs):
    if grad_y is None and (grad_probs is None or not ctx.probs_grad):
        return None, None, None, None
    rows, probs = _gradient_inputs(ctx, grad_y, grad_probs)
    grad_x, grad_p = sort_chunks_op(rows, ctx.sizes_back, ctx.inverse, probs)
    return (
        None if grad_y is None else grad_x,
        None,
        None,
        None if probs is None else grad_p,
    )


def _setup_device(ctx, inputs, output):
    x, _, order, probs, _ = inputs
    _setup(ctx, x, order, probs)
    ctx.mark_non_differentiable(output[2])
    ctx.save_for_backward(output[2])


def _backward_device(ctx, grad_y, grad_probs, _lengths):
    if grad_y is None and (grad_probs is None or not ctx.probs_grad):
        return None, None, None, None, None
    rows, probs = _gradient_inputs(ctx, grad_y, grad_probs)
    (lengths,) = ctx.saved_tensors
    grad_x, grad_p, _ = sort_chunks_device_op(rows, lengths, ctx.inverse, probs, False)
    return (
        None if grad_y is None else grad_x,
        None,
        None,
        None if probs is None else grad_p,
        None,
    )


torch.library.register_autograd("moe_numba::sort_chunks", _backward_host, setup_context=_setup_host)
torch.library.register_autograd(
    "moe_numba::sort_chunks_device", _backward_device, setup_context=_setup_device
)


def sort_chunks(x, split_sizes, order, probs, *, validate):
    """:func:`moe_numba.moe_sort_chunks` on torch tensors, through the custom ops.

    In eager mode the call's metadata is checked first, with the errors of every other array
    kind; a CPU tensor of sizes counts as a host sequence.
    """
    refuse_unsupported("moe_sort_chunks", (x, probs))
    on_device = isinstance(split_sizes, Tensor) and split_sizes.device.type != "cpu"
    if not torch.compiler.is_compiling():
        arrays, scalars = _core.sort_chunks_call(x, split_sizes, order, probs)
        if isinstance(x, Tensor) and not (x.is_cpu or x.is_cuda):  # (meta: the fake kernel)
            check_dtypes(arrays)
        else:
            _core.SORT_CHUNKS.prepare(arrays, {**scalars, "validate": validate})
            check_all_tensors(arrays)
        order = list(scalars["order"])
        if not on_device:
            split_sizes = list(scalars["host_sizes"])
    if on_device:
        y, probs_y, _ = sort_chunks_device_op(x, split_sizes, order, probs, validate)
    else:
        y, probs_y = sort_chunks_op(x, split_sizes, order, probs)
    return y, None if probs is None else probs_y
