"""Command line: ``python -m moe_numba {demo,bench} ...`` (see ``--help``)."""

from __future__ import annotations

import argparse
import sys


def _parser():
    parser = argparse.ArgumentParser(
        prog="python -m moe_numba",
        description="MoE token permute/unpermute (PaddlePaddle's moe_permute/moe_unpermute "
        "contract) on NumPy arrays (Cython/OpenMP) and CUDA arrays (numba.cuda).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="run the docs example and a realistic workload, check them against the oracle",
        description="Runs the worked example of the docs and a random MoE workload through "
        "moe_permute and moe_unpermute, checks every output bit for bit against the NumPy "
        "oracle and prints what was done and how long it took.",
    )
    demo.add_argument(
        "--backend",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="cpu: NumPy arrays; cuda: torch/CuPy/numba CUDA arrays; auto: cuda "
        "when a GPU is usable, else cpu (default)",
    )
    demo.add_argument("--tokens", type=int, default=4096, help="tokens T (default 4096)")
    demo.add_argument("--hidden", type=int, default=2048, help="hidden width H (default 2048)")
    demo.add_argument("--experts", type=int, default=32, help="experts E (default 32)")
    demo.add_argument("--topk", type=int, default=8, help="experts per token K (default 8)")

    from ._bench import add_bench_arguments

    bench = commands.add_parser(
        "bench",
        help="measure permute/unpermute bandwidth against a copy of the same bytes",
        description="Times moe_permute and the weighted moe_unpermute (medians after warm-up) "
        "and reports effective bandwidth next to a copy roofline measured in the same run.",
    )
    add_bench_arguments(bench)
    return parser


def main(argv=None):
    """Entry point of ``python -m moe_numba`` and of the ``moe-numba`` script."""
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from ._demo import run_demo

        return run_demo(args)
    from ._bench import run_bench

    return run_bench(args)


if __name__ == "__main__":
    sys.exit(main())
