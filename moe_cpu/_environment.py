"""The environment variable moe_cpu reads, ``MOE_CPU_CACHE_BYTES``, parsed once (when
:mod:`moe_cpu` is imported, which the first CPU call of moe_numba does).

A size is written as people write sizes: a plain integer (``4294967296``), a number with a
binary unit (``512M``, ``4G``, ``4GiB``, ``1.5g``; K, M, G, T are powers of 1024) or a float
that is a whole number of bytes (``1e9``). An empty value counts as unset (the default), as
a shell's ``MOE_CPU_CACHE_BYTES=`` reads. Anything else is a ``ValueError`` that names the
variable, what it accepts and what it got.
"""

from __future__ import annotations

import math
import os
import re

CACHE_BYTES = "MOE_CPU_CACHE_BYTES"
_MOST = 2**63 - 1  # (a Py_ssize_t)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"(?P<number>[0-9.]+(?:e[+]?[0-9]+)?)\s*(?P<unit>[kmgt]?)(?:i?b)?", re.I)
ACCEPTS = (
    "a byte count from 0 to 2**63 - 1: an integer (4294967296), a number with a unit K, M, G or T "
    "(powers of 1024: 512M, 4G, 4GiB) or a whole number in e-notation (1e9); empty for "
    "the default"
)


def parse_size(name, text, default):
    """The byte count of the environment value ``text`` of variable ``name``.

    Parameters
    ----------
    name : str
        The variable, for the error message.
    text : str or None
        Its value; None or blank: unset.
    default : int
        The count when unset.

    Returns
    -------
    int
        The byte count.

    Raises
    ------
    ValueError
        If ``text`` is no size (see the module's docstring), naming ``name``.
    """
    if text is None or not text.strip():
        return default
    value_text = text.strip()
    match = _SIZE.fullmatch(value_text)
    value = None
    if value_text.isdigit():  # (exactly, past a float's 53 bits)
        value = int(value_text)
    elif match:
        try:
            number = float(match["number"]) * _UNITS[match["unit"].lower()]
        except ValueError:  # ("1.2.3")
            number = math.nan
        if math.isfinite(number) and (match["unit"] or number == int(number)):
            value = int(number)
    if value is None or value > _MOST:
        raise ValueError(f"{name} must be {ACCEPTS}; got {text!r}")
    return value


def cache_bytes(default):
    """``MOE_CPU_CACHE_BYTES`` as a byte count (``default`` when unset or empty)."""
    return parse_size(CACHE_BYTES, os.environ.get(CACHE_BYTES), default)
