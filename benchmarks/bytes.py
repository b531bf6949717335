"""The bytes a call must move: the numerator of every bandwidth the bench reports.

- permute reads the T rows and writes the R rows of the unzipped buffer, each of H elements
  plus, for float8 rows, S float32 scales;
- the weighted unpermute reads the T*K routed rows (padding rows are never read) and writes
  T rows of H elements;
- a permute without padding or scales (vLLM's) reads T rows and writes T*K;
- the gradient ops move what the forward op they invert moves, the other way round, plus the
  rows a weighted unpermute's backward reads for the probability gradient.

Index and probability traffic is not counted. The copy that serves as the roofline moves
the same bytes: it reads half of them and writes the other half.
"""

from __future__ import annotations

from moe_numba._capacities import padded_rows

__all__ = ["padded_rows", "permute_bytes", "unpermute_bytes"]


def permute_bytes(case, counts):
    """Bytes a permute of ``case`` with ``counts`` tokens per expert reads and writes."""
    rows = case.tokens + padded_rows(counts, case.alignment)
    return rows * (case.hidden * case.itemsize + case.scale_width * 4)


def unpermute_bytes(case):
    """Bytes a weighted unpermute of ``case`` reads and writes (every slot routed)."""
    return (case.tokens * case.topk + case.tokens) * case.hidden * case.itemsize


def dense_permute_bytes(case):
    """Bytes of a permute that writes the T*K routed rows unpadded and moves no scales (vLLM's
    layout)."""
    return (case.tokens + case.tokens * case.topk) * case.hidden * case.itemsize


def permute_backward_bytes(case):
    """Bytes of a permute's backward: it combines the T*K routed rows' gradients into T rows."""
    return unpermute_bytes(case)


def unpermute_backward_bytes(case, counts):
    """Bytes of a weighted unpermute's backward: it reads the T rows' gradient and the T*K
    routed rows (for the probability gradient) and writes the R rows' gradient."""
    rows = case.tokens + case.tokens * case.topk + padded_rows(counts, case.alignment)
    return rows * case.hidden * case.itemsize


def step_bytes(case, counts):
    """Bytes of a layer's forward and backward without the experts: permute (T -> R rows), the
    weighted combine (T*K -> T), its backward (T + T*K -> R) and the permute's backward
    (T*K -> T)."""
    rows = 4 * case.tokens + 3 * case.tokens * case.topk + 2 * padded_rows(counts, case.alignment)
    return rows * case.hidden * case.itemsize
