"""The one bounded cache that every per-call memo of moe-numba uses.

A training or serving loop repeats a handful of call shapes, so each memo (checked metadata,
capacity plans, uploaded capacities, launch configurations) stays small; a loop that keeps
producing new keys (token counts that change every step) must not grow memory without bound.
When a cache is full it forgets everything at once: cheaper than tracking recency on a path
that costs microseconds, and the working set refills in one round of calls.

:func:`clear` (public as ``moe_numba.clear``) forgets every cache of the library at once:
each module that keeps one registers its clear here when it loads (:func:`on_clear`), so the
caches of the parts never loaded (the GPU backend, the torch integration) cost nothing and
are not imported.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Generic, TypeVar

V = TypeVar("V")

_CLEARS: list[Callable[[], None]] = []  # the loaded modules' clears, in the order they loaded


def on_clear(hook: Callable[[], None]) -> Callable[[], None]:
    """Have :func:`clear` call ``hook()`` (a module that keeps a cache registers its clear
    when it loads); returns ``hook``, so it serves as a decorator."""
    _CLEARS.append(hook)
    return hook


def clear() -> None:
    """Forget every cache moe-numba holds: the next calls check, plan, upload and record
    anew, as the first calls of a process do (nothing is compiled again).

    That is: the checked metadata and capacity plans of every op, the GPU backend (its device
    copies of capacities; the next CUDA call checks again for a usable GPU), the GPU
    kernels' launch plans, the GPU runtime's launch configurations and pooled pinned blocks
    (``moe_numba.runtime.get_runtime().reset()``), and the torch integration's recorded
    calls. Only what is loaded is cleared: this imports neither numba nor torch.

    Kept: the compiled kernels, and the pinned blocks that a CUDA graph captured in this
    process may read at each of its replays (nothing tells the library when the graph is
    destroyed).

    Notes
    -----
    Call it between calls, not during one: a call running in another thread meanwhile keeps
    what it has already looked up and may store it again. Changing the GPU kernels'
    settings (``moe_numba.kernels.use_settings``) or the runtime's driver
    (``Runtime.use_driver``) clears this way on its own.
    """
    for hook in tuple(_CLEARS):
        hook()


class BoundedCache(Generic[V]):
    """A mapping of at most ``maxsize`` entries, emptied when a new key would pass that.

    Parameters
    ----------
    maxsize : int
        The most entries held at once (>= 1).
    """

    __slots__ = ("_data", "maxsize")

    def __init__(self, maxsize: int):
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1; got {maxsize}")
        self.maxsize = maxsize
        self._data: dict[Hashable, V] = {}

    def __len__(self) -> int:
        return len(self._data)

    @property
    def entries(self) -> Mapping[Hashable, V]:
        """The entries themselves, for lookups on a hot path (never written through this):
        the same mapping for the cache's life, emptied in place."""
        return self._data

    def get(self, key: Hashable) -> V | None:
        """The value stored under ``key``, or None."""
        return self._data.get(key)

    def put(self, key: Hashable, value: V) -> V:
        """Store ``value`` under ``key`` (emptying the cache first when it is full)."""
        if len(self._data) >= self.maxsize and key not in self._data:
            self._data.clear()
        self._data[key] = value
        return value

    def get_or_compute(self, key: Hashable | None, compute: Callable[[], V]) -> V:
        """``compute()``, remembered under ``key``; a None key, or one that cannot be hashed
        (a tuple that holds a list or an array), is never remembered.

        Exceptions from ``compute`` propagate and nothing is stored for them.
        """
        if key is None:
            return compute()
        try:
            value = self._data.get(key)
        except TypeError:  # unhashable
            return compute()
        if value is None:
            value = self.put(key, compute())
        return value

    def clear(self) -> None:
        """Forget every entry."""
        self._data.clear()
