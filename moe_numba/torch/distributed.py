"""Expert parallelism on ``torch.distributed``: a Mixture-of-Experts layer whose experts are
spread over the ranks of a process group (gloo on CPUs, NCCL on GPUs).

Rank p of P owns the experts ``[p * E / P, (p + 1) * E / P)`` (:func:`local_experts`). One
forward of :func:`expert_parallel_moe`, on every rank (docs/expert_parallel.rst draws it)::

    agree    one all_gather of a few int64 per rank: this call's arguments and local
             errors, the same on every rank or every rank raises (:mod:`._agreement`)
    counts   distinct tokens per expert from moe_permute's own scan of the routing map
             on the device (override_buffer_size, return_expert_offsets, no rows
             gathered; with validate, its check of the routing map, which waits for its
             status words); one all_to_all of the counts and of each rank's failure code,
             ONE device-to-host read; a failed rank's error raised on every rank
    permute  moe_permute over all E experts: rows grouped by expert, so by owning rank;
             each (source rank, expert) chunk padded to padding_alignment rows
    dispatch all_to_all_single of the rows and of their probabilities
    sort     moe_sort_chunks: [source rank][local expert] -> [local expert][source rank]
    experts  expert_fn(rows, tokens_per_expert, probs) on this rank's experts, then one
             all_gather agreeing on its output (or its error)
    sort     the inverse sort, back to [source rank][local expert]
    combine  all_to_all_single back, then moe_unpermute over all E experts

Every (token, expert) pair comes back to its token's rank, so the combine adds a token's rows
in ascending global expert id exactly as a one-process run of the same batch does
(:func:`single_process_moe`): for an expert function that treats rows independently the
output and every gradient are the same bits. The backward is autograd over differentiable
pieces (moe_permute / moe_unpermute / moe_sort_chunks custom ops, and an all_to_all whose
backward is the reverse all_to_all with the saved split sizes): no host read; every rank joins
every collective of the forward and the backward, also with no tokens.

The two agreements run on CPU tensors always and on a GPU unless ``validate=False`` (there
each is one more device-to-host read): a failure on one rank, or arguments that differ
between ranks, then raise the same error on every rank before any payload collective
(docs/expert_parallel.rst, "Failure behaviour").
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.distributed as dist

from .._capacities import padded
from .._contract import (
    COMBINE_DTYPES,
    ROUTEMAP_DTYPES,
    PermuteArrays,
    PermuteScalars,
    UnpermuteArrays,
    UnpermuteScalars,
    check_bool,
    check_dtype,
    check_int,
    check_ndim,
    check_shape,
    is_int,
)
from .._contract_sort import SortArrays, SortScalars, inverse_order
from ..ops import PERMUTE, SORT_CHUNKS, UNPERMUTE
from . import _front
from ._agreement import ExpertParallelError, Field, agree, failure_code, raise_any_failure
from ._bridge import torch_dtype

__all__ = [
    "ExpertParallelError",
    "LayerTimer",
    "expert_parallel_moe",
    "local_experts",
    "single_process_moe",
]

ExpertFn = Callable[[torch.Tensor, Sequence[int], torch.Tensor], torch.Tensor]
"""``expert_fn(rows [N, H], tokens_per_expert, probs [N]) -> [N, H_out]``: rows expert-major
(``tokens_per_expert[j]`` rows of local expert j, padding rows included, then the next), the
routing probability of each row (0.0 on padding rows); bfloat16, float16 or float32 out."""

# the contract's dtypes as torch's (one table: moe_numba._contract): rows that the combine
# takes (index: their code in the agreements) and routing maps
_ROW_DTYPES = tuple(torch_dtype(d) for d in COMBINE_DTYPES)
_ROUTEMAP_DTYPES = frozenset(torch_dtype(d) for d in ROUTEMAP_DTYPES)


def local_experts(num_experts: int, group=None) -> range:
    """The global ids of the experts this rank owns: ``[p * E / P, (p + 1) * E / P)``.

    Parameters
    ----------
    num_experts : int
        E, a multiple of the group's size P.
    group : torch.distributed.ProcessGroup, optional
        The ranks that share the experts (default: the world).

    Returns
    -------
    range
        This rank's expert ids.

    Raises
    ------
    ValueError
        If this rank is not a member of ``group``, or the group's size does not divide
        ``num_experts``.
    """
    _check_member(group)
    ranks = dist.get_world_size(group)
    num_experts = check_int("num_experts", num_experts, 1)
    if num_experts % ranks:
        raise ValueError(
            f"num_experts = {num_experts} must be a multiple of the process group's size "
            f"({ranks}): each rank owns num_experts / size experts"
        )
    per_rank = num_experts // ranks
    first = dist.get_rank(group) * per_rank
    return range(first, first + per_rank)


def _check_member(group):
    """``ValueError`` unless this process is a rank of ``group`` (None: the world).

    torch answers -1 for the rank and the size of a group this process is not in, and its
    collectives return at once there without exchanging anything.
    """
    if dist.get_rank(group) < 0:
        raise ValueError(
            f"this rank is not a member of group (it is rank {dist.get_rank()} of the world): "
            "only the group's ranks own experts and call the layer with it"
        )


class LayerTimer:
    """Wall time of each stage of :func:`expert_parallel_moe`, forward and backward, summed
    over calls (``forward[stage]``, ``backward[stage]`` in seconds).

    The device is synchronised at every stage boundary, so pass one only when measuring. The
    backward is timed where the rows' gradient crosses a boundary; the probabilities'
    gradient, computed alongside, counts towards whichever stage is running then. A stage
    whose gradient leaves through no marked tensor (the permute's, or the experts', when
    ``x`` and ``probs`` need no gradient) ends with the backward pass.
    """

    STAGES = ("counts", "permute", "all-to-all", "sort", "experts", "unpermute")

    def __init__(self):
        self.forward = dict.fromkeys(self.STAGES, 0.0)
        self.backward = dict.fromkeys(self.STAGES, 0.0)
        self._last = None  # (stage whose backward runs, when it started)

    @contextlib.contextmanager
    def stage(self, name, like):
        """Time the forward code of stage ``name`` (``like``: a tensor on the device)."""
        _synchronize(like)
        start = time.perf_counter()
        yield
        _synchronize(like)
        self.forward[name] += time.perf_counter() - start

    def mark(self, tensor, stage):
        """``tensor``, the output of ``stage`` (None: the layer's input), with a clock on
        its gradient: when it arrives, the backward of ``stage`` begins."""
        if not tensor.requires_grad:
            return tensor
        return _Mark.apply(tensor, self, stage)

    def _reached(self, stage, grad):
        _synchronize(grad)
        now = time.perf_counter()
        if self._last is not None:
            running, start = self._last
            self.backward[running] += now - start
        elif stage is not None:  # a backward pass enters the layer: close it at its end
            _engine.queue_callback(lambda: self._reached(None, grad))
        self._last = None if stage is None else (stage, now)


# runs a callback when the current backward pass ends (what DDP's reducer uses)
_engine = torch.autograd.Variable._execution_engine


class _Mark(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, timer, stage):
        ctx.timer, ctx.stage = timer, stage
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.timer._reached(ctx.stage, grad)
        return grad, None, None


class _NoTimer:
    @staticmethod
    def stage(name, like):
        return contextlib.nullcontext()

    @staticmethod
    def mark(tensor, stage):
        return tensor


def _synchronize(like):
    if isinstance(like, torch.Tensor) and like.device.type == "cuda":
        torch.cuda.synchronize(like.device)


class _AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of rows; the backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):
        ctx.splits = (input_splits, output_splits)
        ctx.group = group
        return _all_to_all(x, output_splits, input_splits, group)

    @staticmethod
    def backward(ctx, grad):
        input_splits, output_splits = ctx.splits
        return _all_to_all(grad.contiguous(), input_splits, output_splits, ctx.group), *(None,) * 3


# The layer's ops, through the torch front (moe_numba.torch._front) with validate=False: the
# routing map was checked by every rank together before.


def _permute(x, routemap, probs, num_experts, counts, alignment):
    """``moe_permute``'s rows, row map and row probabilities."""
    arrays = PermuteArrays(x, None, routemap, probs)
    scalars = PermuteScalars(num_experts, alignment, validate=False)
    return _front.call(PERMUTE, arrays, scalars, counts)[:3]


def _sort(x, sizes, order, probs=None):
    """``moe_sort_chunks`` of host sizes."""
    return _front.call(SORT_CHUNKS, SortArrays(x, probs, None), SortScalars(order, sizes, False))


def _unpermute(rows, rowmap, routemap, row_probs, num_experts, weighted):
    """``moe_unpermute``'s combined rows."""
    arrays = UnpermuteArrays(rows, rowmap, routemap, row_probs)
    scalars = UnpermuteScalars(
        rowmap.shape[0], num_experts, using_weighted_combine=weighted, validate=False
    )
    return _front.call(UNPERMUTE, arrays, scalars)[0]


def _all_to_all(x, output_splits, input_splits, group):
    out = x.new_empty((sum(output_splits), *x.shape[1:]))
    dist.all_to_all_single(out, x, output_splits, input_splits, group=group)
    return out


def _counts(x, routemap, probs, num_experts, validate):
    """Distinct tokens per expert (int32 [E], on the tensors' device; ids outside [0, E)
    skipped, a repeated expert counted once): the permute's own counts, from its scan of
    the routing map with ``override_buffer_size`` (room for every (token, expert) pair, no
    padding, so no block is cut) and ``return_expert_offsets``, gathering no rows. With
    ``validate`` the permute checks the routing map too, and raises its error here, on this
    rank."""
    num_tokens, topk = routemap.shape
    arrays = PermuteArrays(x, None, routemap, probs)
    scalars = PermuteScalars(
        num_experts,
        padding_alignment=1,
        do_gather=False,
        override_buffer_size=num_tokens * min(topk, num_experts),
        validate=validate,
        return_expert_offsets=True,
    )
    with torch.no_grad():
        ends = _front.call(PERMUTE, arrays, scalars)[-1]
    return torch.diff(ends, prepend=ends.new_zeros(1))


def _check_inputs(x, routemap, probs, expert_fn):
    """This rank's tensors and expert function, checked (TypeError/ValueError naming the
    argument)."""
    for name, value in (("x", x), ("routemap", routemap), ("probs", probs)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor; got {type(value).__name__}")
    check_ndim("x", x.shape, 2, "[num_tokens, hidden]")
    check_dtype("x", x.dtype, _ROW_DTYPES)
    check_ndim("routemap", routemap.shape, 2, "[num_tokens, topk]")
    check_dtype("routemap", routemap.dtype, _ROUTEMAP_DTYPES)
    check_shape("routemap", routemap.shape, (x.shape[0], routemap.shape[1]), "[num_tokens, topk]")
    check_dtype("probs", probs.dtype, frozenset((torch.float32,)))
    check_shape("probs", probs.shape, routemap.shape, "[num_tokens, topk]")
    for name, value in (("routemap", routemap), ("probs", probs)):
        if value.device != x.device:
            raise ValueError(f"{name} must be on x's device ({x.device}); got {value.device}")
    if not callable(expert_fn):
        raise TypeError(f"expert_fn must be callable; got {type(expert_fn).__name__}")


def _contiguous(*tensors):
    """``tensors`` C-contiguous (a copy where a tensor is a strided view; autograd carries
    the gradient back to the view): a layout is no argument the ranks must agree on, and the
    ops see the same rows as a one-process run."""
    return tuple(t if t.is_contiguous() else t.contiguous() for t in tensors)


def _check_expert_output(out, rows, device):
    """``expert_fn``'s output, checked, made contiguous: [rows, H_out] strided rows on
    ``device``."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"expert_fn must return a torch.Tensor; got {type(out).__name__}")
    if out.layout != torch.strided:
        raise TypeError(f"expert_fn must return a dense (strided) tensor; got {out.layout}")
    if out.dim() != 2 or out.shape[0] != rows:
        raise ValueError(f"expert_fn must return a [{rows}, hidden] tensor; got {tuple(out.shape)}")
    if out.dtype not in _ROW_DTYPES:
        raise TypeError(f"expert_fn must return bfloat16, float16 or float32 rows; got {out.dtype}")
    if out.device != device:
        raise ValueError(f"expert_fn must return rows on {device}; got {out.device}")
    return out.contiguous()


def _run_experts(expert_fn, rows, tokens_per_expert, probs, agreeing, group):
    """``expert_fn``'s checked output; while ``agreeing``, the ranks agree on it (its error on
    one rank, an exception of ``expert_fn`` included, is raised on every rank) before the
    collective that sends it back."""
    failure = out = None
    try:
        out = expert_fn(rows, tokens_per_expert, probs)
    except Exception as error:
        if not agreeing:
            raise
        failure = ExpertParallelError(f"expert_fn raised {type(error).__name__}: {error}")
        failure.__cause__ = error
    if failure is None:
        try:
            out = _check_expert_output(out, rows.shape[0], rows.device)
        except (TypeError, ValueError) as error:
            if not agreeing:
                raise
            failure = error
    if agreeing:
        agree(_output_fields(out), failure, rows.device, group)
    return out


def _field(value):
    """An argument as an agreement value: its int, -1 where it is no int (its local check
    fails)."""
    return int(value) if is_int(value) or isinstance(value, (bool, np.bool_)) else -1


def _show_dtype(code):
    return str(_ROW_DTYPES[code]) if code >= 0 else "an unsupported dtype"


def _show_bool(code):
    return {0: "False", 1: "True"}.get(code, "no bool")


def _needs_grad(tensor):
    return int(torch.is_grad_enabled() and bool(getattr(tensor, "requires_grad", False)))


def _call_fields(x, probs, num_experts, alignment, weighted, validate):
    """What every rank's call must share (-1: not known, this rank's check failed)."""
    tensor = isinstance(x, torch.Tensor) and x.dim() == 2
    return [
        Field("num_experts", _field(num_experts)),
        Field("padding_alignment", _field(alignment)),
        Field("validate", _field(validate), _show_bool),
        Field("using_weighted_combine", _field(weighted), _show_bool),
        Field("the hidden width x.shape[1]", x.shape[1] if tensor else -1),
        Field(
            "x.dtype",
            _ROW_DTYPES.index(x.dtype) if tensor and x.dtype in _ROW_DTYPES else -1,
            _show_dtype,
            TypeError,
        ),
        Field("whether x requires a gradient", _needs_grad(x), _show_bool),
        Field("whether probs requires a gradient", _needs_grad(probs), _show_bool),
    ]


def _output_fields(out):
    """What every rank's expert output must share (-1: not known, its check failed)."""
    ok = isinstance(out, torch.Tensor) and out.dim() == 2 and out.dtype in _ROW_DTYPES
    return [
        Field("the width of expert_fn's output", out.shape[1] if ok else -1),
        Field(
            "the dtype of expert_fn's output",
            _ROW_DTYPES.index(out.dtype) if ok else -1,
            _show_dtype,
            TypeError,
        ),
        Field("whether expert_fn's output requires a gradient", _needs_grad(out), _show_bool),
    ]


