"""Vectorised NumPy permute and weighted unpermute: the CPU backend's baseline ("vs NumPy").

They are what a NumPy user would write (a stable sort and one gather; one gather per top-k
slot), not the contract's executable form (that is :mod:`moe_numba.oracle`). The permute
gives the contract's rows and row map; the combine rounds each product before adding, so it
matches the contract to within rounding only.
"""

from __future__ import annotations

import numpy as np


def permute(hidden, routemap, probs, counts, alignment):
    """Rows grouped by expert (tokens ascending, each expert padded to ``alignment`` with
    zero rows), the ``[T, E]`` row map and each row's probability (0 for padding rows)."""
    num_tokens, topk = routemap.shape
    flat = routemap.reshape(-1)
    valid = flat >= 0
    order = np.argsort(np.where(valid, flat, len(counts)), kind="stable")[: valid.sum()]
    experts = flat[order]
    tokens = order // topk
    padded = -(-np.asarray(counts) // alignment) * alignment
    offsets = np.concatenate([[0], np.cumsum(padded)])
    starts = np.concatenate([[0], np.cumsum(counts)])
    rows = offsets[experts] + np.arange(len(order)) - starts[experts]
    out = np.zeros((offsets[-1], hidden.shape[1]), hidden.dtype)
    out[rows] = hidden[tokens]
    rowmap = np.full((num_tokens, len(counts)), -1, np.int32)
    rowmap[tokens, experts] = rows
    row_probs = np.zeros(offsets[-1], np.float32)
    row_probs[rows] = probs.reshape(-1)[order]
    return out, rowmap, row_probs


def unpermute(rows, rowmap, routemap, probs):
    """Each token's rows times their probabilities (``probs`` per row), summed in float32
    in slot order and rounded to the rows' dtype."""
    acc = np.zeros((rowmap.shape[0], rows.shape[1]), np.float32)
    tokens = np.arange(rowmap.shape[0])
    for k in range(routemap.shape[1]):
        row = rowmap[tokens, np.maximum(routemap[:, k], 0)]
        row = np.where(routemap[:, k] >= 0, row, -1)
        has = row >= 0
        acc[has] += rows[row[has]].astype(np.float32) * probs[row[has], None]
    return acc.astype(rows.dtype)
