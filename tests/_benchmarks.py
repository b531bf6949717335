"""Running ``python -m benchmarks`` in a fresh interpreter, as the tests' own process has the
packages: the checkout's ``benchmarks`` folder, and moe_numba from wherever it is installed
(tox: the wheel)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_module(*argv):
    """``python -m benchmarks ARGV`` in a fresh interpreter, from the checkout's ``benchmarks``
    folder but with the installed moe_numba first (as the tests' own process has them)."""
    code = (
        "import runpy, sys; sys.path.append(sys.argv.pop(1)); sys.argv[0] = 'benchmarks'; "
        "runpy.run_module('benchmarks', run_name='__main__', alter_sys=True)"
    )
    return subprocess.run(
        [sys.executable, "-c", code, str(ROOT), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def header(card="NVIDIA H100 80GB HBM3", what="bench", date="2026-12-06T10:00:00+00:00"):
    """A record's header as :func:`benchmarks.environment.header` writes it, made up."""
    from benchmarks.environment import slug

    return dict(
        what=what,
        backend="cuda (torch arrays, numba.cuda kernels)",
        commit="0123456789abcdef0123456789abcdef01234567",
        dirty=False,
        date=date,
        command=f"python -m benchmarks {what}",
        device=dict(name=card, slug=slug(card), sm_clock_mhz=1980, memory_clock_mhz=2619),
        versions=dict(python="3.12.0", moe_numba="0.1.0"),
    )


def figure(value, spread=0.0):
    """A :class:`benchmarks.records.Figure` of median ``value``, ``spread`` either side."""
    from benchmarks.records import Figure

    return Figure(value - spread, value, value + spread, 15)
