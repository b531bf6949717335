"""The options the benchmarks' command lines share, and their checks: each bad value is an
argparse error that names its option (exit status 2) before any work starts.

The shape options and their limits are the package's own (``python -m moe_numba demo``
checks them the same way); the benchmarks add theirs.
"""

from __future__ import annotations

import argparse
import math
import os

from moe_numba.__main__ import LIMITS as SHAPE_LIMITS
from moe_numba.__main__ import MEANINGS as SHAPE_MEANINGS
from moe_numba.__main__ import add_number
from moe_numba._errors import install_extra

# (minimum, maximum) of each integer option; the upper bounds catch typos
LIMITS = {
    **SHAPE_LIMITS,
    "alignment": (1, 1 << 12),
    "repeat": (1, 1000),
    "iters": (1, 1000),
    "warmup": (0, 1000),
    "steps": (1, 1000),
    "ranks": (1, 64),
}
MEANINGS = {
    **SHAPE_MEANINGS,
    "alignment": "padding alignment A (rows)",
    "repeat": "timed repetitions per measurement",
    "iters": "timed runs per case",
    "warmup": "untimed runs before them",
    "steps": "timed training steps",
    "ranks": "processes",
}


def number(parser, name, default=None, default_text=None, meaning=None):
    """Add the integer option ``--name`` to ``parser``, within ``LIMITS[name]``."""
    add_number(parser, name, LIMITS[name], meaning or MEANINGS[name], default, default_text)


def float_in(accept, expected):
    """An argparse ``type`` for a float that ``accept(value)`` takes (NaN never passes a
    comparison), else an error saying ``expected``."""

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}")
        return value

    return parse


def record_option(parser, default="under benchmarks/results/CARD/"):
    """Add ``--json FILE``: where the run writes its record (``default`` says where it goes
    without it)."""
    parser.add_argument(
        "--json", metavar="FILE", help=f"write the run's record there (default: {default})"
    )


def check_writable(parser, option, path):
    """``parser.error`` unless ``path`` can be a file that ``option`` writes."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        parser.error(f"argument {option}: {path} is a folder; give a file name")
    if not os.path.isdir(folder):
        parser.error(f"argument {option}: cannot write {path}: folder {folder} does not exist")


def torch_cuda_problem():
    """Why torch cannot run CUDA work here, or "" when it can."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return f"torch is not installed: {install_extra('gpu,torch')}"
    import torch

    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA GPU"
    return ""
