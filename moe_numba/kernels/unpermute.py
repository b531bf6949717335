"""moe_unpermute on the GPU, host side: [init -> check ->] combine.

:func:`run` enqueues the call's kernels on the caller's stream::

    kernel    module     grid                       block                      launched when
    init      .check     1                          32                         validate
    check     .check     (T * max(E, K)) / check_bd check_bd                   validate
                         at most check_blocks
    combine   .combine   (T, parts of a row): a     min_bd .. combine_bd, by   T > 0
                         block per token and part   the words of a part

(the blocks in lower case are the settings', :class:`._settings.Settings`.)

The call's first kernel (init, or the combine when ``validate=False``) is launched as a
programmatic dependent of the caller's kernel ahead of it and waits for it first thing, so
its launch overlaps that kernel's end (:func:`._intrinsics.griddep_wait`). With
``validate=True`` the host waits for check only; the combine may run alongside it.

``moe_permute_backward`` is this call with the counted-slot rule for the slot probabilities
(``slots``, :mod:`.permute_backward`); the gradient of ``moe_unpermute`` runs init and check
too (:func:`check_steps`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import abi
from ..runtime._buffer import DeviceBuffer, carve
from ..runtime._launch import launcher_for, optional_arg
from ..runtime._sequence import LaunchSequence, Step
from ..runtime._status import StatusWords, status_arg
from . import _settings
from ._copy import WORD_DTYPE, row_parts, word_width
from ._family import NoKey, RoutingKey
from .check import CHECK, INIT
from .combine import (
    COMBINE,
    COMBINE_COUNTED,
    ITEMSIZE,
    SLOT_PROBS,
    CombineKey,
    CountedKey,
    widths,
)

FAMILIES = (INIT, CHECK, COMBINE)

_INDEX_DTYPES = {4: np.int32, 8: np.int64}
_MINIMA = ((3, np.dtype(np.int64)),)  # check's scratch: two running minima, a ticket counter
# the parameters of the call's kernels that each call passes, in the order of its values
_SLOTS = ("rows", "rowmap", "routemap", "probs", "out", "out_probs", "R", "minima", "status")


class UnpermuteBuffers(NamedTuple):
    """The device buffers of one ``moe_unpermute`` call (None: the permute backward's
    absent gradients and their outputs)."""

    rows: DeviceBuffer | None  # [R, H]
    rowmap: DeviceBuffer  # [T, E] int32
    routemap: DeviceBuffer  # [T, K] int32 or int64
    probs: DeviceBuffer | None  # [R] float32
    out_hidden: DeviceBuffer | None  # [T, H]
    out_probs: DeviceBuffer | None  # [T, K] float32
    routemap_itemsize: int  # 4 or 8 (the plan does not record the routing map's dtype)


class _Launches(NamedTuple):
    """What a call's launches need beyond its addresses: built once per call key."""

    launches: LaunchSequence  # [init, check,] then the combine when T > 0
    checked: int  # the launches up to check (the status words are final after them)
    nw: int  # words per row
    pw: int  # words per part of a row


# call key -> planned launches (they follow the settings); token counts vary between calls
LAUNCH_PLANS = _settings.launch_plans()


def _row_parts(T, words):
    """(parts, words per part) of a combine's row of ``words`` words: one part when there are
    ``token_blocks`` tokens or more; else enough parts for about that many blocks, each of
    at least ``part_words`` words (a block per token of a small call has too few loads in
    flight; more blocks than one wave of the GPU's would load in two rounds)."""
    s = _settings.current
    return row_parts(T, words, s.token_blocks, s.part_words)


