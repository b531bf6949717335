"""A library call's kernel launches, planned once per call key and run by every call.

The kernels of a call take their parameters by name
(:class:`moe_numba.kernels._family.KernelFamily`). Most of
them follow from the call key (sizes, grids, flags); the rest are the call's own addresses
(inputs, outputs, scratch). A :class:`LaunchSequence` holds, per launch, the kernel, its
geometry and its parameters as a template: constants in place, and for each of the call's
values its slot. A call passes its values as one tuple in slot order
(:meth:`LaunchSequence.run`). On a GPU where the C launcher (:mod:`._driver_c`) is built,
the launches run in one call from Python; elsewhere (the simulator, ``cuda.core``) each goes
through :class:`._launch.Launcher` with its arguments filled in here.
"""

from __future__ import annotations

from operator import itemgetter
from typing import NamedTuple

from ._launch import RawKernel


def _one(k):
    """The picker of a single argument (itemgetter of one index returns it bare)."""
    return lambda values: (values[k],)


class Step(NamedTuple):
    """One launch of a sequence (a programmatic dependent where the device allows:
    :meth:`._launch.Launcher.__call__`)."""

    kernel: RawKernel
    family: object  # the kernel's KernelFamily (moe_numba.kernels._family)
    grid: int | tuple
    block: int
    shmem: int = 0


class LaunchSequence:
    """The launches of one planned call.

    Parameters
    ----------
    steps : sequence of Step
        The launches, in stream order.
    constants : mapping of str to int
        The parameters the plan fixes, by name.
    slots : sequence of str
        The names of the parameters each call passes, in the order of its values.

    Raises
    ------
    TypeError
        For a kernel parameter that is neither a constant nor a slot.
    """

    __slots__ = ("_bound", "_constants", "_indices", "_picks", "_slots", "steps")

    def __init__(self, steps, constants, slots):
        index = {name: i for i, name in enumerate(slots)}
        self.steps = tuple(steps)
        self._slots = len(slots)
        planned = {}  # constant name -> its index in ``values + _constants``
        self._indices = []  # per step: the index of each parameter in ``values + _constants``
        self._picks = []  # per step: the getter of those
        for step in self.steps:
            names = step.family.names
            missing = [n for n in names if n not in index and n not in constants]
            if missing:
                raise TypeError(f"{step.family.name} takes {missing}: neither given nor planned")
            for n in names:
                if n not in index:
                    planned.setdefault(n, len(slots) + len(planned))
            picks = tuple(index[n] if n in index else planned[n] for n in names)
            self._indices.append(picks)
            self._picks.append(itemgetter(*picks) if len(picks) > 1 else _one(*picks))
        self._constants = tuple(int(constants[n]) for n in planned)
        self._bound = {}  # (device, overlap) -> the C launcher's sequence

    def __len__(self):
        return len(self.steps)

    def args(self, i, values):
        """The arguments of step ``i`` for a call's ``values`` (a tuple)."""
        return self._picks[i](values + self._constants)

    def words(self, i):
        """``(template, slots)`` of step ``i``: its parameter words with the constants in
        place (0 for the others), and per word the index of the call's value that takes it,
        or -1 for a constant."""
        n = self._slots
        indices = self._indices[i]
        template = tuple(self._constants[k - n] if k >= n else 0 for k in indices)
        return template, tuple(k if k < n else -1 for k in indices)

    def bound(self, key, make):
        """The C launcher's form of this sequence for ``key``, made by ``make()`` once."""
        bound = self._bound.get(key)
        if bound is None:
            bound = self._bound[key] = make()
        return bound
