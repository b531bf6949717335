"""Command line: ``python -m moe_numba demo ...`` (see ``--help``).

Every option is checked here before any work starts: a value out of range, a GPU that is not
there, a shape whose arrays cannot fit in the memory available are argparse errors that name
the option or the shape (exit status 2). The benchmarks of the repository (``python -m
benchmarks``, run from a checkout) build their command lines from the same checks.
"""

from __future__ import annotations

import argparse
import sys

# (minimum, maximum) of each numeric option; the upper bounds catch typos, not the library's
# limits (it has none below its int32 row map)
LIMITS = {
    "tokens": (1, 1 << 20),
    "hidden": (1, 1 << 16),
    "experts": (1, 1 << 12),
    "topk": (1, 1 << 12),  # and at most the number of experts
}
MEANINGS = {
    "tokens": "tokens T",
    "hidden": "hidden width H",
    "experts": "experts E",
    "topk": "experts per token K (distinct, so at most E)",
}


def bounded_int(low, high):
    """An argparse ``type`` that accepts integers from ``low`` to ``high``."""

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer from {low} to {high}; got {text!r}"
            ) from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be from {low} to {high}; got {value}")
        return value

    return parse


def add_number(parser, name, limits, meaning, default=None, default_text=None):
    """Add the integer option ``--name`` to ``parser``, within ``limits`` (low, high)."""
    low, high = limits
    shown = default if default_text is None else default_text
    parser.add_argument(
        f"--{name}",
        type=bounded_int(low, high),
        default=default,
        metavar="N",
        help=f"{meaning}, {low} to {high} (default {shown})",
    )


def _number(parser, name, default=None, default_text=None):
    add_number(parser, name, LIMITS[name], MEANINGS[name], default, default_text)


def backend_option():
    """A parent parser with ``--backend {auto,cpu,cuda}``."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--backend",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="cpu: NumPy arrays; cuda: CUDA arrays of torch, else CuPy, else numba; "
        "auto: cuda when a GPU is usable, else cpu (default)",
    )
    return parent


def _parser():
    """The parser, and the subparser of each command (for their errors)."""
    parser = argparse.ArgumentParser(
        prog="python -m moe_numba",
        description="MoE token permute/unpermute (PaddlePaddle's moe_permute/moe_unpermute "
        "contract) on NumPy arrays (Cython/OpenMP) and CUDA arrays (numba.cuda).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser(
        "demo",
        parents=[backend_option()],
        help="run the docs example and a realistic workload, check them against the oracle",
        description="Runs the worked example of the docs and a random MoE workload through "
        "moe_permute and moe_unpermute, checks every output bit for bit against the NumPy "
        "oracle and prints what was done and how long it took (exit status 1 on a mismatch).",
    )
    for name, default in (("tokens", 4096), ("hidden", 2048), ("experts", 32)):
        _number(demo, name, default)
    _number(demo, "topk", default_text="8, or E if fewer")
    return parser, {"demo": demo}


def choose_target(parser, backend, choose=None):
    """The target of ``--backend`` (``choose(backend)``, :func:`moe_numba._target.choose` by
    default), or ``parser.error`` where it names a GPU that is not there."""
    from ._target import NoGPUError

    if choose is None:
        from ._target import choose
    try:
        return choose(backend)
    except NoGPUError as e:
        parser.error(f"argument --backend: {backend}: {e}")


def check_topk(parser, topk, experts, experts_given=True, default=8):
    """``--topk`` as given, checked against the number of experts, or its default (at most
    the number of experts)."""
    if topk is None:
        return min(default, experts)
    if topk > experts:
        source = f"--experts {experts}" if experts_given else f"the default --experts {experts}"
        parser.error(
            f"argument --topk: must be at most the number of experts ({source}): each token "
            f"goes to distinct experts; got {topk}"
        )
    return topk


def check_fits(parser, device, runs):
    """``parser.error`` naming the bytes needed and available if one of ``runs`` (pairs of
    a :class:`~moe_numba._footprint.Need` and a label) cannot fit in memory."""
    from ._footprint import refusal

    for need, label in runs:
        message = refusal(need, device, label)
        if message:
            parser.error(message)


def demo_settings(parser, args):
    """The demo's target and shape, every option checked (``parser.error`` otherwise)."""
    from ._footprint import demo_need

    topk = check_topk(parser, args.topk, args.experts)
    target = choose_target(parser, args.backend)
    need = demo_need(args.tokens, args.hidden, args.experts, topk, target.device)
    label = f"the demo's workload T={args.tokens} H={args.hidden} E={args.experts} K={topk}"
    check_fits(parser, target.device, [(need, label)])
    return dict(
        target=target, tokens=args.tokens, hidden=args.hidden, experts=args.experts, topk=topk
    )


def main(argv=None):
    """Entry point of ``python -m moe_numba`` and of the ``moe-numba`` script."""
    parser, commands = _parser()
    args = parser.parse_args(argv)
    from ._demo import run_demo

    return run_demo(**demo_settings(commands["demo"], args))


if __name__ == "__main__":
    sys.exit(main())
