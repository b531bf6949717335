"""The kernels' tunables (block sizes, split thresholds, batch sizes), one frozen object.

The host planners read :data:`current` when they plan a call's launches; the launch plans
they cache follow it, so :func:`use_settings` forgets them (and everything else the library
caches: ``moe_numba.clear``) whenever it swaps the settings. A few settings are compiled
into the kernels' code (their shared arrays' sizes, a worker's lanes): numba freezes them at
the first compile on a GPU, so :func:`use_settings` changes them only in the CUDA simulator,
which runs the kernels as Python and reads them at every launch. The stage modules that
compile them in keep them as module constants, set from here (:func:`compiled_in`). The
settings that pick a variant (``batch_words``, ``batch_groups``) are fields of the variant
keys, so each value compiles a kernel of its own.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, fields, replace

from .._cache import BoundedCache, clear, on_clear


@dataclass(frozen=True)
class Settings:
    """The GPU kernels' tunables: what the host planners read (every field), and what is
    compiled into the kernels (``ct``, ``etile``, ``rmt``, ``gather_lanes``, ``lmax``:
    they change only in the CUDA simulator).

    Parameters
    ----------
    count_bd, scan_bd : int
        Threads of a count (and count_scan) block and of a scan block (moe_permute).
    gather_blocks : int
        Most gather blocks (workers then take several items).
    pad_workers : int
        Fewest padding chunks in flight (when there are as many chunks of rows).
    nc_target : int
        Count chunks to aim for.
    one_block_slots : int
        Most routing slots of a count_scan call (0: every call counts in chunks).
    token_warps : int
        Token warps that keep the GPU's stores busy: a call of fewer tokens splits its
        rows among warps (1: no split).
    part_batch : int
        Fewest hidden words per lane in a part of a split row.
    ct : int
        Most tokens of a count chunk (a multiple of 32; compiled in: the count block's
        shared bitmap holds ``etile * ct / 32`` words).
    etile : int
        Experts of a count block (compiled in).
    rmt : int
        Routing ids a count block stages in shared memory (compiled in; a chunk with
        more slots reads them from memory).
    gather_lanes : int
        Threads of a gather worker (a warp; compiled in).
    batch_words : tuple of int
        Hidden words a gather thread may hold at once, rising (gather variants).
    pad_rows : int
        Rows of a padding chunk when rows are not split (at most ``gather_lanes``).
    combine_bd, min_bd : int
        Most and fewest threads of a combine block (moe_unpermute, moe_permute_backward).
    token_blocks : int
        Combine blocks that keep the GPU's loads busy: a call of fewer tokens splits its
        rows among blocks (1: no split).
    part_words : int
        Fewest words in a part of a split combine row.
    check_bd, check_blocks : int
        Threads of a check block, and most check blocks.
    lmax : int
        Rows of a token's list in the combine's shared memory (compiled in; a token with
        more valid rows walks its rowmap row instead).
    owner_bd, owner_blocks : int
        Threads of a claim or collide block, and most such blocks (moe_unpermute_backward).
    zero_workers : int
        Fewest zero workers of the scatter (when there are as many chunks of rows).
    scatter_token_warps : int
        Token workers of the scatter that keep the GPU's loads busy: a call of fewer
        tokens shares each token's rows among up to K warps, and without the dot product
        splits rows into parts too (1: no split).
    scatter_part_groups : int
        Fewest 16-byte groups per lane in a part of a split scatter row.
    wide_dot_warps : int
        Most token workers whose dot products take the wider batch of
        ``batch_groups[1]`` (with few warps the SMs have registers to spare; 0: never).
    batch_groups : tuple of two tuples of int
        16-byte groups a scatter thread may hold at once, rising: without the dot product,
        then with it (scatter variants).
    plan_bd, copy_bd, copy_blocks : int
        Most threads of moe_sort_chunks's plan block and of a copy block, and most copy
        blocks.

    Raises
    ------
    TypeError
        For a field of the wrong type (an int where an int is due, bools refused; tuples
        of ints).
    ValueError
        For a value out of its range (each int >= 1, ``one_block_slots`` and
        ``wide_dot_warps`` >= 0), tuples
        that are empty or not rising, a ``ct`` that is no multiple of 32, or ``pad_rows``
        above ``gather_lanes``.
    """

    count_bd: int = 256
    scan_bd: int = 256
    gather_blocks: int = 1 << 30
    pad_workers: int = 256
    nc_target: int = 128
    one_block_slots: int = 1024
    token_warps: int = 4096
    part_batch: int = 4
    ct: int = 256
    etile: int = 1024
    rmt: int = 2048
    gather_lanes: int = 32
    batch_words: tuple = (4, 8, 16, 28)
    pad_rows: int = 32
    combine_bd: int = 128
    min_bd: int = 32
    token_blocks: int = 1024
    part_words: int = 128
    check_bd: int = 256
    check_blocks: int = 1024
    lmax: int = 256
    owner_bd: int = 256
    owner_blocks: int = 2048
    zero_workers: int = 256
    scatter_token_warps: int = 4096
    scatter_part_groups: int = 4
    wide_dot_warps: int = 1024
    # (without the dot product the whole row where it can; with it a batch of 4 when warps
    # are many, since Xu's words take registers too: at 8 too few warps fit on an SM to keep
    # enough loads in flight, docs/lab-notes.rst "First runs beside the peers"; 8 when they
    # are few (wide_dot_warps), in half the round trips)
    batch_groups: tuple = ((4, 8, 16, 28), (4, 8))
    plan_bd: int = 1024
    copy_bd: int = 128
    copy_blocks: int = 1 << 16

    def __post_init__(self):
        for field in fields(self):
            value = getattr(self, field.name)
            if field.name == "batch_groups":
                if type(value) is not tuple or len(value) != 2:
                    raise TypeError(
                        f"Settings.batch_groups must be a tuple of two tuples of ints; got "
                        f"{value!r}"
                    )
                for batches in value:
                    _check_batches("batch_groups", batches)
            elif type(field.default) is tuple:
                _check_batches(field.name, value)
            else:
                _check_int(field.name, value, 0 if field.name in _MAY_BE_0 else 1)
        if self.ct % 32:
            raise ValueError(f"Settings.ct must be a multiple of 32; got {self.ct}")
        if self.pad_rows > self.gather_lanes:
            raise ValueError(
                f"Settings.pad_rows must be at most gather_lanes ({self.gather_lanes}); got "
                f"{self.pad_rows}"
            )


_MAY_BE_0 = ("one_block_slots", "wide_dot_warps")  # (0 switches them off)


def _check_int(name, value, least):
    if type(value) is not int:
        raise TypeError(f"Settings.{name} must be an int; got {value!r}")
    if value < least:
        raise ValueError(f"Settings.{name} must be >= {least}; got {value}")


def _check_batches(name, batches):
    if type(batches) is not tuple or not all(type(b) is int for b in batches):
        raise TypeError(f"Settings.{name} must hold tuples of ints; got {batches!r}")
    if not batches or batches[0] < 1 or list(batches) != sorted(set(batches)):
        raise ValueError(
            f"Settings.{name} must hold non-empty tuples of rising ints >= 1; got {batches!r}"
        )


DEFAULT = Settings()
# what the kernels compile in: the fields that change only in the CUDA simulator
COMPILED = ("ct", "etile", "rmt", "gather_lanes", "lmax")

current = DEFAULT  # the settings in force (the planners read them; use_settings swaps them)
_COMPILED_IN = []  # the stage modules' setters of their compiled-in constants
_LAUNCH_PLANS = []  # every planner's cache of launch plans


def settings():
    """The settings in force.

    Returns
    -------
    Settings
        :data:`DEFAULT`, or those of the innermost :func:`use_settings` block.
    """
    return current


def compiled_in(setter):
    """Register ``setter(settings)``, which sets a stage module's compiled-in constants
    from ``settings``, and call it with the settings in force; returns ``setter``."""
    _COMPILED_IN.append(setter)
    setter(current)
    return setter


def launch_plans(maxsize=1024):
    """A planner's cache of launch plans (call key -> plan): they follow the settings, so it
    is emptied whenever the settings change, and by ``moe_numba.clear``."""
    plans = BoundedCache(maxsize)
    _LAUNCH_PLANS.append(plans)
    return plans


@on_clear
def _forget_launch_plans():
    for plans in _LAUNCH_PLANS:
        plans.clear()


@contextmanager
def use_settings(settings=None, /, **changes):
    """Run the ``with`` block under other kernel settings.

    Parameters
    ----------
    settings : Settings, optional
        The settings to use (default: those in force).
    **changes
        Fields of :class:`Settings` to change in them.

    Yields
    ------
    Settings
        The settings in force inside the block.

    Raises
    ------
    TypeError
        For a ``settings`` that is not a :class:`Settings`, or a change that names no
        field (and as :class:`Settings` raises for a bad value).
    ValueError
        For a change of a compiled-in field (``ct``, ``etile``, ``rmt``, ``gather_lanes``,
        ``lmax``) outside the CUDA simulator (and as :class:`Settings` raises).

    Notes
    -----
    The settings are the process's, not the thread's: for tests and tools, between calls.
    The library's caches (launch plans and the torch integration's recorded calls among
    them) are cleared on the way in and out (``moe_numba.clear``): a launch plan or a
    recorded call made under other settings would launch those.
    """
    global current
    if settings is None:
        settings = current
    elif type(settings) is not Settings:
        raise TypeError(f"settings must be a moe_numba.kernels.Settings; got {settings!r}")
    names = {field.name for field in fields(Settings)}
    unknown = sorted(set(changes) - names)
    if unknown:
        raise TypeError(f"use_settings: {unknown} are no fields of Settings")
    chosen = replace(settings, **changes)
    moved = [name for name in COMPILED if getattr(chosen, name) != getattr(DEFAULT, name)]
    if moved:
        from ..runtime._sim import SIM

        if not SIM:
            raise ValueError(
                f"use_settings: {moved} are compiled into the kernels, which a GPU keeps "
                "from their first compile; they change only in the CUDA simulator "
                "(NUMBA_ENABLE_CUDASIM=1)"
            )
    previous = current
    _install(chosen)
    try:
        yield chosen
    finally:
        _install(previous)


def _install(settings):
    global current
    compiled = any(getattr(settings, n) != getattr(current, n) for n in COMPILED)
    current = settings
    if compiled:
        for setter in _COMPILED_IN:
            setter(settings)
    clear()
