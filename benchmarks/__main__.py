"""``python -m benchmarks COMMAND ...``: the benchmarks' command line (run from a checkout).

Each command hands every option after its name to its own parser (``python -m benchmarks
COMMAND --help``), which checks them all before any work starts: a bad one is an argparse
error that names it (exit status 2).
"""

from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module, what it does)
COMMANDS = {
    "bench": ("bench", "time permute/unpermute against a copy of the same bytes (or beside peers)"),
    "gradients": ("gradients", "time the gradient ops against a copy of the same bytes (GPU)"),
    "memory": ("memory", "peak GPU memory of a training step of the layer without its GEMMs"),
    "layer": ("layer", "time the transformers experts layer of real models (GPU)"),
    "distributed": ("distributed", "time the expert-parallel layer's stages (gloo processes)"),
    "compare": ("compare", "compare two records of one card; exit 1 if a figure is 5%% worse"),
    "tables": ("tables", "check (or write) the README's and the docs' tables from records"),
}


def parser():
    """The top-level parser: the list of commands."""
    top = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="The benchmarks of moe-numba (run from a checkout; not installed with the "
        "package). Each command has its own --help.",
    )
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, text) in COMMANDS.items():
        commands.add_parser(name, add_help=False, help=text)
    return top


def main(argv=None):
    """Run the command named first in ``argv``; returns its exit status."""
    argv = sys.argv[1:] if argv is None else list(argv)
    top = parser()
    if argv[:1] and argv[0] in COMMANDS:
        try:
            module = importlib.import_module(f"benchmarks.{COMMANDS[argv[0]][0]}")
        except ModuleNotFoundError as error:  # an optional dependency of that command
            top.error(f"argument COMMAND: {argv[0]} needs {error.name}, which is not installed")
        return module.main(argv[1:])
    top.parse_args(argv)  # --help, or an error naming the unknown command
    return 2


if __name__ == "__main__":
    sys.exit(main())
