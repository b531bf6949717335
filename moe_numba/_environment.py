"""The environment variables moe_numba and its build read: on/off switches, each parsed once
with an error that names the variable.

Pure standard library: ``setup.py`` loads this file by its path for its build switches
(``MOE_USE_OPENMP``, ``MOE_CYTHON_DEBUG``, ``MOE_CYTHON_ANNOTATE``), before the package can be
imported. The CPU backend's own variable, ``MOE_CPU_CACHE_BYTES``, is parsed by ``moe_cpu``
(which imports nothing of moe_numba).
"""

from __future__ import annotations

import os

_ON = ("1", "true", "yes", "on")
_OFF = ("0", "false", "no", "off")


def switch(name, default):
    """The on/off switch ``name`` of the environment.

    Parameters
    ----------
    name : str
        The variable.
    default : bool
        Its value when unset or empty (a shell's ``NAME=``).

    Returns
    -------
    bool
        True for 1/true/yes/on, False for 0/false/no/off (any case, blanks around ignored).

    Raises
    ------
    ValueError
        For any other value, naming the variable, what it accepts and what it got.
    """
    text = os.environ.get(name)
    if text is None or not text.strip():
        return default
    value = text.strip().lower()
    if value in _ON or value in _OFF:
        return value in _ON
    raise ValueError(
        f"{name} must be one of {'/'.join(_ON)} (on) or {'/'.join(_OFF)} (off), or empty for "
        f"the default ({'on' if default else 'off'}); got {text!r}"
    )
