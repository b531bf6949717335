"""Helpers of the benchmarks' tests: the shape refusals every benchmark shares, a check of an
argparse refusal, made-up record headers and figures, and ``python -m benchmarks`` in a
fresh interpreter with the packages the tests' own process has (the checkout's
``benchmarks`` folder, moe_numba from wherever it is installed: tox's wheel)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# refusals of the shape options every benchmark with a shape shares: (argv, message regex)
BOUNDS = [
    (["--tokens", "0"], r"argument --tokens: must be from 1 to 1048576; got 0$"),
    (["--hidden", "x"], r"argument --hidden: expected an integer from 1 to 65536; got 'x'$"),
    (["--experts", "0"], r"argument --experts: must be from 1 to 4096; got 0$"),
    (
        ["--topk", "9", "--experts", "4"],
        r"argument --topk: must be at most the number of experts \(--experts 4\): each token "
        r"goes to distinct experts; got 9$",
    ),
]


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


def assert_refused(call, prog, message, capsys):
    """``call()`` must end in an argparse error of ``prog``: exit status 2, its usage first
    and ``message`` (a regex) in its last line."""
    import re

    import pytest

    with pytest.raises(SystemExit, match="^2$"):
        call()
    err = capsys.readouterr().err
    assert err.startswith(f"usage: {prog}"), err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"{prog}: error: "), last
    assert re.search(message, last), last
