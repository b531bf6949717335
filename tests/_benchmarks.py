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