def _agrees(x, validate):
    """Whether the ranks agree before their collectives: always on CPU tensors (the
    agreement reads no device), and on a GPU unless ``validate=False`` (there each agreement
    is one more device-to-host read)."""
    return _field(validate) != 0 or getattr(getattr(x, "device", None), "type", "cpu") == "cpu"


def _device(x):
    return x.device if isinstance(x, torch.Tensor) else torch.device("cpu")


def expert_parallel_moe(
    x: torch.Tensor,
    routemap: torch.Tensor,
    probs: torch.Tensor,
    expert_fn: ExpertFn,
    num_experts: int,
    *,
    group=None,
    padding_alignment: int = 1,
    using_weighted_combine: bool = True,
    validate: bool = True,
    timer: LayerTimer | None = None,
) -> torch.Tensor:
    """A Mixture-of-Experts layer over the ranks of ``group`` (the all-to-all per pair).

    Every rank calls it with its own tokens (any number, zero included). Tokens go to the
    ranks that own their experts, ``expert_fn`` runs there, and the results come back and
    are combined per token. Differentiable in ``x``, ``probs`` and whatever ``expert_fn``
    uses.

    Parameters
    ----------
    x : torch.Tensor of shape (T, H)
        This rank's tokens: bfloat16, float16 or float32.
    routemap : torch.Tensor of shape (T, K), int32 or int64
        Global expert id of each top-k slot; -1 marks an empty slot.
    probs : torch.Tensor of shape (T, K), float32
        Routing probability of each slot.
    expert_fn : callable
        ``expert_fn(rows, tokens_per_expert, probs) -> out`` for this rank's experts
        (:func:`local_experts`): ``rows`` [N, H] expert-major, ``tokens_per_expert[j]``
        rows of local expert j (a multiple of ``padding_alignment``; 0 for an expert with
        no tokens), ``probs`` [N] float32 (0.0 on padding rows). Returns [N, H_out] of
        bfloat16, float16 or float32. Called exactly once per forward on every rank.
    num_experts : int
        E, a multiple of the group's size.
    group : torch.distributed.ProcessGroup, optional
        The ranks that share the experts (default: the world).
    padding_alignment : int, default 1
        Each (source rank, expert) chunk of rows is padded with zero rows to a multiple of
        this, so every expert's row count is one too (as Megatron-Core pads its routing map
        for quantised grouped GEMMs).
    using_weighted_combine : bool, default True
        Weight each expert row by its probability in the combine (as ``moe_unpermute``);
        False sums them (an expert function that applies ``probs`` itself).
    validate : bool, default True
        Check every rank's routing map (ids in [-1, E), no expert twice in a token) on the
        device; the verdicts travel with the counts, so every rank raises together and none
        is left waiting in a collective. False: bad ids count as -1 and a repeated expert
        once, as in ``moe_permute``; on a GPU, False also skips the two agreements (the
        ranks must then pass the same arguments, and an error on one rank leaves the others
        waiting until the group's timeout). On CPU tensors the agreements always run.
    timer : LayerTimer, optional
        Adds the wall time of each stage, forward and backward (synchronising the device
        at every stage boundary).

    Returns
    -------
    torch.Tensor of shape (T, H_out)
        The combined rows, dtype of the expert function's output.

    Raises
    ------
    ValueError
        On this rank alone, at once: this rank is not a member of ``group`` (the group's
        ranks never wait for it).
        On every rank, naming the rank: ``num_experts`` not a multiple of the group's size,
        a bad routing map (with ``validate``), a bad tensor shape or device, an expert
        output of the wrong shape; or an argument that differs between ranks
        (``num_experts``, ``padding_alignment``, ``validate``, ``using_weighted_combine``,
        the hidden width, whether ``x``, ``probs`` or the expert output require a gradient,
        the expert output's width).
    TypeError
        On every rank, naming the rank: a bad argument type or dtype, an expert output of
        the wrong dtype or layout, or an ``x`` dtype or expert output dtype that differs
        between ranks.
    ExpertParallelError
        On every rank: ``expert_fn`` raised on one of them (named, with its exception's
        type and message; chained to it on that rank).

    Notes
    -----
    One device-to-host read per forward (the split sizes, after the counts' all_to_all),
    plus one per agreement on a GPU with ``validate=True``; none in the backward. A rank
    that never calls the layer (or dies, or hangs in ``expert_fn``) leaves the others in a
    collective until the process group's timeout: pass ``timeout=`` to
    ``init_process_group``. ``x``, ``routemap`` and ``probs`` may be strided views, on any
    rank (they are copied to C-contiguous tensors first, so their layout is no argument the
    ranks must share), and ``expert_fn`` may return non-contiguous rows.

    The result and all gradients equal :func:`single_process_moe` on
    the concatenation of every rank's batch, bit for bit, when ``expert_fn`` treats each row
    on its own (its rows arrive in the same order within each expert; only the padding
    rows are placed differently).
    """
    clock = _NoTimer if timer is None else timer
    stage = clock.stage
    _check_member(group)  # (first: a rank outside the group cannot join its agreement)
    agreeing = _agrees(x, validate)
    failure = None
    try:
        check_bool("using_weighted_combine", using_weighted_combine)
        check_bool("validate", validate)
        alignment = check_int("padding_alignment", padding_alignment, 1)
        experts = local_experts(num_experts, group)
        _check_inputs(x, routemap, probs, expert_fn)
        x, routemap, probs = _contiguous(x, routemap, probs)
    except (TypeError, ValueError) as error:
        if not agreeing:
            raise
        failure = error
    with stage("counts", x):
        if agreeing:
            fields = _call_fields(
                x, probs, num_experts, padding_alignment, using_weighted_combine, validate
            )
            agree(fields, failure, _device(x), group)
        ranks = dist.get_world_size(group)
        per_rank = len(experts)
        failure = None
        try:
            counts = _counts(x, routemap, probs, num_experts, validate)
        except (TypeError, ValueError) as error:  # (raised below, on every rank)
            failure = error
            counts = torch.zeros(num_experts, dtype=torch.int32, device=routemap.device)
        # to each rank: the counts of its experts, and this rank's failure code
        code = counts.new_full((ranks, 1), failure_code(failure))
        message = torch.cat([counts.view(ranks, per_rank), code], 1)
        received = torch.empty_like(message)
        dist.all_to_all_single(received, message, group=group)
        # the split sizes: the one device-to-host read besides the agreements
        host = torch.cat([counts, received.flatten()]).tolist()
    width = per_rank + 1
    raise_any_failure(host[num_experts + per_rank :: width], failure, group)
    local = host[:num_experts]
    sent = [padded(n, alignment) for n in local]
    # rows of each (source rank q, local expert j) chunk arriving here, in arrival order
    arriving = [
        padded(host[num_experts + q * width + j], alignment)
        for q in range(ranks)
        for j in range(per_rank)
    ]
    input_splits = [sum(sent[q * per_rank : (q + 1) * per_rank]) for q in range(ranks)]
    output_splits = [sum(arriving[q * per_rank : (q + 1) * per_rank]) for q in range(ranks)]
    order = [q * per_rank + j for j in range(per_rank) for q in range(ranks)]
    tokens_per_expert = [sum(arriving[j::per_rank]) for j in range(per_rank)]

    # (the layer's inputs: where their gradients arrive, the backward leaves the layer)
    x, probs = clock.mark(x, None), clock.mark(probs, None)
    with stage("permute", x):
        rows, rowmap, row_probs = _permute(x, routemap, probs, num_experts, local, alignment)
    rows = clock.mark(rows, "permute")
    with stage("all-to-all", x):
        rows_in = _AllToAll.apply(rows, output_splits, input_splits, group)
        probs_in = _AllToAll.apply(row_probs, output_splits, input_splits, group)
    rows_in = clock.mark(rows_in, "all-to-all")
    with stage("sort", x):
        expert_rows, expert_probs = _sort(rows_in, arriving, order, probs_in)
    expert_rows = clock.mark(expert_rows, "sort")
    with stage("experts", x):
        out = _run_experts(expert_fn, expert_rows, tokens_per_expert, expert_probs, agreeing, group)
    out = clock.mark(out, "experts")
    with stage("sort", x):
        back, _ = _sort(out, [arriving[c] for c in order], inverse_order(order))
    back = clock.mark(back, "sort")
    with stage("all-to-all", x):
        back = _AllToAll.apply(back, input_splits, output_splits, group)
    back = clock.mark(back, "all-to-all")
    with stage("unpermute", x):
        y = _unpermute(back, rowmap, routemap, row_probs, num_experts, using_weighted_combine)
    return clock.mark(y, "unpermute")


