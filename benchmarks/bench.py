"""``python -m benchmarks bench``: what each call costs, against a copy of the same bytes.

Every option is checked before any work starts: a value out of range, a file that cannot be
read or written, a GPU that is not there, a shape whose arrays cannot fit in the memory
available are argparse errors that name the option or the shape (exit status 2).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys

from moe_numba.__main__ import backend_option, check_fits, check_topk, choose_target
from moe_numba._errors import install_extra

from . import cases, environment, footprint, peers, records
from .compare import check_same_card
from .options import check_writable, number, record_option
from .run import Settings, run
from .target import choose

SHAPE_OPTIONS = ("tokens", "hidden", "experts", "topk", "alignment", "dtype")


def parser():
    """The bench's argument parser."""
    bench = argparse.ArgumentParser(
        prog="python -m benchmarks bench",
        parents=[backend_option()],
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
        shown = f"{cases.CUDA_DEFAULT[name]} on a GPU, {cases.CPU_DEFAULT[name]} on the CPU"
        number(bench, name, default_text=shown)
    number(bench, "topk", default_text=f"{cases.CUDA_DEFAULT['topk']}, or E if fewer")
    bench.add_argument(
        "--dtype", choices=sorted(cases.DTYPES), help="row dtype of the one shape (default bf16)"
    )
    number(bench, "repeat", default_text="15 on a GPU, 7 on the CPU; with --quick 5, 3")
    record_option(bench, "under benchmarks/results/CARD/ on a GPU, none on the CPU")
    bench.add_argument(
        "--compare",
        metavar="OLD.json",
        help="after the run, compare it with an earlier record of the same card, row by row",
    )
    bench.add_argument(
        "--plot",
        metavar="FILE.png",
        help="plot %% of the copy against T (with --sweep; needs matplotlib)",
    )
    peers.add_options(bench)
    return bench


def settings(parser, args, choose=choose, argv=()):
    """The bench's :class:`~benchmarks.run.Settings`, every option checked (``parser.error``
    otherwise); ``choose(backend)`` finds the target (:func:`benchmarks.target.choose`);
    ``argv``: the command line, for the record."""
    given = {name: getattr(args, name) for name in SHAPE_OPTIONS}
    if args.sweep:
        for name, value in given.items():
            if value is not None:
                parser.error(
                    f"argument --{name}: not allowed with --sweep (the sweep has its own shapes)"
                )
    previous = None
    if args.compare:
        try:
            previous = records.load(args.compare)
        except ValueError as e:
            parser.error(f"argument --compare: {e}")
    for option in ("json", "plot"):
        if getattr(args, option):
            check_writable(parser, f"--{option}", getattr(args, option))
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        parser.error(f"argument --plot: needs matplotlib: {install_extra('bench')}")
    if args.peers or args.peers_cache or args.gradients:
        target = peers.peer_target(parser, args)
    else:
        target = choose_target(parser, args.backend, choose)
    if args.sweep:
        shapes = cases.sweep(target.device, args.quick)
    elif args.peers and all(value is None for value in given.values()):
        shapes = list(peers.CASES)
    else:
        default = cases.defaults(target.device)
        experts = given["experts"] or default["experts"]
        given["topk"] = check_topk(
            parser, given["topk"], experts, given["experts"] is not None, default["topk"]
        )
        shapes = [cases.one_case(target.device, **given)]
    runs = [(footprint.bench_need(case, target.device), case.label()) for case in shapes]
    check_fits(parser, target.device, runs)
    if previous is not None:
        card = environment.device(target.device)["name"]
        check_same_card(parser, "--compare", previous, card, "this run")
    repeat = args.repeat or cases.REPEATS[target.device, args.quick]
    peer_bench = peers.prepare(parser, args) if args.peers else None
    if peer_bench is not None and args.gradients:
        from .peer_gradients import bench_gradients

        peer_bench.gradients = bench_gradients
    what = "peers" if args.peers else "sweep" if args.sweep else "bench"
    return Settings(
        target, shapes, repeat, args.json, previous, args.plot, peer_bench, what, ["bench", *argv]
    )


def main(argv=None):
    """Check the options, run the bench; returns the exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    bench = parser()
    return run(settings(bench, bench.parse_args(argv), argv=argv))
