"""The one bounded cache that every per-call memo of moe-numba uses.

A training or serving loop repeats a handful of call shapes, so each memo (checked metadata,
capacity plans, uploaded capacities, launch configurations) stays small; a loop that keeps
producing new keys (token counts that change every step) must not grow memory without bound.
When a cache is full it forgets everything at once: cheaper than tracking recency on a path
that costs microseconds, and the working set refills in one round of calls.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Generic, TypeVar

V = TypeVar("V")


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