def single_process_moe(
    x: torch.Tensor,
    routemap: torch.Tensor,
    probs: torch.Tensor,
    expert_fn: ExpertFn,
    num_experts: int,
    *,
    padding_alignment: int = 1,
    using_weighted_combine: bool = True,
    validate: bool = True,
) -> torch.Tensor:
    """The same layer in one process, every expert local: permute -> ``expert_fn`` ->
    unpermute, with the routing rules of :func:`expert_parallel_moe` (the reference its
    results are compared with).

    Parameters
    ----------
    x, routemap, probs : torch.Tensor
        The whole batch, as for :func:`expert_parallel_moe`.
    expert_fn : callable
        As for :func:`expert_parallel_moe`, for all ``num_experts`` experts.
    num_experts : int
        E.
    padding_alignment, using_weighted_combine, validate
        As for :func:`expert_parallel_moe`.

    Returns
    -------
    torch.Tensor of shape (T, H_out)
        The combined rows.
    """
    check_bool("using_weighted_combine", using_weighted_combine)
    check_bool("validate", validate)
    alignment = check_int("padding_alignment", padding_alignment, 1)
    num_experts = check_int("num_experts", num_experts, 1)
    _check_inputs(x, routemap, probs, expert_fn)
    x, routemap, probs = _contiguous(x, routemap, probs)
    counts = _counts(x, routemap, probs, num_experts, validate).tolist()
    rows, rowmap, row_probs = _permute(x, routemap, probs, num_experts, counts, alignment)
    out = expert_fn(rows, [padded(n, alignment) for n in counts], row_probs)
    out = _check_expert_output(out, rows.shape[0], rows.device)
    return _unpermute(out, rowmap, routemap, row_probs, num_experts, using_weighted_combine)
