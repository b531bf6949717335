"""The bytes a call must move: the numerator of every bandwidth the bench reports.

- permute reads the T rows and writes the R rows of the unzipped buffer, each of H elements
  plus, for float8 rows, S float32 scales;
- the weighted unpermute reads the T*K routed rows (padding rows are never read) and writes
  T rows of H elements.

Index and probability traffic is not counted. The copy that serves as the roofline moves
the same bytes: it reads half of them and writes the other half.
"""

from __future__ import annotations

from .._capacities import padded_rows

__all__ = ["padded_rows", "permute_bytes", "unpermute_bytes"]


def permute_bytes(case, counts):
    """Bytes a permute of ``case`` with ``counts`` tokens per expert reads and writes."""
    rows = case.tokens + padded_rows(counts, case.alignment)
    return rows * (case.hidden * case.itemsize + case.scale_width * 4)


def unpermute_bytes(case):
    """Bytes a weighted unpermute of ``case`` reads and writes (every slot routed)."""
    return (case.tokens * case.topk + case.tokens) * case.hidden * case.itemsize
