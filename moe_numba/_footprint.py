"""The memory a demo shape needs, and the memory there is: the command line refuses a shape
that cannot fit before it allocates anything (``python -m moe_numba``'s checks; the
benchmarks of the repository estimate their shapes with the same pieces).

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


def permute_output_bytes(tokens, rows, hidden, itemsize, experts, scale_width=0):
    """Bytes of one permute's outputs: the rows (and their scales), the int32 row map
    ``[T, E]`` and the float32 row probabilities."""
    return rows * (hidden * itemsize + scale_width * 4) + tokens * experts * 4 + rows * 4


def demo_need(tokens, hidden, experts, topk, device):
    """The :class:`Need` of ``python -m moe_numba demo`` with this workload (bfloat16 rows,
    alignment 16, float64 scores and their argsort, the NumPy oracle's outputs)."""
    t, h, e, k = tokens, hidden, experts, topk
    rows = t * k + e * 15
    inputs = t * (h * 2 + k * 8)
    generating = t * e * 16 + t * h * 8  # float64 scores and int64 argsort; float64 rows
    outputs = 2 * (permute_output_bytes(t, rows, h, 2, e) + t * (h * 2 + k * 4))
    oracle = permute_output_bytes(t, rows, h, 2, e) + t * h * 4 + t * (h * 2 + k * 4)
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


MEASURED = object()  # refusal's default: the figure of this machine, read when it is asked


def refusal(need, device, label, host=MEASURED, free=MEASURED):
    """Why ``need`` (of the run described by ``label``) cannot fit, or None if it can (or if
    there is no figure to compare with).

    ``host`` is ``(bytes, where the figure comes from)`` or None (no figure), ``free`` the
    GPU's free bytes or None; by default both are read here (:func:`host_available`,
    :func:`device_available`, the latter only for a ``"cuda"`` run).
    """
    if host is MEASURED:
        host = host_available()
    if host is not None and need.host > host[0]:
        return (
            f"{label} needs about {need.host / _GiB:.1f} GiB of host memory ({need.host} bytes, "
            f"estimated) and {host[0] / _GiB:.1f} GiB are available ({host[1]}): "
            "choose a smaller shape"
        )
    if device == "cuda" and need.device:
        if free is MEASURED:
            free = device_available()
        if free is not None and need.device > free:
            return (
                f"{label} needs about {need.device / _GiB:.1f} GiB of GPU memory "
                f"({need.device} bytes, estimated) and {free / _GiB:.1f} GiB are free on "
                "the GPU: choose a smaller shape"
            )
    return None
