"""Command line: ``python -m moe_numba {demo,bench,layer} ...`` (see ``--help``).

Every option is checked here before any work starts: a value out of range, a file that
cannot be read or written, a GPU that is not there, a shape whose arrays cannot fit in the
memory available are argparse errors that name the option or the shape (exit status 2).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

# (minimum, maximum) of each numeric option; the upper bounds catch typos, not the library's
# limits (it has none below its int32 row map)
LIMITS = {
    "tokens": (1, 1 << 20),
    "hidden": (1, 1 << 16),
    "experts": (1, 1 << 12),
    "topk": (1, 1 << 12),  # and at most the number of experts
    "alignment": (1, 1 << 12),
    "repeat": (1, 1000),
}
_MEANINGS = {
    "tokens": "tokens T",
    "hidden": "hidden width H",
    "experts": "experts E",
    "topk": "experts per token K (distinct, so at most E)",
    "alignment": "padding alignment A (rows)",
    "repeat": "timed repetitions per measurement",
}


def bounded_int(name):
    """An argparse ``type`` that accepts integers in ``LIMITS[name]``."""
    low, high = LIMITS[name]

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


def _number(parser, name, default=None, default_text=None):
    low, high = LIMITS[name]
    shown = default if default_text is None else default_text
    parser.add_argument(
        f"--{name}",
        type=bounded_int(name),
        default=default,
        metavar="N",
        help=f"{_MEANINGS[name]}, {low} to {high} (default {shown})",
    )


def _parser():
    """The parser, and the subparser of each command (for their errors)."""
    from .bench._cases import CPU_DEFAULT, CUDA_DEFAULT, DTYPES

    parser = argparse.ArgumentParser(
        prog="python -m moe_numba",
        description="MoE token permute/unpermute (PaddlePaddle's moe_permute/moe_unpermute "
        "contract) on NumPy arrays (Cython/OpenMP) and CUDA arrays (numba.cuda).",
    )
    backend = argparse.ArgumentParser(add_help=False)
    backend.add_argument(
        "--backend",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="cpu: NumPy arrays; cuda: CUDA arrays of torch, else CuPy, else numba; "
        "auto: cuda when a GPU is usable, else cpu (default)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        parents=[backend],
        help="run the docs example and a realistic workload, check them against the oracle",
        description="Runs the worked example of the docs and a random MoE workload through "
        "moe_permute and moe_unpermute, checks every output bit for bit against the NumPy "
        "oracle and prints what was done and how long it took (exit status 1 on a mismatch).",
    )
    for name, default in (("tokens", 4096), ("hidden", 2048), ("experts", 32)):
        _number(demo, name, default)
    _number(demo, "topk", default_text="8, or E if fewer")

    bench = commands.add_parser(
        "bench",
        parents=[backend],
        help="time permute/unpermute against a copy of the same bytes",
        description="Times moe_permute and the weighted moe_unpermute and a copy of the same "
        "bytes, each a median after warm-up: on a GPU the GPU time per call with the host "
        "running ahead, one call's latency right after a sync, and the host time per call; "
        "on the CPU the wall time per call (and the speed-up over vectorised NumPy).",
    )
    bench.add_argument(
        "--sweep",
        action="store_true",
        help="time the standard sweep over T, E, K and dtypes instead of one shape",
    )
    bench.add_argument("--quick", action="store_true", help="fewer repetitions and a shorter sweep")
    for name in ("tokens", "hidden", "experts", "alignment"):
        shown = f"{CUDA_DEFAULT[name]} on a GPU, {CPU_DEFAULT[name]} on the CPU"
        _number(bench, name, default_text=shown)
    _number(bench, "topk", default_text=f"{CUDA_DEFAULT['topk']}, or E if fewer")
    bench.add_argument(
        "--dtype", choices=sorted(DTYPES), help="row dtype of the one shape (default bf16)"
    )
    _number(bench, "repeat", default_text="15 on a GPU, 7 on the CPU; with --quick 5, 3")
    bench.add_argument(
        "--json", metavar="FILE", help="save the results as JSON (rewritten after every shape)"
    )
    bench.add_argument(
        "--compare",
        metavar="OLD.json",
        help="print each result's speed relative to an earlier --json file",
    )
    bench.add_argument(
        "--plot",
        metavar="FILE.png",
        help="plot %% of the copy against T (with --sweep; needs matplotlib)",
    )
    from .bench._peers import add_options

    add_options(bench)
    commands.add_parser(  # (listed here; main hands its options to the layer bench)
        "layer",
        add_help=False,
        help="time the transformers experts layer of real models against transformers' own "
        "backends (CUDA GPU; python -m moe_numba layer --help)",
    )
    return parser, {"demo": demo, "bench": bench}


def _target(parser, backend):
    from .bench._target import NoGPUError, choose

    try:
        return choose(backend)
    except NoGPUError as e:
        parser.error(f"argument --backend: {backend}: {e}")


def _topk(parser, topk, experts, experts_given=True, default=8):
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


def _check_writable(parser, option, path):
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        parser.error(f"argument {option}: {path} is a folder; give a file name")
    if not os.path.isdir(folder):
        parser.error(f"argument {option}: cannot write {path}: folder {folder} does not exist")


def _check_fits(parser, device, runs):
    """``parser.error`` naming the bytes needed and available if one of ``runs`` (pairs of
    a :class:`~moe_numba.bench._footprint.Need` and a label) cannot fit in memory."""
    from .bench._footprint import refusal

    for need, label in runs:
        message = refusal(need, device, label)
        if message:
            parser.error(message)


def demo_settings(parser, args):
    """The demo's target and shape, every option checked (``parser.error`` otherwise)."""
    from .bench._footprint import demo_need

    topk = _topk(parser, args.topk, args.experts)
    target = _target(parser, args.backend)
    need = demo_need(args.tokens, args.hidden, args.experts, topk, target.device)
    label = f"the demo's workload T={args.tokens} H={args.hidden} E={args.experts} K={topk}"
    _check_fits(parser, target.device, [(need, label)])
    return dict(
        target=target, tokens=args.tokens, hidden=args.hidden, experts=args.experts, topk=topk
    )


