"""moe_permute on the GPU, host side: count -> scan -> gather (the gather also places).

:func:`run` plans the call and enqueues its kernels on the caller's stream::

    kernel       module        grid                          block            launched when
    count        .count        (chunks, expert tiles)        count_bd         T > 0
    scan         .scan         expert tiles (1 when T = 0)   scan_bd          always
    count_scan   .scan         1                             count_bd         instead of both
                                                                              for small calls
    gather       .gather       (npw + T * parts) / WARPS     WARPS * LANES    there are items

(the blocks and thresholds in lower case are the settings', :class:`._settings.Settings`.)
``count_scan`` runs for ``validate=False`` calls of one chunk and one expert tile and at most
``one_block_slots`` routing slots (one launch fewer); with ``validate=True`` the host waits
for the scan, which chunked counting finishes sooner, and so it does for more slots.
Nothing is synchronised: with ``validate=True`` the host waits for an event recorded after
the scan (:mod:`._status`). Every kernel is launched as a programmatic dependent
(:func:`._intrinsics.griddep_wait`): count waits first thing, for the caller's kernels, so
its launch overlaps their end; the gather starts during the count and loads its first rows
then.

Scratch, one allocation (int64 arrays first, so every part stays aligned)::

    done [1]  offsets [E]  lim [E]  padbase [E + 1]  ctot [E]  part [2 * chunks]   int64
    counts [chunks * E]  slot_rank [T * K]                                          int32

Every scratch word is written before it is read; every output element is written once (a
rowmap entry of a placed token twice, -1 then its row, by the same warp).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import abi
from ..runtime._buffer import DeviceBuffer, carve
from ..runtime._launch import launcher_for, optional_arg
from ..runtime._sequence import LaunchSequence, Step
from ..runtime._staged import StagedWords
from ..runtime._status import StatusWords, status_arg
from . import _copy, _settings, gather
from ._family import RoutingKey
from .count import COUNT
from .gather import GATHER, GatherKey
from .scan import COUNT_SCAN, SCAN

FAMILIES = (COUNT, SCAN, COUNT_SCAN, GATHER)

_I64, _I32 = np.dtype(np.int64), np.dtype(np.int32)
# the scratch arrays, in the order of one allocation (see the module docstring)
_SCRATCH = ("done", "offsets", "lim", "padbase", "ctot", "part", "counts", "slot_rank")
_INDEX_DTYPES = {4: np.int32, 8: np.int64}
# the parameters of the call's kernels that each call passes, in the order of its values
_SLOTS = (
    "hidden",
    "scale",
    "routemap",
    "probs",
    "capacity",
    "out_hidden",
    "out_scale",
    "rowmap",
    "out_probs",
    "out_indices",
    "out_offsets",
    "status",
    *_SCRATCH,
)


class PermuteBuffers(NamedTuple):
    """The device buffers of one ``moe_permute`` call (None where the plan has none)."""

    hidden: DeviceBuffer | None  # [T, H] (when rows are copied)
    scale: DeviceBuffer | None  # [T, scale_width] (when scale rows are copied)
    routemap: DeviceBuffer  # [T, K] int32 or int64
    probs: DeviceBuffer  # [T, K] float32
    capacity: DeviceBuffer | None  # [E] int64 tokens_per_expert on the device, or None:
    capacity_values: np.ndarray | None  # them on the host, to stage (None: override)
    out_hidden: DeviceBuffer | None
    out_scale: DeviceBuffer | None
    out_rowmap: DeviceBuffer
    out_probs: DeviceBuffer
    out_indices: DeviceBuffer | None
    out_offsets: DeviceBuffer | None  # [E] int32 (when asked for)
    routemap_itemsize: int  # 4 or 8 (the plan does not record the routing map's dtype)


class _Launches(NamedTuple):
    """What a call's launches need beyond its addresses: built once per call key."""

    one_block: bool  # count_scan instead of count + scan
    scratch: tuple  # (count, dtype) of each part of _SCRATCH
    launches: LaunchSequence  # count and scan (or count_scan), then the gather if any
    counted: int  # the launches up to the scan (the status words are final after them)


# call key -> planned launches (they follow the settings); token counts vary between calls
LAUNCH_PLANS = _settings.launch_plans()


