"""moe_unpermute_backward on the GPU, host side: [init -> check ->] claim -> collide -> scatter.

:func:`run` enqueues the call's kernels on the caller's stream::

    kernel    module      grid                          block            launched when
    init      .check      1                             32               validate
    check     .check      as for moe_unpermute          check_bd         validate
    claim     .owner      (T * E) / owner_bd,           owner_bd         always
                          at most owner_blocks
    collide   .owner      the same                      owner_bd         always
    scatter   .scatter    (npz + T * shares * nparts)   WARPS * LANES    there are
                          / WARPS workers                                 workers

(the blocks in lower case are the settings', :class:`._settings.Settings`.)

init and check are moe_unpermute's (:func:`.unpermute.check_steps`): the same value rules
and status slots. claim and collide find each row's pair without atomics (:mod:`.owner`);
collide also writes the status words of a row named twice, so with ``validate=True`` the
host waits for collide, whose end implies check's (each of these kernels waits for the one
ahead before it ends). Every kernel is a programmatic dependent: the first one (init, or
claim) waits for the caller's kernels first thing; the scatter loads its first dY rows
(and row map entries) before it waits for collide.

A call of TOKEN_WARPS tokens or more gives each token one scatter worker for all its rows
(``shares = nparts = 1``). Fewer tokens share each token's rows among up to K workers, and
without the dot product split the rows into parts as the permute's gather does
(:func:`_token_workers`); with at most WIDE_DOT_WARPS token workers, the dot product's
variant holds 8 groups of a row per thread rather than 4 (:func:`_batch_groups`).

Scratch: ``owner [max(R, 1)]``, ``dups [2]`` int64, one allocation (check has its own).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import abi
from ..runtime._buffer import DeviceBuffer, carve
from ..runtime._launch import launcher_for, optional_arg
from ..runtime._sequence import LaunchSequence, Step
from ..runtime._status import StatusWords, status_arg
from . import _settings, scatter
from ._copy import WORD_DTYPE, row_parts, word_width
from ._family import NoKey
from .combine import ITEMSIZE, widths
from .owner import CLAIM, COLLIDE
from .scatter import SCATTER, ScatterKey
from .unpermute import check_scratch, check_steps

FAMILIES = (CLAIM, COLLIDE, SCATTER)

_INDEX_DTYPES = {4: np.int32, 8: np.int64}
_I64 = np.dtype(np.int64)
# the parameters of the call's kernels that each call passes, in the order of its values
_SLOTS = (
    "dy",
    "xu",
    "rowmap",
    "routemap",
    "owner",
    "dups",
    "probs",
    "gprob",
    "out",
    "out_probs",
    "has_g",
    "minima",
    "status",
)


class UnpermuteBackwardBuffers(NamedTuple):
    """The device buffers of one ``moe_unpermute_backward`` call (None where the plan has
    none)."""

    grad_hidden: DeviceBuffer | None  # dY [T, H]
    grad_probs: DeviceBuffer | None  # g [T, K] float32
    rows: DeviceBuffer | None  # Xu [R, H] (read for the dot product)
    rowmap: DeviceBuffer  # [T, E] int32
    routemap: DeviceBuffer  # [T, K] int32 or int64
    probs: DeviceBuffer | None  # p [R] float32 (read when weighted with dY: dXu = dY p)
    out_rows: DeviceBuffer | None  # dXu [R, H] (with dY)
    out_probs: DeviceBuffer  # dp [R] float32
    routemap_itemsize: int  # 4 or 8 (the plan does not record the routing map's dtype)


class _Launches(NamedTuple):
    """What a call's launches need beyond its addresses: built once per call key."""

    launches: LaunchSequence  # [init, check,] claim, collide, then the scatter if any
    checked: int  # the launches up to collide (the status words are final after them)
    scratch: tuple  # (count, dtype) of each scratch part: owner, dups


# call key -> planned launches (they follow the settings); token counts vary between calls
LAUNCH_PLANS = _settings.launch_plans()