def _combine_block(parts, words):
    """Threads of a combine block for parts of ``words`` words: a thread per word of a split
    row up to ``combine_bd`` (in whole ``min_bd``), else a power of two with two words or
    more per thread."""
    s = _settings.current
    if parts > 1:
        return min(s.combine_bd, -(-words // s.min_bd) * s.min_bd)
    bd = s.min_bd
    while bd < s.combine_bd and bd * 2 < words:
        bd *= 2
    return bd


def check_steps(T, E, K, bits):
    """init and check of a call that validates a row map [T, E] and a routing map [T, K] of
    ``bits``-bit ids: the launches of a :class:`._sequence.LaunchSequence` whose values
    include ``minima`` (:func:`check_scratch`) and ``status``."""
    s = _settings.current
    grid = max(1, min(s.check_blocks, -(-max(T * E, T * K) // s.check_bd)))
    init = Step(INIT.get(NoKey()), INIT, 1, 32)
    return [init, Step(CHECK.get(RoutingKey(bits)), CHECK, grid, s.check_bd)]


def check_scratch(alloc):
    """check's scratch words (the ``minima`` of :func:`check_steps`)."""
    (minima,) = carve(alloc, _MINIMA)
    return minima


def _plan_launches(T, E, K, H, width, data_type, weighted, mix, bits, validate, slots):
    """The call's geometry and kernels (see the module docstring)."""
    nw = H * ITEMSIZE[data_type] // width
    steps = check_steps(T, E, K, bits) if validate else []
    checked = len(steps)
    parts, pw = _row_parts(T, nw)
    if T > 0:
        if slots == SLOT_PROBS:
            combine = COMBINE.get(CombineKey(width, data_type, weighted, mix, bits))
        else:
            combine = COMBINE_COUNTED.get(CountedKey(width, data_type, slots, bits))
        # (COMBINE_COUNTED's variants take COMBINE's parameters)
        steps.append(Step(combine, COMBINE, (T, parts), _combine_block(parts, pw)))
    constants = dict(T=T, E=E, K=K, nw=nw, pw=pw, first=0 if validate else 1)
    return _Launches(LaunchSequence(steps, constants, _SLOTS), checked, nw, pw)


def run(plan, buffers, validate, alloc, stream, slots=SLOT_PROBS):
    """Enqueue moe_unpermute's kernels for one call on ``stream``.

    Parameters
    ----------
    plan : moe_numba._contract.UnpermutePlan
        The call's plan.
    buffers : UnpermuteBuffers
        The call's arrays and outputs.
    validate : bool
        Whether check runs and the status words are computed.
    alloc : callable
        ``alloc(nbytes) -> DeviceBuffer``: stream-ordered scratch memory (check's words;
        not called without ``validate``).
    stream : int or RecordingLauncher
        A ``CUstream`` handle (0: the legacy default stream), or the launcher of a call
        being recorded (:mod:`._replay`).
    slots : int
        What the combine writes to ``out_probs`` (``combine.SLOT_PROBS``: moe_unpermute's
        rule; ``COUNTED_SLOTS`` or ``NO_SLOTS``: moe_permute_backward's, unweighted with
        mix precision).

    Returns
    -------
    StatusWords or None
        With ``validate``: the call's status words (final once check has run), else None.

    Notes
    -----
    Every output element is written; nothing is synchronised.
    """
    b = buffers
    T, R = plan.num_tokens, plan.num_rows
    esize = ITEMSIZE[plan.data_type]
    width = word_width(plan.hidden * esize, b.rows, b.out_hidden, widths=widths(plan.data_type))
    width = max(esize, width)
    bits = 8 * b.routemap_itemsize
    key = (T, plan.num_experts, plan.topk, plan.hidden, width, plan.data_type, plan.weighted)
    key += (plan.mix_precision, bits, validate, slots)
    go = LAUNCH_PLANS.get(key)
    if go is None:
        go = LAUNCH_PLANS.put(key, _plan_launches(*key))

    launch = launcher_for(stream)
    word = WORD_DTYPE[width]
    status = StatusWords(launch, abi.UNPERMUTE_STATUS_LEN) if validate else None
    values = (  # the call's values, in the order of _SLOTS
        optional_arg(b.rows if R else None, word),
        b.rowmap.kernel_arg(np.int32),
        b.routemap.kernel_arg(_INDEX_DTYPES[b.routemap_itemsize]),
        optional_arg(b.probs if R else None, np.float32),
        optional_arg(b.out_hidden, word),
        optional_arg(b.out_probs, np.float32),
        R,
        check_scratch(alloc) if validate else optional_arg(None, np.int64),
        status_arg(status),
    )
    launch.run(go.launches, values, status, go.checked)
    return status
