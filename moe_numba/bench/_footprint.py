"""The memory a bench or demo shape needs, and the memory there is: the command line refuses a
shape that cannot fit before it allocates anything (``python -m moe_numba``'s checks).

The estimate is the sum of the arrays that are alive together at the run's peak, the
transient ones of the input generation included (the scores and their sort indices of every
token and expert, the rows in float32 before they are cast). Each row count is its upper
bound, ``R <= T K + E (A - 1)`` permuted rows; index traffic smaller than a row is left out.
"""

from __future__ import annotations

import os
from typing import NamedTuple

_GiB = 1 << 30


class Need(NamedTuple):
    """Bytes a run needs on the host and on the GPU (0 on the CPU backend)."""

    host: int
    device: int


def _permute_outputs(tokens, rows, hidden, itemsize, experts, scale_width=0):
    """Bytes of one permute's outputs: the rows (and their scales), the int32 row map
    ``[T, E]`` and the float32 row probabilities."""
    return rows * (hidden * itemsize + scale_width * 4) + tokens * experts * 4 + rows * 4


def bench_need(case, device):
    """The :class:`Need` of timing ``case`` (a :class:`._cases.Case`) on ``device``."""
    t, h, e, k, i, s = (
        case.tokens,
        case.hidden,
        case.experts,
        case.topk,
        case.itemsize,
        case.scale_width,
    )
    rows = t * k + e * (case.alignment - 1)
    inputs = t * (h * i + s * 4 + k * 8)  # rows (+ scales), routemap, probabilities
    generating = t * e * 12 + t * h * 4  # float32 scores, their int64 partition; float32 rows
    # one permute kept for the unpermute and the timed call's own; the unpermute's output
    outputs = 2 * _permute_outputs(t, rows, h, i, e, s) + t * (h * i + k * 4)
    copies = (t + rows) * (h * i + s * 4) + (t * k + t) * h * i  # the rooflines' buffers
    if device == "cuda":
        return Need(inputs + generating, inputs + outputs + copies)
    # the NumPy baseline: its own inputs, its permute, the float32 combine and a gather
    baseline = inputs + _permute_outputs(t, rows, h, i, e) + 2 * t * h * 4
    return Need(inputs + outputs + copies + max(generating, baseline), 0)


def demo_need(tokens, hidden, experts, topk, device):
    """The :class:`Need` of ``python -m moe_numba demo`` with this workload (bfloat16 rows,
    alignment 16, float64 scores and their argsort, the NumPy oracle's outputs)."""
    t, h, e, k = tokens, hidden, experts, topk
    rows = t * k + e * 15
    inputs = t * (h * 2 + k * 8)
    generating = t * e * 16 + t * h * 8  # float64 scores and int64 argsort; float64 rows
    outputs = 2 * (_permute_outputs(t, rows, h, 2, e) + t * (h * 2 + k * 4))
    oracle = _permute_outputs(t, rows, h, 2, e) + t * h * 4 + t * (h * 2 + k * 4)
    if device == "cuda":
        fetched = outputs // 2  # the outputs copied back to the host for the comparison
        return Need(inputs + max(generating, fetched + oracle), inputs + outputs)
    return Need(inputs + outputs + max(generating, oracle), 0)


def host_available():
    """Bytes of host memory available to a new allocation (Linux's ``MemAvailable``, else
    the free physical pages), and where the figure comes from; None where neither is
    known."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "MemAvailable in /proc/meminfo"
    except (OSError, ValueError, IndexError):
        pass
    try:
        pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages, "free physical pages"


def device_available():
    """Free bytes of the current GPU (numba's view of the primary context), or None where
    they cannot be read (the CUDA simulator, no driver)."""
    try:
        from numba import cuda

        return int(cuda.current_context().get_memory_info().free)
    except Exception:  # (no figure: the check is skipped, never the run)
        return None


def refusal(need, device, label):
    """Why ``need`` (of the run described by ``label``) cannot fit, or None if it can (or if
    there is no figure to compare with)."""
    host = host_available()
    if host is not None and need.host > host[0]:
        return (
            f"{label} needs about {need.host / _GiB:.1f} GiB of host memory ({need.host} bytes, "
            f"estimated) and {host[0] / _GiB:.1f} GiB are available ({host[1]}): "
            "choose a smaller shape"
        )
    if device == "cuda" and need.device:
        free = device_available()
        if free is not None and need.device > free:
            return (
                f"{label} needs about {need.device / _GiB:.1f} GiB of GPU memory "
                f"({need.device} bytes, estimated) and {free / _GiB:.1f} GiB are free on "
                "the GPU: choose a smaller shape"
            )
    return None
