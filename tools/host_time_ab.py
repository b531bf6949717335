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

import os
import subprocess
import sys

SHAPES = ((256, 16), (256, 1), (16384, 128))  # (T, padding alignment)
EVERY_OP = (256, 16)  # the shape that times every op (the others: permute, unpermute)


def one(tag):
    """Time this process's moe_numba and print the lines of ``tag``."""
    import host_time as ht

    import moe_numba

    print(f"{tag}: {os.path.dirname(moe_numba.__file__)}", flush=True)
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
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--one"]:
        return one(argv[1])
    if not argv:
        sys.exit(__doc__)
    other, rounds = os.path.abspath(argv[0]), int(argv[1]) if len(argv) > 1 else 3
    here = os.path.abspath(__file__)
    for _ in range(rounds):
        for tag, path in (("this", None), ("other", other)):
            env = dict(os.environ)
            if path is not None:
                env["PYTHONPATH"] = os.pathsep.join(filter(None, (path, env.get("PYTHONPATH"))))
            subprocess.run([sys.executable, here, "--one", tag], env=env, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
