"""Host time per call of two trees of moe-numba, interleaved on one machine (docs/lab-notes.rst,
"The replays, compiled"): the hosts that lend a GPU are noisy, so a figure of one tree is
compared with the other's taken seconds apart, round after round.

Run on a machine with a GPU and torch, from the root of this tree (installed), with the other
tree's ``moe_numba`` package built in place (its Cython extensions compiled next to their
sources, e.g. ``cythonize -i -3 moe_numba/runtime/_driver_c.pyx`` there)::

    python tools/host_time_ab.py OTHER_TREE [ROUNDS]

Each round runs this tree, then the other one (``OTHER_TREE`` first on ``PYTHONPATH``), each
in a process of its own, and prints per op and shape the host µs per call with the GPU busy
and right after a sync, with :mod:`host_time`'s timing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from _cli import parser, positive_int

SHAPES = ((256, 16), (256, 1), (16384, 128))  # (T, padding alignment)
EVERY_OP = (256, 16)  # the shape that times every op (the others: permute, unpermute)


def one(tag):
    """Time this process's moe_numba and print the lines of ``tag``."""
    import host_time as ht

    import moe_numba

    print(f"{tag}: {os.path.dirname(moe_numba.__file__)}", flush=True)
    # a process's first timings run slow (its clocks and caches still warming), whichever op
    # comes first: one untimed pass over the first shape's ops before any figure is kept
    for fn in ht.operations(*SHAPES[0], *ht.case(*SHAPES[0])).values():
        ht.timed(fn, n=50, rounds=2)
    for T, A in SHAPES:
        inputs = ht.case(T, A)
        for name, fn in ht.operations(T, A, *inputs).items():
            if (T, A) != EVERY_OP and name not in ("permute", "permute, validate", "unpermute"):
                continue
            busy, after_sync = ht.timed(fn), ht.timed(fn, busy=False, rounds=2)
            print(
                f"{tag} T={T:5d} A={A:3d} {name:19s} busy {busy:6.1f} after a sync "
                f"{after_sync:6.1f}",
                flush=True,
            )


def main(argv=None):
    options = parser(__doc__)
    options.add_argument("other", nargs="?", help="the other tree: its root directory")
    options.add_argument("rounds", nargs="?", type=positive_int, default=3, help="default: 3")
    options.add_argument("--one", choices=("this", "other"), help=argparse.SUPPRESS)
    args = options.parse_args(argv)
    if args.one is not None:  # (a round's process, started below)
        return one(args.one)
    if args.other is None:
        options.error("the following arguments are required: other")
    other = os.path.abspath(args.other)
    if not os.path.isdir(os.path.join(other, "moe_numba")):
        options.error(f"other: {args.other!r} is not a tree with a moe_numba package")
    here = os.path.abspath(__file__)
    for _ in range(args.rounds):
        for tag, path in (("this", None), ("other", other)):
            env = dict(os.environ)
            if path is not None:
                env["PYTHONPATH"] = os.pathsep.join(filter(None, (path, env.get("PYTHONPATH"))))
            subprocess.run([sys.executable, here, "--one", tag], env=env, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