def _row_parts(T, hnw):
    """(parts, words per part) of a hidden row of ``hnw`` words: one part when there are
    ``token_warps`` tokens or more; else enough parts for about that many token warps, each
    of at least ``part_batch`` words per lane and starting on a whole warp's words (a warp
    that copies a whole row stores only a few rows' bytes at a time, too few in flight for a
    small call)."""
    s = _settings.current
    lanes = s.gather_lanes
    return _copy.row_parts(T, hnw, s.token_warps, s.part_batch * lanes, lanes)


def _padding_workers(R, slots, pad_rows, parts, least):
    """Warps that zero the padding rows: ``parts`` per chunk of ``pad_rows`` rows, for the
    padding there would be if every routing slot counted (``R - slots`` rows), and for at
    least ``least`` (>= 1) chunks (there is more padding when slots are empty), but no more
    than R's chunks."""
    chunks = -(-R // pad_rows)
    return parts * min(chunks, max(least, -(-max(R - slots, 0) // pad_rows)))


def _chunk_tokens(T, K):
    """Tokens per count chunk: about ``nc_target`` chunks (parallel count blocks, a short
    scan), at most ``ct``, and small enough that the chunk's routing ids fit in shared
    memory (``rmt``)."""
    s = _settings.current
    ct = 32
    while ct < s.ct and ct * s.nc_target < T:
        ct *= 2
    while ct > 1 and ct * K > s.rmt:
        ct //= 2
    return ct


def _batch_words(hw, hnw):
    """Hidden words a gather thread holds at once: the fewest of ``batch_words`` that take
    the whole row part of ``hnw`` words (16-byte words; narrower words come from odd rows:
    the smallest batch)."""
    s = _settings.current
    if hw != 16:
        return s.batch_words[0]
    for nb in s.batch_words:
        if nb * s.gather_lanes >= hnw:
            return nb
    return s.batch_words[-1]


def _plan_launches(T, K, E, R, hw, hnw, sw, snw, bits, validate, A, override, indices, ends):
    """The call's geometry, scratch layout and kernels (see the module docstring)."""
    s = _settings.current
    # one block is one launch fewer, but its threads take 4 slots each at this bound, and
    # past it the chunks' parallel count finishes sooner than the saved launch
    one_block = not validate and 0 < T <= s.ct and T * K <= s.one_block_slots
    one_block = one_block and E <= s.etile
    ct = T if one_block else _chunk_tokens(T, K)
    nc = -(-T // ct)
    scratch = ((1, _I64), (E, _I64), (E, _I64), (E + 1, _I64), (E, _I64), (2 * max(nc, 1), _I64))
    scratch += ((max(nc * E, 1), _I32), (max(T * K, 1), _I32))
    key = RoutingKey(bits)
    if one_block:
        ex_dim = s.count_bd  # a thread per expert
        steps = [Step(COUNT_SCAN.get(key), COUNT_SCAN, 1, s.count_bd)]
    else:
        # a block per tile of ex_dim experts (the last one to finish does the offsets and
        # the status); with no tokens, one block and no ticket counter
        ex_dim = max(1, s.scan_bd // 32) if T > 0 else s.scan_bd
        steps = []
        if T > 0:
            steps.append(Step(COUNT.get(key), COUNT, (nc, -(-E // s.etile)), s.count_bd))
        steps.append(Step(SCAN.get(key), SCAN, -(-E // ex_dim) if T > 0 else 1, s.scan_bd))
    counted = len(steps)
    parts, pw = _row_parts(T, hnw)
    pad_rows = max(1, s.pad_rows // parts)
    npw = _padding_workers(R, T * K, pad_rows, parts, s.pad_workers)
    items = npw + T * parts
    gather_key = GatherKey(hw, sw, _batch_words(hw, pw), bits)
    if items > 0:
        grid = min(-(-items // gather.WARPS), s.gather_blocks)
        steps.append(Step(GATHER.get(gather_key), GATHER, grid, gather.WARPS * s.gather_lanes))
    # the kernels' scalar arguments (all that the key decides): T, K, E, R, NC (count
    # chunks), ct (tokens per chunk), ex_dim (experts per scan block tile), npw (padding
    # workers), nparts, pw (parts of a row, hidden words of a part), pad_rows (rows of a
    # padding chunk), hnw, snw (hidden and scale words per row), A, override, want_status,
    # has_indices, has_offsets (0 or 1)
    constants = dict(
        T=T,
        K=K,
        E=E,
        R=R,
        NC=nc,
        ct=ct,
        ex_dim=ex_dim,
        npw=npw,
        nparts=parts,
        pw=pw,
        pad_rows=pad_rows,
        hnw=hnw,
        snw=snw,
        A=A,
        override=int(override),
        want_status=int(validate),
        has_indices=int(indices),
        has_offsets=int(ends),
    )
    return _Launches(
        one_block=one_block,
        scratch=scratch,
        launches=LaunchSequence(steps, constants, _SLOTS),
        counted=counted,
    )


def _row_words(row_bytes, source, target, default):
    """(word width, words per row) of a row copy from ``source`` to ``target``."""
    if source is None or row_bytes == 0:
        return default, 0
    width = _copy.word_width(row_bytes, source, target)
    return width, row_bytes // width


def run(plan, buffers, alloc, stream):
    """Enqueue moe_permute's kernels for one call on ``stream``.

    Parameters
    ----------
    plan : moe_numba._contract.PermutePlan
        The call's plan, with its row count; ``plan.validate``: whether the status words
        are computed.
    buffers : PermuteBuffers
        The call's arrays and outputs.
    alloc : callable
        ``alloc(nbytes) -> DeviceBuffer``: stream-ordered scratch memory.
    stream : int or RecordingLauncher
        A ``CUstream`` handle (0: the legacy default stream), or the launcher of a call
        being recorded (:mod:`._replay`).

    Returns
    -------
    StatusWords or None
        With ``validate``: the call's status words (final once the scan has run), else None.

    Notes
    -----
    Every output element is written; nothing is synchronised.
    """
    b = buffers
    T, K, E, R = plan.num_tokens, plan.topk, plan.num_experts, plan.num_rows
    # copy word widths (from the addresses: checked before anything is launched)
    hw, hnw = _row_words(plan.hidden_row_bytes, b.hidden, b.out_hidden, 8)
    sw, snw = _row_words(plan.scale_row_bytes, b.scale, b.out_scale, 4)
    if sw < 4:
        raise ValueError("scale rows must be whole, 4-byte aligned float32/int32 words")
    bits = 8 * b.routemap_itemsize
    validate = plan.validate
    indices = b.out_indices is not None
    ends = b.out_offsets is not None
    key = (
        T,
        K,
        E,
        R,
        hw,
        hnw,
        sw,
        snw,
        bits,
        validate,
        plan.alignment,
        plan.override,
        indices,
        ends,
    )
    go = LAUNCH_PLANS.get(key)
    if go is None:
        go = LAUNCH_PLANS.put(key, _plan_launches(*key))

    launch = launcher_for(stream)
    status = StatusWords(launch, abi.PERMUTE_STATUS_LEN) if validate else None
    staged = None if b.capacity_values is None else StagedWords(launch, b.capacity_values)
    hd, sd = _copy.WORD_DTYPE[hw], _copy.WORD_DTYPE[sw]
    values = (  # the call's values, in the order of _SLOTS
        optional_arg(b.hidden if hnw else None, hd),
        optional_arg(b.scale if snw else None, sd),
        b.routemap.kernel_arg(_INDEX_DTYPES[b.routemap_itemsize]),
        b.probs.kernel_arg(np.uint32),
        optional_arg(b.capacity, np.int64) if staged is None else staged.arg,
        optional_arg(b.out_hidden if hnw else None, hd),
        optional_arg(b.out_scale if snw else None, sd),
        b.out_rowmap.kernel_arg(np.int32),
        optional_arg(b.out_probs if R else None, np.uint32),
        optional_arg(b.out_indices if R else None, np.int32),
        optional_arg(b.out_offsets, np.int32),
        # (without validate the scan writes no status words)
        status_arg(status),
        *carve(alloc, go.scratch),
    )
    launch.run(go.launches, values, status, go.counted)
    if staged is not None:
        staged.release()
    return status
