"""What the ranks of the expert-parallel layer agree on before a payload collective.

A payload collective whose sizes differ between ranks aborts the process (gloo: "Received
data size doesn't match expected size") or hangs (NCCL), and a rank that raises before a
collective leaves the others waiting in it until the group's timeout. So before each payload
collective every rank joins one small collective of fixed size (an ``all_gather`` of a few
int64 per rank: a status code and the fields that must be equal on every rank) and then
decides from the same table what to do: go on, or raise the same error as every other rank.
The text of a local error travels only when some rank failed (``all_gather_object``, a
collective every rank joins then).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.distributed as dist


class ExpertParallelError(RuntimeError):
    """An error on one rank of the expert-parallel layer that is not a bad argument (such as
    an exception raised by ``expert_fn``), raised on every rank of the group."""


# status codes: the error class every rank raises
_OK = 0
_CLASSES = {1: ValueError, 2: TypeError, 3: ExpertParallelError}


def failure_code(failure):
    """A local error as an int every rank can read: 0 for none, else its class's code."""
    if failure is None:
        return _OK
    if isinstance(failure, TypeError):
        return 2
    return 1 if isinstance(failure, ValueError) else 3


class Field(NamedTuple):
    """A value every rank must hold the same: its name in messages, this rank's value as an
    int64 (-1 where the local check failed before it was known), how to show a value, and
    the error class of a disagreement."""

    name: str
    value: int
    show: Callable[[int], str] = str
    error: type = ValueError


def agree(fields, failure, device, group):
    """Join the agreement of every rank of ``group``; raise what every rank raises.

    Parameters
    ----------
    fields : list of Field
        The values that must be equal on every rank (the same names, in the same order, on
        every rank).
    failure : Exception or None
        This rank's local error, if any: every rank raises it (the first failed rank's),
        naming the rank.
    device : torch.device
        Where the group's collectives take tensors (the layer's input device).
    group : torch.distributed.ProcessGroup or None
        The ranks.

    Raises
    ------
    ValueError, TypeError, ExpertParallelError
        The first failed rank's error, else the first field whose values differ; the same
        on every rank.
    """
    ranks = dist.get_world_size(group)
    rank = dist.get_rank(group)
    mine = torch.tensor([failure_code(failure)] + [f.value for f in fields])
    if device.type == "cuda":  # (from pinned memory: the read below is the one wait)
        mine = mine.pin_memory().to(device, non_blocking=True)
    table = [torch.empty_like(mine) for _ in range(ranks)]
    dist.all_gather(table, mine, group=group)
    table = torch.stack(table).tolist()
    raise_any_failure([row[0] for row in table], failure, group)
    for i, field in enumerate(fields, 1):
        column = [row[i] for row in table]
        other = next((q for q in range(ranks) if column[q] != column[0]), None)
        if other is not None:
            raise field.error(
                f"the ranks disagree on {field.name}: rank 0 has {field.show(column[0])}, "
                f"rank {other} has {field.show(column[other])} (this is rank {rank}); every "
                "rank of the group must have the same (every rank raises)"
            )


def raise_any_failure(codes, failure, group):
    """Raise on every rank the first failed rank's error, if any rank failed.

    Parameters
    ----------
    codes : list of int
        Every rank's :func:`failure_code`, as every rank read them (in rank order).
    failure : Exception or None
        This rank's local error, if any.
    group : torch.distributed.ProcessGroup or None
        The ranks: when one failed, every rank joins one ``all_gather_object`` of the
        errors' texts.

    Raises
    ------
    ValueError, TypeError, ExpertParallelError
        The first failed rank's error, naming the rank; the same on every rank.
    """
    failed = [q for q, code in enumerate(codes) if code != _OK]
    if not failed:
        return
    texts = [None] * len(codes)
    dist.all_gather_object(texts, None if failure is None else str(failure), group=group)
    q, rank = failed[0], dist.get_rank(group)
    where = "this rank" if q == rank else f"rank {q}"
    raise _CLASSES[codes[q]](f"{texts[q]} (on {where}; every rank raises)") from (
        failure if q == rank else None
    )