_SHAPE_OPTIONS = ("tokens", "hidden", "experts", "topk", "alignment", "dtype")


def bench_settings(parser, args):
    """The bench's :class:`~moe_numba.bench.Settings`, every option checked
    (``parser.error`` otherwise)."""
    from .bench import Settings, _cases, _footprint, _results

    given = {name: getattr(args, name) for name in _SHAPE_OPTIONS}
    if args.sweep:
        for name, value in given.items():
            if value is not None:
                parser.error(
                    f"argument --{name}: not allowed with --sweep (the sweep has its own shapes)"
                )
    previous = None
    if args.compare:
        try:
            previous = (args.compare, _results.load(args.compare)[1])
        except ValueError as e:
            parser.error(f"argument --compare: {e}")
    for option in ("json", "plot"):
        if getattr(args, option):
            _check_writable(parser, f"--{option}", getattr(args, option))
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error("argument --plot: needs matplotlib: pip install 'moe-numba[bench]'")
    if args.peers or args.peers_cache or args.gradients:
        from .bench import _peers

        target = _peers.peer_target(parser, args)
    else:
        target = _target(parser, args.backend)
    if args.sweep:
        cases = _cases.sweep(target.device, args.quick)
    elif args.peers and all(value is None for value in given.values()):
        cases = list(_peers.CASES)
    else:
        default = _cases.defaults(target.device)
        experts = given["experts"] or default["experts"]
        given["topk"] = _topk(
            parser, given["topk"], experts, given["experts"] is not None, default["topk"]
        )
        cases = [_cases.one_case(target.device, **given)]
    runs = [(_footprint.bench_need(case, target.device), case.label()) for case in cases]
    _check_fits(parser, target.device, runs)
    repeat = args.repeat or _cases.REPEATS[target.device, args.quick]
    peers = _peers.prepare(parser, args) if args.peers else None
    if peers is not None and args.gradients:
        from .bench._peer_gradients import bench_gradients

        peers.gradients = bench_gradients
    return Settings(target, cases, repeat, args.json, previous, args.plot, peers)


def main(argv=None):
    """Entry point of ``python -m moe_numba`` and of the ``moe-numba`` script."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["layer"]:  # (every option after it, --help included, is the bench's own)
        from .bench._layer import main as run_layer

        return run_layer(argv[1:])
    parser, commands = _parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        from ._demo import run_demo

        return run_demo(**demo_settings(commands["demo"], args))
    from .bench import run

    return run(bench_settings(commands["bench"], args))


if __name__ == "__main__":
    sys.exit(main())