def _zero_workers(R, slots):
    """Warps that test the rows' owners (a chunk of LANES rows each) and zero the rows
    without a pair: one per chunk of the rows there would be with every routing slot
    filled (``R - slots``), at least ``zero_workers``, at most R's chunks."""
    chunks = -(-R // scatter.LANES)
    least = _settings.current.zero_workers
    return min(chunks, max(least, -(-max(R - slots, 0) // scatter.LANES)))


def _token_workers(T, K, E, groups, dot):
    """(shares, parts, groups per part): the warps that share each token's rows (each takes
    every ``shares``-th, so that no warp has more than a few), and the parts of a row of
    ``groups`` groups (without the dot product; each at least ``scatter_part_groups`` groups
    per lane, starting on a whole warp's groups), for about ``scatter_token_warps`` workers;
    (1, 1, groups) from that many tokens on. The dot product of a row stays one warp's: its
    order is the lanes' (docs/gradients.rst)."""
    s = _settings.current
    shares = row_parts(T, min(K, E), s.scatter_token_warps, 1)[0]
    if dot:
        return shares, 1, groups
    least = s.scatter_part_groups * scatter.LANES
    parts, pg = row_parts(T * shares, groups, s.scatter_token_warps, least, scatter.LANES)
    return shares, parts, pg


def _batch_groups(width, groups, dot, workers):
    """16-byte groups a scatter thread holds at once: the fewest of ``batch_groups[dot]``
    that take the whole part of ``groups`` groups (16-byte words; narrower words come from
    odd rows: the smallest); with the dot product the smallest for more than
    ``wide_dot_warps`` token ``workers``."""
    s = _settings.current
    batches = s.batch_groups[dot]
    if width != 16 or (dot and workers > s.wide_dot_warps):
        return batches[0]
    for nb in batches:
        if nb * scatter.LANES >= groups:
            return nb
    return batches[-1]


def _plan_launches(T, E, K, R, H, width, data_type, weighted, dot, bits, validate):
    """The call's geometry, scratch layout and kernels (see the module docstring)."""
    nw = H * ITEMSIZE[data_type] // width
    npz = _zero_workers(R, T * K)
    shares, parts, pg = _token_workers(T, K, E, -(-nw * width // 16), dot)
    steps = check_steps(T, E, K, bits) if validate else []
    s = _settings.current
    owner_grid = max(1, min(s.owner_blocks, -(-T * E // s.owner_bd)))
    steps.append(Step(CLAIM.get(NoKey()), CLAIM, owner_grid, s.owner_bd))
    steps.append(Step(COLLIDE.get(NoKey()), COLLIDE, owner_grid, s.owner_bd))
    checked = len(steps)
    workers = T * shares * parts
    if npz + workers > 0:
        nb = _batch_groups(width, pg, dot, T * shares)
        kernel = SCATTER.get(ScatterKey(width, data_type, weighted, dot, nb, bits))
        grid = -(-(npz + workers) // scatter.WARPS)
        steps.append(Step(kernel, SCATTER, grid, scatter.WARPS * scatter.LANES))
    constants = dict(T=T, R=R, E=E, K=K, TE=T * E, nw=nw, npz=npz, want_status=int(validate))
    constants.update(shares=shares, nparts=parts, pg=pg)
    return _Launches(
        launches=LaunchSequence(steps, constants, _SLOTS),
        checked=checked,
        scratch=((max(R, 1), _I64), (2, _I64)),
    )


def run(plan, buffers, validate, alloc, stream):
    """Enqueue moe_unpermute_backward's kernels for one call on ``stream``.

    Parameters
    ----------
    plan : moe_numba._contract_backward.BackwardPlan
        The call's plan (``plan.runs`` is true).
    buffers : UnpermuteBackwardBuffers
        The call's arrays and outputs.
    validate : bool
        Whether init and check run and the status words are computed.
    alloc : callable
        ``alloc(nbytes) -> DeviceBuffer``: stream-ordered scratch memory.
    stream : int or RecordingLauncher
        A ``CUstream`` handle (0: the legacy default stream), or the launcher of a call
        being recorded (:mod:`._replay`).

    Returns
    -------
    StatusWords or None
        With ``validate``: the call's ``abi.UNPERMUTE_BACKWARD_STATUS_LEN`` status words
        (final once collide has run), else None.

    Notes
    -----
    Every output element is written once; nothing is synchronised.
    """
    b = buffers
    T, R, E, K = plan.num_tokens, plan.num_rows, plan.num_experts, plan.topk
    H = plan.hidden if plan.grad_hidden else 0
    data_type = plan.data_type if plan.grad_hidden else abi.DATA_FLOAT32  # (no words)
    weighted = plan.weighted and plan.grad_hidden  # (the rows scaled by p)
    dot = plan.dot  # (weighted, with the rows Xu)
    esize = ITEMSIZE[data_type]
    rows = b.rows if dot else None
    width = word_width(H * esize, b.grad_hidden, rows, b.out_rows, widths=widths(data_type))
    width = max(esize, width)
    bits = 8 * b.routemap_itemsize
    key = (T, E, K, R, H, width, data_type, weighted, dot, bits, validate)
    go = LAUNCH_PLANS.get(key)
    if go is None:
        go = LAUNCH_PLANS.put(key, _plan_launches(*key))

    launch = launcher_for(stream)
    word = WORD_DTYPE[width]
    status = StatusWords(launch, abi.UNPERMUTE_BACKWARD_STATUS_LEN) if validate else None
    values = (  # the call's values, in the order of _SLOTS
        optional_arg(b.grad_hidden if T and H else None, word),
        optional_arg(rows if R else None, word),
        b.rowmap.kernel_arg(np.int32),
        b.routemap.kernel_arg(_INDEX_DTYPES[b.routemap_itemsize]),
        *carve(alloc, go.scratch),
        optional_arg(b.probs if weighted and R else None, np.float32),
        optional_arg(b.grad_probs if T else None, np.float32),
        optional_arg(b.out_rows if R and H else None, word),
        optional_arg(b.out_probs if R else None, np.uint32),
        0 if b.grad_probs is None else 1,
        check_scratch(alloc) if validate else optional_arg(None, np.int64),
        status_arg(status),
    )
    launch.run(go.launches, values, status, go.checked)
    return status
